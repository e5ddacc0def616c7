"""The Kafka sink: each task's records in one Kafka transaction, committed by the driver.

``KafkaWriter`` (executors) takes a transactional producer from its worker's pool per task
attempt, produces the task's rows and leaves the transaction open; ``KafkaCommitter``
(driver, ``twophase recover``) ends it with EndTxn from another client, reads back what it
cannot end, and sweeps lingering transactions. The transaction timeout defaults to one minute:
it bounds how long a crashed query stalls ``read_committed`` readers, and a decided
transaction the broker aborts after it is written again by the batch's replay, checked against
the fingerprint in its handle. See docs/kafka.md. Plain Python: the
Spark data source ``twophase.kafka`` is ``twophase.spark.kafka.KafkaSink``.
"""

from twophase.clients.kafka import KafkaUnreachableError, brokerTransactionMaxTimeoutMs
from twophase.sinks.kafka.columns import ColumnLayout, checkColumns
from twophase.sinks.kafka.committer import KafkaCommitter
from twophase.sinks.kafka.errors import KafkaCommitError, KafkaWriteError, RecordTooLargeError
from twophase.sinks.kafka.handles import KIND, checkHandle, describeHandle
from twophase.sinks.kafka.pool import pooledTransactionalIds
from twophase.sinks.kafka.probe import ProbeVerdict, probeRecord
from twophase.sinks.kafka.settings import (
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    RESOLVED_TIMEOUT_OPTION,
    SAFE_OPTIONS,
    KafkaSettings,
    ownedIds,
    transactionalIdFor,
)
from twophase.sinks.kafka.writer import KafkaWriter

__all__ = [
    "DEFAULT_TRANSACTION_TIMEOUT_MS",
    "KIND",
    "DEFAULT_TRANSACTION_TIMEOUT_MS",
    "RESOLVED_TIMEOUT_OPTION",
    "SAFE_OPTIONS",
    "ColumnLayout",
    "KafkaCommitError",
    "KafkaCommitter",
    "KafkaSettings",
    "KafkaUnreachableError",
    "KafkaWriteError",
    "KafkaWriter",
    "ProbeVerdict",
    "RecordTooLargeError",
    "brokerTransactionMaxTimeoutMs",
    "checkColumns",
    "checkHandle",
    "describeHandle",
    "ownedIds",
    "pooledTransactionalIds",
    "probeRecord",
    "transactionalIdFor",
]
