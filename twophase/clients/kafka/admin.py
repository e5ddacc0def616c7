"""Asking the cluster about itself with librdkafka's admin client: the connection settings of
any client, the brokers' ``transaction.max.timeout.ms``, a topic's ``max.message.bytes``, and
creating a topic a sink needs (a dead-letter topic) when it is missing; and letting an admin
client go only once its requests are answered.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from twophase.clients.kafka.errors import KafkaUnreachableError, errorText, newClient
from twophase.clients.kafka.logs import ClientLog
from twophase.protocol.errors import SinkFailure
from twophase.redaction import getLogger, redact
from twophase.resources import Resources
from twophase.settings import TwoPhaseConfigError

log = getLogger(__name__)

DEFAULT_TRANSACTION_MAX_TIMEOUT_MS = 900_000
"""Kafka's default ``transaction.max.timeout.ms``; used when the brokers' cannot be read."""

_PRODUCER_ONLY = (
    "partitioner",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "queue.buffering",
    "linger.ms",
    "batch.",
    "compression",
    "acks",
    "request.required.acks",
    "retries",
    "message.send.max.retries",
    "max.in.flight",
    "enable.gapless.guarantee",
    "sticky.partitioning",
    "transaction",
)
_CONSUMER_ONLY = ("isolation.level", "group.id", "enable.partition.eof", "fetch.", "session.")

_TIMEOUT_CACHE_SECONDS = 300.0


def connectionConfig(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a producer or consumer that matter to any client: connection, auth.

    For admin clients, and for a consumer built from a producer's settings.
    """
    return {k: v for k, v in config.items() if not k.startswith(_PRODUCER_ONLY + _CONSUMER_ONLY)}


def adminClient(config: Mapping[str, Any]) -> Any:
    """A confluent-kafka ``AdminClient`` for the cluster and credentials of ``config``.

    Properties librdkafka refuses raise ``TwoPhaseConfigError`` naming the option.
    """
    from confluent_kafka.admin import AdminClient

    settings = connectionConfig(config)
    settings.setdefault("logger", ClientLog("admin client"))
    return newClient(AdminClient, settings, "admin client")


_AWAITING = "kafka.adminsAwaitingAnswers"
_awaitingLock = threading.Lock()


def letGo(
    admin: Any, futures: Iterable[concurrent.futures.Future[Any]], waitSeconds: float
) -> None:
    """Before ``admin`` is dropped: wait up to ``waitSeconds`` for the ``futures`` of its requests.

    An unanswered request's answer runs Python on librdkafka's background thread, and a garbage
    collection there that takes the client (an exception's traceback holds it in a cycle)
    destroys the client from its own thread, which librdkafka answers by aborting the process.
    A request still unanswered after the wait keeps its client referenced by the process until
    a later call finds it answered.
    """
    pending = [f for f in futures if not f.done()]
    if pending:
        concurrent.futures.wait(pending, timeout=waitSeconds)
    awaiting: list[tuple[Any, list[concurrent.futures.Future[Any]]]] = Resources.ofProcess().get(
        _AWAITING, list
    )
    answered: list[tuple[Any, list[concurrent.futures.Future[Any]]]] = []
    with _awaitingLock:
        kept: list[tuple[Any, list[concurrent.futures.Future[Any]]]] = []
        for entry in awaiting:
            (answered if all(f.done() for f in entry[1]) else kept).append(entry)
        awaiting[:] = kept
        still = [f for f in pending if not f.done()]
        if still:
            awaiting.append((admin, still))
    answered.clear()  # the clients answered since go here, in the caller's thread, unlocked


def brokerTransactionMaxTimeoutMs(config: Mapping[str, str], timeoutSeconds: float = 30) -> int:
    """The brokers' ``transaction.max.timeout.ms`` (smallest over brokers), cached 5 minutes.

    Falls back to 900000 (Kafka's default) with a warning when DescribeConfigs is refused; an
    unreachable cluster raises ``KafkaUnreachableError``.
    """
    key = config["bootstrap.servers"]
    # the brokers' answers by cluster, with when they were read (dict steps are atomic)
    cache: dict[str, tuple[int, float]] = Resources.ofProcess().get("kafka.maxTimeouts", dict)
    cached = cache.get(key)
    if cached is not None and time.monotonic() - cached[1] < _TIMEOUT_CACHE_SECONDS:
        return cached[0]
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType

    admin = adminClient(config)
    try:
        metadata = admin.list_topics(timeout=timeoutSeconds)
    except KafkaException as exc:
        raise KafkaUnreachableError(
            f"kafka: cannot reach the cluster at {redact(key)} within {timeoutSeconds:.0f} s "
            f"({errorText(exc)}); check kafka.bootstrap.servers and the security options",
            reason=KafkaUnreachableError.classify(exc) or SinkFailure.UNREACHABLE,
        ) from None
    values: list[int] = []
    futures: list[concurrent.futures.Future[Any]] = []
    try:
        resources = [ConfigResource(ResourceType.BROKER, str(b)) for b in metadata.brokers]
        futures = list(admin.describe_configs(resources, request_timeout=timeoutSeconds).values())
        for future in futures:
            entries = future.result(timeout=timeoutSeconds)
            entry = entries.get("transaction.max.timeout.ms")
            if entry is not None and entry.value is not None:
                values.append(int(entry.value))
    except Exception as exc:
        log.warning(
            "kafka: cannot read transaction.max.timeout.ms from the brokers at %s (%s); "
            "assuming Kafka's default %d ms. Set kafka.transaction.timeout.ms to choose.",
            key,
            errorText(exc),
            DEFAULT_TRANSACTION_MAX_TIMEOUT_MS,
        )
    finally:
        letGo(admin, futures, timeoutSeconds)
    value = min(values) if values else DEFAULT_TRANSACTION_MAX_TIMEOUT_MS
    cache[key] = (value, time.monotonic())
    return value


def topicMaxMessageBytes(
    config: Mapping[str, Any], topic: str, timeoutSeconds: float = 10
) -> tuple[int | None, str]:
    """The topic's ``max.message.bytes`` (its own, or the brokers' default), and why not when
    it cannot be read (DescribeConfigs refused, the cluster away): ``(None, reason)``."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    admin: Any = None
    futures: list[concurrent.futures.Future[Any]] = []
    try:
        admin = adminClient(config)
        resource = ConfigResource(ResourceType.TOPIC, topic)
        futures = list(admin.describe_configs([resource], request_timeout=timeoutSeconds).values())
        for future in futures:
            entry = future.result(timeout=timeoutSeconds).get("max.message.bytes")
            if entry is not None and entry.value is not None:
                return int(entry.value), ""
    except Exception as exc:
        return None, errorText(exc)
    finally:
        letGo(admin, futures, timeoutSeconds)
    return None, "the topic's configuration has no max.message.bytes"


def ensureTopic(config: Mapping[str, Any], topic: str, option: str, timeoutSeconds: float) -> None:
    """Create ``topic`` with the brokers' defaults (partitions, replication) when it is missing,
    once per process; ``option`` names the option that asked for it in an error."""
    key = (str(config.get("bootstrap.servers")), topic)
    seen: set[tuple[str, str]] = Resources.ofProcess().get("kafka.topicsSeen", set)
    if key in seen:
        return
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    admin = adminClient(config)
    try:
        metadata = admin.list_topics(topic=topic, timeout=timeoutSeconds)
    except KafkaException as exc:
        raise KafkaUnreachableError(
            f"kafka: cannot reach the cluster at {redact(key[0])} within {timeoutSeconds:.0f} s "
            f"to look up topic {topic} (option {option}): {errorText(exc)}",
            reason=KafkaUnreachableError.classify(exc) or SinkFailure.UNREACHABLE,
        ) from None
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        future = admin.create_topics(
            [NewTopic(topic, num_partitions=-1, replication_factor=-1)],
            request_timeout=timeoutSeconds,
        )[topic]
        try:
            future.result(timeout=timeoutSeconds)
            log.info("kafka: created topic %s (option %s)", topic, option)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if getattr(error, "code", lambda: None)() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise TwoPhaseConfigError(
                    f"kafka: topic {topic} (option {option}) does not exist and could not be "
                    f"created: {errorText(exc)}; create it, or grant the sink's principal "
                    "CREATE on it"
                ) from None
        finally:
            letGo(admin, [future], timeoutSeconds)
    seen.add(key)
