"""The Kafka participant: each task's records in one Kafka transaction, committed by the driver.

Executor side (``twophase.sinks._kafka_producer``): a task attempt of partition p writes with a
transactional confluent-kafka producer whose ``transactional.id`` is ``<prefix>-<p>`` (a retry
or speculative copy, attempt a > 0, uses ``<prefix>-<p>-a<a>`` so that it can never fence the
attempt whose result Spark keeps), begins a transaction, produces the rows as it reads them,
flushes, checks every delivery report, and returns the producer id and epoch in its handle.
The transaction stays open: ``read_committed`` consumers see nothing of it.

Driver side (``twophase.sinks._kafka_txn``): ``commit`` ends that very transaction from another
client with ``EndTxn(transactional id, producer id, epoch, commit)``, as Flink's KafkaSink does
when it resumes a transaction. A repeated commit is a no-op success. When the broker says the
producer id and epoch can no longer end the transaction (it aborted the transaction after
``transaction.timeout.ms``, or something fenced it), the participant reads the transaction's
last record back with a ``read_committed`` consumer: visible means committed before (a no-op
success), invisible means lost, and ``TransactionLostError`` names the batch, the partition and
the transactional id. Recovery fences and aborts this sink's lingering transactions (broker
listing + ``init_transactions``), except those a decided batch still has to commit.

The transaction timeout defaults to the broker's ``transaction.max.timeout.ms`` (read once per
process with DescribeConfigs; 900000 when it cannot be read): the driver may be down that long
after deciding a batch before the broker aborts the batch's transactions. See docs/kafka.md.

Plain Python apart from :class:`KafkaSink`, the Spark data source ``twophase.kafka``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from twophase.protocol import (
    Handle,
    RecoveryScope,
    TransactionContext,
    TransactionLostError,
    TransientCommitError,
    TwoPhaseParticipant,
)
from twophase.settings import SinkSettings, TwoPhaseConfigError, floatOption, optionOf
from twophase.sink import ParticipantSink
from twophase.sinks import _kafka_producer as producing
from twophase.sinks._kafka_config import librdkafkaConfig, librdkafkaError
from twophase.sinks._kafka_producer import KafkaTransaction, KafkaWriteError
from twophase.sinks._kafka_txn import (
    INVALID_TXN_STATE,
    NONE,
    TransactionClient,
    errorName,
    sharedClient,
)

log = logging.getLogger(__name__)

KIND = "kafka"
"""The ``kind`` of every handle this participant returns."""

DEFAULT_TRANSACTION_TIMEOUT_MS = 900_000
"""Kafka's default ``transaction.max.timeout.ms``; used when the broker's cannot be read."""

RESOLVED_TIMEOUT_OPTION = "twophase.kafka.transactionTimeoutMs"
"""Where the driver leaves the resolved transaction timeout for the executors."""

WARN_FRACTION = 0.5
"""Warn when a transaction has been open longer than this share of its timeout at commit."""

_PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")

_FORBIDDEN_PRODUCER_OPTIONS = {
    "transactional.id": "the sink sets it per task; choose its prefix with option "
    "transactionalIdPrefix",
    "enable.idempotence": "transactions need the idempotent producer",
    "transaction.timeout.ms.default": "set kafka.transaction.timeout.ms",
}

_PRODUCER_DEFAULTS = {
    # Java's default partitioner (murmur2 of the key), as Spark's Kafka sink uses; librdkafka's
    # own default (CRC32) would send keyed records to other partitions.
    "partitioner": "murmur2_random",
    # Memory per task: at most 64 MiB of records waiting for the broker.
    "queue.buffering.max.kbytes": "65536",
}


class KafkaCommitError(RuntimeError):
    """A commit that is neither done nor provably lost, and that retrying will not settle."""


@dataclass(frozen=True)
class KafkaSettings:
    """The Kafka sink's options, parsed and checked once (``KafkaSettings.fromOptions``).

    - ``kafka.bootstrap.servers`` (required) and any other ``kafka.<name>``: librdkafka
      producer properties (Java names Spark users know are translated or refused clearly).
    - ``topic``: the topic of every row; overrides a ``topic`` column (as in Spark).
    - ``transactionalIdPrefix``: transactional ids are ``<prefix>-<partition>`` (default
      ``twophase-<sinkId>``). The principal needs WRITE and DESCRIBE on ids with this prefix.
    - ``kafka.transaction.timeout.ms``: default: the broker's ``transaction.max.timeout.ms``.
    - ``flushTimeoutSeconds``: how long a task waits for its records' acknowledgements
      (default: ``kafka.message.timeout.ms`` + 30 s).
    - ``initTimeoutSeconds``: bound of ``init_transactions`` (default 120 s).
    - ``requestTimeoutSeconds``: bound of each request to the cluster outside tasks: reaching
      it, reading its settings, ending and listing transactions (default 30 s).
    """

    producerConfig: dict[str, str] = field(hash=False)
    topic: str | None
    transactionalIdPrefix: str | None
    transactionTimeoutMs: int | None
    flushTimeoutSeconds: float
    initTimeoutSeconds: float
    requestTimeoutSeconds: float

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> KafkaSettings:
        config = dict(_PRODUCER_DEFAULTS)
        config.update(librdkafkaConfig(options, forbidden=_FORBIDDEN_PRODUCER_OPTIONS))
        timeout = _intConfig(config, "transaction.timeout.ms")
        config.pop("transaction.timeout.ms", None)
        if timeout is None:
            resolved = optionOf(options, RESOLVED_TIMEOUT_OPTION)
            timeout = int(resolved) if resolved else None
        messageTimeout = (
            _intConfig(config, "delivery.timeout.ms")
            or _intConfig(config, "message.timeout.ms")
            or producing.DEFAULT_MESSAGE_TIMEOUT_MS
        )
        prefix = optionOf(options, "transactionalIdPrefix")
        if prefix is not None and not _PREFIX_PATTERN.match(prefix):
            raise TwoPhaseConfigError(
                f"option transactionalIdPrefix={prefix!r} must be 1-200 letters, digits, '_', "
                "'.', '-', starting with a letter or digit"
            )
        topic = (optionOf(options, "topic") or "").strip() or None
        return cls(
            producerConfig=config,
            topic=topic,
            transactionalIdPrefix=prefix,
            transactionTimeoutMs=timeout,
            flushTimeoutSeconds=floatOption(
                options, "flushTimeoutSeconds", messageTimeout / 1000 + 30
            ),
            initTimeoutSeconds=floatOption(options, "initTimeoutSeconds", 120.0),
            requestTimeoutSeconds=floatOption(options, "requestTimeoutSeconds", 30.0),
        )

    @property
    def bootstrapServers(self) -> str:
        return self.producerConfig["bootstrap.servers"]

    def prefixFor(self, sinkId: str) -> str:
        """The transactional id prefix of the sink ``sinkId``."""
        return self.transactionalIdPrefix or f"twophase-{sinkId}"


def _intConfig(config: Mapping[str, str], name: str) -> int | None:
    raw = config.get(name)
    if raw is None:
        return None
    try:
        return int(str(raw).strip())
    except ValueError:
        raise TwoPhaseConfigError(f"option kafka.{name}={raw!r} is not an integer") from None


def transactionalIdFor(prefix: str, partitionId: int, attemptNumber: int) -> str:
    """``<prefix>-<partition>`` for a first attempt, ``<prefix>-<partition>-a<n>`` for others.

    Stable per partition, so the next batch's task fences whatever an earlier one left open,
    and the ids of a sink stay few. A retried or speculative attempt gets an id of its own: a
    speculative copy that began later must never fence (and so abort) the transaction of the
    attempt whose result Spark keeps; the zombie it leaves is swept after the batch commits.
    """
    if attemptNumber <= 0:
        return f"{prefix}-{partitionId}"
    return f"{prefix}-{partitionId}-a{attemptNumber}"


def _ownsId(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}-\d+(?:-a\d+)?$")


class ProbeVerdict(StrEnum):
    """What reading a transaction's last record back with ``read_committed`` says."""

    COMMITTED = "committed"
    ABORTED = "aborted"
    UNDECIDED = "undecided"
    """The partition's last stable offset is not past the record yet: ask again later."""
    GONE = "gone"
    """The record was deleted by retention: nothing can tell any more."""


_TIMEOUT_CACHE: dict[str, tuple[int, float]] = {}
_TIMEOUT_LOCK = threading.Lock()
_TIMEOUT_CACHE_SECONDS = 300.0


def brokerTransactionMaxTimeoutMs(config: Mapping[str, str], timeoutSeconds: float = 30) -> int:
    """The brokers' ``transaction.max.timeout.ms`` (smallest over brokers), cached 5 minutes.

    Falls back to 900000 (Kafka's default) with a warning when DescribeConfigs is refused; an
    unreachable cluster raises ``KafkaUnreachableError``.
    """
    key = config["bootstrap.servers"]
    with _TIMEOUT_LOCK:
        cached = _TIMEOUT_CACHE.get(key)
        if cached is not None and time.monotonic() - cached[1] < _TIMEOUT_CACHE_SECONDS:
            return cached[0]
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient(dict(_adminConfig(config)))
    try:
        metadata = admin.list_topics(timeout=timeoutSeconds)
    except KafkaException as exc:
        raise KafkaUnreachableError(
            f"kafka: cannot reach the cluster at {key} within {timeoutSeconds:.0f} s "
            f"({_kafkaErrorText(exc)}); check kafka.bootstrap.servers and the security options"
        ) from None
    values: list[int] = []
    try:
        resources = [ConfigResource(ResourceType.BROKER, str(b)) for b in metadata.brokers]
        for future in admin.describe_configs(resources, request_timeout=timeoutSeconds).values():
            entries = future.result(timeout=timeoutSeconds)
            entry = entries.get("transaction.max.timeout.ms")
            if entry is not None and entry.value is not None:
                values.append(int(entry.value))
    except Exception as exc:
        log.warning(
            "kafka: cannot read transaction.max.timeout.ms from the brokers at %s (%s); "
            "assuming Kafka's default %d ms. Set kafka.transaction.timeout.ms to choose.",
            key,
            exc,
            DEFAULT_TRANSACTION_TIMEOUT_MS,
        )
    value = min(values) if values else DEFAULT_TRANSACTION_TIMEOUT_MS
    with _TIMEOUT_LOCK:
        _TIMEOUT_CACHE[key] = (value, time.monotonic())
    return value


class KafkaUnreachableError(ConnectionError):
    """No broker of ``kafka.bootstrap.servers`` answered."""


def _adminConfig(config: Mapping[str, str]) -> dict[str, str | int | float | bool]:
    """The producer settings that matter to an admin client or a consumer (connection, auth)."""
    producerOnly = (
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
    return {k: v for k, v in config.items() if not k.startswith(producerOnly)}


def _kafkaErrorText(exc: BaseException) -> str:
    error = exc.args[0] if exc.args else None
    text = getattr(error, "str", None)
    return str(text()) if callable(text) else str(exc)


class KafkaParticipant(TwoPhaseParticipant[KafkaTransaction]):
    """Exactly-once Kafka through transactions prepared on executors and ended by the driver.

    Guarantees:

    - Nothing a task writes is visible to ``read_committed`` consumers before ``commit``.
    - ``commit`` is idempotent: a committed transaction is committed again as a no-op, and a
      lost one raises ``TransactionLostError`` naming the batch, partition and transactional
      id, never a silent success.
    - ``abort`` and ``recoverAndAbort`` end only transactions of this sink's transactional ids,
      and never one that ``scope.keep`` names.
    """

    def __init__(self, settings: KafkaSettings, options: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.options = dict(options or {})
        self._warnedNoListing = False

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> KafkaParticipant:
        return cls(KafkaSettings.fromOptions(options), options)

    # -- shared -----------------------------------------------------------------------------

    def transactionTimeoutMs(self) -> int:
        """``kafka.transaction.timeout.ms``, else the brokers' maximum (cached per process)."""
        if self.settings.transactionTimeoutMs is not None:
            return self.settings.transactionTimeoutMs
        return brokerTransactionMaxTimeoutMs(
            self.settings.producerConfig, self.settings.requestTimeoutSeconds
        )

    def validateSchema(self, schema: StructType) -> None:
        """Check a DataFrame's columns as Spark's Kafka sink does; errors name the column."""
        fields = {f.name.lower(): f.dataType for f in schema.fields}

        def check(name: str, accepted: tuple[type, ...], what: str) -> None:
            dataType = fields.get(name)
            if dataType is not None and not isinstance(dataType, accepted):
                raise TwoPhaseConfigError(
                    f"kafka sink: column {name!r} has type {dataType.simpleString()}; it must be "
                    f"{what}"
                )

        if "value" not in fields:
            raise TwoPhaseConfigError(
                "kafka sink: the input needs a 'value' column (string or binary); it has "
                f"{', '.join(f.name for f in schema.fields) or 'no columns'}"
            )
        check("value", (StringType, BinaryType), "string or binary")
        check("key", (StringType, BinaryType), "string or binary")
        check("topic", (StringType,), "string")
        check("partition", (IntegerType, ShortType, ByteType, LongType), "int")
        if "topic" not in fields and not self.settings.topic:
            raise TwoPhaseConfigError(
                "kafka sink: no topic: add a 'topic' column or set .option('topic', <name>)"
            )
        headers = fields.get("headers")
        if headers is not None:
            valid = (
                isinstance(headers, ArrayType)
                and isinstance(headers.elementType, StructType)
                and {f.name: type(f.dataType) for f in headers.elementType.fields}
                in (
                    {"key": StringType, "value": BinaryType},
                    {"key": StringType, "value": StringType},
                )
            )
            if not valid:
                raise TwoPhaseConfigError(
                    f"kafka sink: column 'headers' has type {headers.simpleString()}; it must be "
                    "array<struct<key:string,value:binary>>"
                )

    def client(self) -> TransactionClient:
        """The driver's transaction client (shared by the process, see ``sharedClient``)."""
        return sharedClient(
            self.settings.producerConfig, timeoutSeconds=self.settings.requestTimeoutSeconds
        )

    # -- executor side ----------------------------------------------------------------------

    def beginTransaction(self, ctx: TransactionContext) -> KafkaTransaction:
        """Executor: a producer for this partition's transactional id, fenced and begun."""
        prefix = self.settings.prefixFor(ctx.sinkId)
        return producing.beginTransaction(
            ctx,
            transactionalIdFor(prefix, ctx.partitionId, ctx.attemptNumber),
            prefix,
            self.settings.producerConfig,
            defaultTopic=self.settings.topic,
            transactionTimeoutMs=self.transactionTimeoutMs(),
            flushTimeoutSeconds=self.settings.flushTimeoutSeconds,
            initTimeoutSeconds=self.settings.initTimeoutSeconds,
        )

    def write(self, txn: KafkaTransaction, batch: pa.RecordBatch) -> None:
        """Executor: produce the batch's rows into the open transaction."""
        producing.write(txn, batch)

    def preCommit(self, txn: KafkaTransaction) -> Handle:
        """Executor: flush, check every delivery, return the handle; the transaction stays open."""
        ctx = txn.ctx
        handle: Handle = {
            "kind": KIND,
            "batchId": ctx.batchId,
            "partitionId": ctx.partitionId,
            "attempt": ctx.attemptNumber,
        }
        handle.update(producing.preCommit(txn))
        log.debug("kafka: prepared %s", self.describe(handle))
        return handle

    def abortTransaction(self, txn: KafkaTransaction) -> None:
        """Executor, best effort: abort the open transaction of a failed task."""
        producing.abortTransaction(txn)

    # -- driver side ------------------------------------------------------------------------

    def commit(self, handle: Handle) -> None:
        """Driver, idempotent: EndTxn(commit) with the handle's producer id and epoch.

        Success, also for a transaction committed before. Retriable broker answers and network
        failures raise ``TransientCommitError``. A transaction the broker no longer lets this
        producer id and epoch end is read back: committed -> success, aborted ->
        ``TransactionLostError``.
        """
        h = _checkHandle(handle)
        if h["records"] == 0:
            return
        self._warnIfOld(h)
        code = self.client().endTransaction(
            h["transactionalId"], h["producerId"], h["producerEpoch"], commit=True
        )
        if code == NONE:
            log.debug("kafka: committed %s", self.describe(h))
            return
        self._settleUnended(h, code)

    def abort(self, handle: Handle) -> None:
        """Driver, idempotent: EndTxn(abort) with exactly this producer id and epoch.

        Never touches a newer transaction of the same id (its epoch is higher: the broker
        answers PRODUCER_FENCED, which means this one is gone already).
        """
        h = _checkHandle(handle)
        if h["records"] == 0:
            return
        code = self.client().endTransaction(
            h["transactionalId"], h["producerId"], h["producerEpoch"], commit=False
        )
        if code == INVALID_TXN_STATE:
            log.warning(
                "kafka: abort of %s: the broker says the transaction is not open "
                "(%s): it was committed or aborted before",
                self.describe(h),
                errorName(code),
            )
        elif code != NONE:
            log.debug("kafka: abort of %s: already gone (%s)", self.describe(h), errorName(code))

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle]:
        """Driver, idempotent: fence and abort this sink's open transactions that keep lacks.

        Lists ongoing transactions whose id is ``<prefix>-<partition>[-a<attempt>]`` (broker
        ListTransactions) and fences each with ``init_transactions`` on its id, which aborts
        it. Ids named by a kept handle are never touched. When the brokers cannot list
        transactions, warns once and relies on the next task of each id to fence it.
        """
        prefix = self.settings.prefixFor(scope.sinkId)
        keep = {h.get("transactionalId") for h in scope.keep if h.get("kind") == KIND}
        listings = self.client().listOngoing(prefix + "-")
        if listings is None:
            if not self._warnedNoListing:
                self._warnedNoListing = True
                log.warning(
                    "kafka: the brokers at %s cannot list transactions (ListTransactions needs "
                    "Kafka 3.0+ and DESCRIBE on the transactional ids); lingering transactions "
                    "of sink %s are fenced only when their id is used again, or aborted by "
                    "the broker after transaction.timeout.ms",
                    self.settings.bootstrapServers,
                    scope.sinkId,
                )
            return []
        owned = _ownsId(prefix)
        targets = [
            t for t in listings if owned.match(t.transactionalId) and t.transactionalId not in keep
        ]
        if not targets:
            return []
        timeoutMs = self.transactionTimeoutMs()
        with ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool:
            list(pool.map(lambda t: self._fence(t.transactionalId, timeoutMs), targets))
        aborted = [
            {
                "kind": KIND,
                "transactionalId": t.transactionalId,
                "producerId": t.producerId,
                "state": t.state,
            }
            for t in targets
        ]
        log.info(
            "kafka: fenced and aborted %d lingering transaction(s) of sink %s: %s",
            len(aborted),
            scope.sinkId,
            ", ".join(t.transactionalId for t in targets),
        )
        return aborted

    def describe(self, handle: Handle) -> str:
        """``kafka batch N partition p attempt a: transactional id X (producer id P, epoch E)``."""
        if "batchId" in handle:
            text = (
                f"kafka batch {handle.get('batchId')} partition {handle.get('partitionId')} "
                f"attempt {handle.get('attempt')}: transactional id {handle.get('transactionalId')}"
            )
        else:  # a lingering transaction found by recoverAndAbort
            text = (
                f"kafka {handle.get('state', 'open')} transaction {handle.get('transactionalId')}"
            )
        if "producerId" in handle:
            text += f" (producer id {handle.get('producerId')}"
            if "producerEpoch" in handle:
                text += f", epoch {handle.get('producerEpoch')}"
            text += ")"
        if "records" in handle:
            text += f", {handle.get('records')} record(s)"
        return text

    # -- internals --------------------------------------------------------------------------

    def _fence(self, transactionalId: str, timeoutMs: int) -> None:
        """Abort whatever is open on ``transactionalId`` by initialising a producer with it."""
        from confluent_kafka import KafkaException, Producer

        config: dict[str, Any] = producing.withTimeouts(self.settings.producerConfig, timeoutMs)
        config["transactional.id"] = transactionalId
        try:
            producer = Producer(config)
        except KafkaException as exc:
            problem = librdkafkaError(exc, "fencing producer")
            if problem is not None:
                raise problem from None
            raise
        try:
            producer.init_transactions(self.settings.initTimeoutSeconds)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if getattr(error, "retriable", lambda: False)() or "timed out" in str(exc).lower():
                raise TransientCommitError(
                    f"kafka: fencing transactional id {transactionalId}: {_kafkaErrorText(exc)}"
                ) from exc
            raise
        finally:
            producer.close()  # nothing is open after init_transactions: close aborts nothing

    def _warnIfOld(self, h: Handle) -> None:
        startedAtMs = h.get("startedAtMs")
        timeoutMs = h.get("transactionTimeoutMs")
        if not isinstance(startedAtMs, int) or not isinstance(timeoutMs, int) or timeoutMs <= 0:
            return
        ageMs = int(time.time() * 1000) - startedAtMs
        if ageMs > WARN_FRACTION * timeoutMs:
            log.warning(
                "kafka: %s has been open for %.0f s, %.0f%% of its transaction.timeout.ms "
                "(%.0f s): if the driver is down longer than the timeout after a decision, the "
                "broker aborts decided transactions (see docs/kafka.md); raise "
                "kafka.transaction.timeout.ms / the broker's transaction.max.timeout.ms, or "
                "make batches shorter",
                self.describe(h),
                ageMs / 1000,
                100 * ageMs / timeoutMs,
                timeoutMs / 1000,
            )

    def _settleUnended(self, h: Handle, code: int) -> None:
        """EndTxn(commit) said the transaction cannot be ended: committed before, or lost?"""
        verdict, detail = self._probe(h)
        if verdict is ProbeVerdict.COMMITTED:
            log.info(
                "kafka: %s was committed before (EndTxn answered %s; %s)",
                self.describe(h),
                errorName(code),
                detail,
            )
            return
        if verdict is ProbeVerdict.UNDECIDED:
            raise TransientCommitError(
                f"kafka: commit of {self.describe(h)}: EndTxn answered {errorName(code)} and "
                f"the outcome is not readable yet ({detail})"
            )
        if verdict is ProbeVerdict.GONE:
            raise KafkaCommitError(
                f"kafka: commit of {self.describe(h)}: EndTxn answered {errorName(code)} and "
                f"the transaction's records are no longer in the log ({detail}), so whether it "
                "was committed cannot be told; check the topic by hand"
            )
        raise TransactionLostError(self._lostMessage(h, code, detail))

    def _lostMessage(self, h: Handle, code: int, detail: str) -> str:
        ageMs = int(time.time() * 1000) - int(h.get("startedAtMs") or 0)
        timeoutMs = int(h.get("transactionTimeoutMs") or 0)
        cause = (
            f"it was opened {ageMs / 1000:.0f} s ago, longer than its transaction.timeout.ms of "
            f"{timeoutMs / 1000:.0f} s, so the broker aborted it"
            if timeoutMs and ageMs > timeoutMs
            else "the broker aborted it (a producer with the same transactional id fenced it, "
            "or an administrator aborted it)"
        )
        return (
            f"kafka: batch {h.get('batchId')} partition {h.get('partitionId')} is decided but its "
            f"transaction is LOST: transactional id {h['transactionalId']}, producer id "
            f"{h['producerId']}, epoch {h['producerEpoch']}, {h['records']} record(s). EndTxn "
            f"answered {errorName(code)} and {detail}: {cause}. These records will never be "
            "visible to read_committed consumers; see docs/kafka.md ('A lost transaction')."
        )

    def _probe(self, h: Handle) -> tuple[ProbeVerdict, str]:
        """Read the transaction's last record with ``read_committed``: is it visible?"""
        probe = h.get("probe")
        if not isinstance(probe, dict):
            return ProbeVerdict.ABORTED, "the handle names no record to check"
        return probeRecord(
            self.settings.producerConfig,
            str(probe["topic"]),
            int(probe["partition"]),
            int(probe["offset"]),
            timeoutSeconds=self.settings.requestTimeoutSeconds,
        )


def probeRecord(
    config: Mapping[str, str], topic: str, partition: int, offset: int, *, timeoutSeconds: float
) -> tuple[ProbeVerdict, str]:
    """Is the record at ``topic[partition]@offset`` visible to a ``read_committed`` consumer?

    Records of one transaction become visible together or never, so one record tells the
    outcome of its whole transaction once the partition's last stable offset is past it.
    """
    import uuid

    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    where = f"record {topic}[{partition}]@{offset}"
    consumer = Consumer(
        {
            **_adminConfig(config),
            "group.id": f"twophase-probe-{uuid.uuid4().hex[:12]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        }
    )
    try:
        try:
            low, stable = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeoutSeconds, cached=False
            )
        except KafkaException as exc:
            raise TransientCommitError(
                f"kafka: reading offsets of {topic}[{partition}]: {exc}"
            ) from exc
        if offset < low:
            return ProbeVerdict.GONE, f"{where} was deleted (log start offset {low})"
        if stable <= offset:
            return ProbeVerdict.UNDECIDED, f"the last stable offset {stable} is not past {where}"
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + timeoutSeconds
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return (
                        ProbeVerdict.ABORTED,
                        f"{where} is not visible to read_committed consumers "
                        f"(the partition ends at {message.offset()})",
                    )
                if error.code() == KafkaError._AUTO_OFFSET_RESET:
                    return ProbeVerdict.GONE, f"{where} was deleted ({error.str()})"
                raise TransientCommitError(f"kafka: reading {where}: {error.str()}")
            if message.offset() == offset:
                return ProbeVerdict.COMMITTED, f"{where} is visible to read_committed consumers"
            return (
                ProbeVerdict.ABORTED,
                f"{where} is not visible to read_committed consumers (the next visible record "
                f"is at offset {message.offset()})",
            )
        return ProbeVerdict.UNDECIDED, f"no answer reading {where} within {timeoutSeconds:.0f} s"
    finally:
        consumer.close()


def _checkHandle(handle: Handle) -> Handle:
    """Refuse anything that is not a well-formed Kafka handle before talking to a broker."""
    if handle.get("kind") != KIND:
        raise ValueError(f"not a kafka handle (kind={handle.get('kind')!r}): {handle!r}")
    if not isinstance(handle.get("transactionalId"), str) or not handle["transactionalId"]:
        raise ValueError(f"kafka handle has no transactional id: {handle!r}")
    if not isinstance(handle.get("records"), int):
        raise ValueError(f"kafka handle has no record count: {handle!r}")
    if handle["records"] and not (
        isinstance(handle.get("producerId"), int) and isinstance(handle.get("producerEpoch"), int)
    ):
        raise ValueError(f"kafka handle has no producer id and epoch: {handle!r}")
    return handle


__all__ = [
    "DEFAULT_TRANSACTION_TIMEOUT_MS",
    "KIND",
    "KafkaCommitError",
    "KafkaParticipant",
    "KafkaSettings",
    "KafkaSink",
    "KafkaUnreachableError",
    "KafkaWriteError",
    "ProbeVerdict",
    "brokerTransactionMaxTimeoutMs",
    "probeRecord",
    "transactionalIdFor",
]


class KafkaSink(ParticipantSink):
    """``twophase.kafka``: the Spark data source over ``KafkaParticipant``, and the source too.

    ``df.writeStream.format("twophase.kafka").option("kafka.bootstrap.servers", ...)
    .option("topic", ...).option("checkpointLocation", ...).start()`` after
    ``twophase.register(spark)``; input columns as Spark's Kafka sink (``value``, optional
    ``key``, ``topic``, ``partition``, ``headers``).

    Like Spark's ``kafka`` format, the one name reads as well: ``spark.readStream
    .format("twophase.kafka")`` is the source of ``twophase.sources.kafka`` (PySpark keeps one
    data source per name, so this class serves both directions).
    """

    @classmethod
    def name(cls) -> str:
        return "twophase.kafka"

    def makeParticipant(self) -> KafkaParticipant:
        return KafkaParticipant.fromOptions(self.options)

    def schema(self) -> str:
        """The source's columns (``key``, ``value``, ``topic``, ... as Spark's Kafka source)."""
        from twophase.sources.kafka import KafkaSource

        return KafkaSource(self.options).schema()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The source: ``spark.readStream.format("twophase.kafka")``."""
        from twophase.sources.kafka import KafkaSource

        return KafkaSource(self.options).streamReader(schema)

    def validate(self, schema: StructType) -> None:
        """Driver: check options and columns, reach the cluster, fix the transaction timeout.

        The timeout read from the brokers is left in the options, so executors use the same
        value without asking the brokers again.
        """
        participant = self.participant
        assert isinstance(participant, KafkaParticipant)
        participant.validateSchema(schema)
        SinkSettings.fromOptions(self.options, self.name())
        settings = participant.settings
        brokerMax = brokerTransactionMaxTimeoutMs(
            settings.producerConfig, settings.requestTimeoutSeconds
        )
        chosen = settings.transactionTimeoutMs
        if chosen is not None and optionOf(self.options, RESOLVED_TIMEOUT_OPTION) is None:
            if chosen > brokerMax:
                raise TwoPhaseConfigError(
                    f"option kafka.transaction.timeout.ms={chosen} is larger than the brokers' "
                    f"transaction.max.timeout.ms={brokerMax}: lower it, or raise the broker "
                    "setting"
                )
            return
        self.options[RESOLVED_TIMEOUT_OPTION] = str(chosen if chosen is not None else brokerMax)
