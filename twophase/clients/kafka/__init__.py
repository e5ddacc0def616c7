"""How to reach Kafka: the ``kafka.*`` options for librdkafka and kafka-python, admin calls,
and error text that shows no secret. Shared by the Kafka sink, the Kafka source and verify.
"""

from twophase.clients.kafka.admin import (
    DEFAULT_TRANSACTION_MAX_TIMEOUT_MS,
    adminClient,
    brokerTransactionMaxTimeoutMs,
    connectionConfig,
    ensureTopic,
    letGo,
    topicMaxMessageBytes,
)
from twophase.clients.kafka.errors import (
    KafkaSystemError,
    KafkaUnreachableError,
    errorText,
    librdkafkaError,
    newClient,
)
from twophase.clients.kafka.kafkapython import (
    SECRET_ARGUMENTS,
    kafkaPythonConfig,
    protectKafkaPythonLogs,
    shownArguments,
)
from twophase.clients.kafka.options import (
    OPTIONS_ENV,
    PREFIX,
    SAFE_CLIENT_OPTIONS,
    environmentOptions,
    isSafeProperty,
    kafkaOptions,
    librdkafkaConfig,
    shownConfig,
)

__all__ = [
    "DEFAULT_TRANSACTION_MAX_TIMEOUT_MS",
    "OPTIONS_ENV",
    "PREFIX",
    "SAFE_CLIENT_OPTIONS",
    "SECRET_ARGUMENTS",
    "KafkaSystemError",
    "KafkaUnreachableError",
    "adminClient",
    "brokerTransactionMaxTimeoutMs",
    "connectionConfig",
    "environmentOptions",
    "errorText",
    "isSafeProperty",
    "kafkaOptions",
    "kafkaPythonConfig",
    "letGo",
    "librdkafkaConfig",
    "librdkafkaError",
    "newClient",
    "protectKafkaPythonLogs",
    "shownArguments",
    "shownConfig",
    "ensureTopic",
    "topicMaxMessageBytes",
]
