"""The executor side of the Kafka sink: one transactional librdkafka producer per task attempt.

A task opens a transaction, produces its rows as it reads them, flushes, checks that every
record was acknowledged, reads the producer id and epoch from librdkafka's statistics, and
leaves the transaction **open** for the driver to end. Two facts of confluent-kafka shape this
module (both checked by ``integration_tests/test_kafka_protocol.py``):

- ``Producer.close()`` aborts an open transaction (confluent-kafka >= 2.16), so a prepared
  producer is never closed;
- destroying a producer without ``close()`` (garbage collection, interpreter exit, SIGKILL)
  leaves its transaction open on the broker.

So prepared producers stay referenced in their worker (``twophase.sinks.kafka.retention``).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from twophase.clients.kafka import errorText, newClient, shownConfig
from twophase.protocol import TransactionContext
from twophase.redaction import getLogger, redact
from twophase.sinks.kafka.columns import ColumnLayout
from twophase.sinks.kafka.errors import KafkaWriteError
from twophase.sinks.kafka.retention import Retained, markPrepared, release, retain
from twophase.sinks.kafka.settings import DEFAULT_MESSAGE_TIMEOUT_MS

log = getLogger(__name__)

STATISTICS_INTERVAL_MS = 100
"""librdkafka statistics period: the producer id and epoch are read from them."""

BATCH_CHUNK = 5000
"""Records handed to ``produce_batch`` at once."""

DEFAULT_QUEUE_MESSAGES = 100000
"""librdkafka's default ``queue.buffering.max.messages``."""


def withTimeouts(config: Mapping[str, str], transactionTimeoutMs: int) -> dict[str, Any]:
    """``config`` with the transaction timeout, and a delivery timeout librdkafka accepts.

    librdkafka refuses ``message.timeout.ms`` above ``transaction.timeout.ms``; the default
    delivery timeout is lowered to fit, an explicit one is left for librdkafka to judge.
    """
    result: dict[str, Any] = dict(config)
    result["transaction.timeout.ms"] = transactionTimeoutMs
    if "message.timeout.ms" not in result and "delivery.timeout.ms" not in result:
        result["message.timeout.ms"] = min(DEFAULT_MESSAGE_TIMEOUT_MS, transactionTimeoutMs)
    return result


_QUEUE_FULL = KafkaError._QUEUE_FULL

_USABLE_STATES = ("ReadyNotAcked", "Ready", "InTransaction")
"""librdkafka transaction states in which the statistics' producer id and epoch are those of
the open transaction: the latest statistics may predate ``begin_transaction`` (Ready) or even
the return of ``init_transactions`` (ReadyNotAcked: producer id assigned, call not returned)."""


class _Deliveries:
    """The delivery-report callback of one transaction: counts, the first errors, a probe."""

    __slots__ = ("acked", "failed", "errors", "last")

    def __init__(self) -> None:
        self.acked = 0
        self.failed = 0
        self.errors: list[str] = []
        self.last: Message | None = None

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.acked += 1
            self.last = msg
            return
        self.failed += 1
        if len(self.errors) < 5:
            self.errors.append(redact(f"{msg.topic()} [{msg.partition()}]: {err.str()}"))


class _Statistics:
    """librdkafka's statistics callback: keeps the latest ``eos`` section with a producer id.

    In a transaction-version-1 transaction the producer id and epoch are fixed by
    ``init_transactions`` and change only with a fatal or abortable error (which the delivery
    reports and the transaction state surface), so the first statistics after
    ``init_transactions`` already give the handle's id and epoch: no task waits for the next
    statistics period after its flush.

    Only the small ``eos`` object is decoded, not the whole document (brokers, topics,
    partitions: 6-20 KB, a tenth of a millisecond or more each, ten times a second per
    producer); once the task has prepared its transaction, ``stop()`` makes later statistics
    free, since a producer the worker keeps for the driver goes on emitting them.
    """

    __slots__ = ("eos", "at", "stopped")

    def __init__(self) -> None:
        self.eos: dict[str, Any] | None = None
        self.at = 0.0
        self.stopped = False

    def __call__(self, text: str) -> None:
        if self.stopped:
            return
        found = _EOS_KEY.search(text)
        if found is None:
            return
        eos, _ = _JSON.raw_decode(text, found.end())
        if isinstance(eos, dict) and int(eos.get("producer_id", -1)) >= 0:
            self.eos = eos
            self.at = time.monotonic()

    def stop(self) -> None:
        self.stopped = True


_EOS_KEY = re.compile(r'"eos"\s*:\s*')
"""Where the top-level ``eos`` object starts in librdkafka's statistics JSON."""
_JSON = json.JSONDecoder()


@dataclass(eq=False)
class KafkaTransaction:
    """One task attempt's Kafka transaction. Lives in one executor process; never pickled.

    With a default topic (option ``topic``), the producer is created, fenced and begun in a
    background thread from ``beginTransaction`` on (``starting``), while Spark computes the
    task's first rows; otherwise at the first record. ``write`` and ``preCommit`` wait for it.
    """

    ctx: TransactionContext = field(repr=False)  # its options may hold secrets
    transactionalId: str
    prefix: str
    config: Mapping[str, str] = field(repr=False)  # may hold secrets
    defaultTopic: str | None
    transactionTimeoutMs: int
    flushTimeoutSeconds: float
    initTimeoutSeconds: float
    producer: Producer | None = None
    starting: threading.Thread | None = None
    startError: BaseException | None = None
    deliveries: _Deliveries = field(default_factory=_Deliveries)
    statistics: _Statistics = field(default_factory=_Statistics)
    startedAtMs: int = 0
    queueLimit: int = DEFAULT_QUEUE_MESSAGES
    layout: ColumnLayout | None = None
    produced: int = 0
    state: str = "open"


def beginTransaction(
    ctx: TransactionContext,
    transactionalId: str,
    prefix: str,
    config: Mapping[str, str],
    *,
    defaultTopic: str | None,
    transactionTimeoutMs: int,
    flushTimeoutSeconds: float,
    initTimeoutSeconds: float,
) -> KafkaTransaction:
    """A transaction of ``transactionalId``; its producer starts now (in the background) when
    the topic is known, else at the first record."""
    txn = KafkaTransaction(
        ctx=ctx,
        transactionalId=transactionalId,
        prefix=prefix,
        config=config,
        defaultTopic=defaultTopic,
        transactionTimeoutMs=transactionTimeoutMs,
        flushTimeoutSeconds=flushTimeoutSeconds,
        initTimeoutSeconds=initTimeoutSeconds,
        queueLimit=int(config.get("queue.buffering.max.messages", DEFAULT_QUEUE_MESSAGES)),
    )
    if defaultTopic:

        def start() -> None:
            try:
                _startProducer(txn, defaultTopic)
            except BaseException as exc:  # handed to the task thread by _awaitStart
                txn.startError = exc

        txn.starting = threading.Thread(
            target=start, name=f"twophase-kafka-init-{transactionalId}", daemon=True
        )
        txn.starting.start()
    return txn


def _awaitStart(txn: KafkaTransaction) -> None:
    """Wait for the background start of the producer; raise what it raised."""
    if txn.starting is None:
        return
    txn.starting.join()
    txn.starting = None
    if txn.startError is not None:
        error, txn.startError = txn.startError, None
        raise error


def _startProducer(txn: KafkaTransaction, firstTopic: str) -> Producer:
    """Create the producer, ``init_transactions`` (fencing its predecessors), begin.

    The producer first fetches ``firstTopic``'s metadata twice: librdkafka drops its
    bootstrap connection once it has learned the brokers, and ``init_transactions`` started
    with no learned broker connected waits for its 500 ms coordinator timer. The first request
    goes through the bootstrap broker, the second through a learned one, which is then up.
    Measured on Kafka 4.1 (20 inits each): no request 12/20 took 0.5 s, one 4/20, two 0/20
    (median 0.06 s).
    """
    producerConfig = withTimeouts(txn.config, txn.transactionTimeoutMs)
    producerConfig.update(
        {
            "transactional.id": txn.transactionalId,
            "statistics.interval.ms": STATISTICS_INTERVAL_MS,
            "stats_cb": txn.statistics,
            "on_delivery": txn.deliveries,
        }
    )
    producer = newClient(Producer, producerConfig, "producer")
    log.debug("kafka: producer %s with %s", txn.transactionalId, shownConfig(txn.config))
    txn.startedAtMs = int(time.time() * 1000)
    try:
        for _ in range(2):
            producer.list_topics(firstTopic or None, timeout=txn.initTimeoutSeconds)
        producer.init_transactions(txn.initTimeoutSeconds)
        producer.begin_transaction()
    except KafkaException as exc:
        raise KafkaWriteError(
            f"kafka: could not begin a transaction with transactional id {txn.transactionalId} "
            f"at {txn.config.get('bootstrap.servers')}: {errorText(exc, named=True)}"
        ) from exc
    retain(txn.transactionalId, Retained(producer, txn.prefix, txn.ctx.batchId))
    txn.producer = producer
    return producer


def write(txn: KafkaTransaction, batch: pa.RecordBatch) -> None:
    """Produce one Arrow batch into the transaction; fail at the first delivery error."""
    if txn.layout is None:
        txn.layout = ColumnLayout.of(batch.schema, txn.defaultTopic)
    layout = txn.layout
    values = batch.column(layout.value).to_pylist()
    keys = batch.column(layout.key).to_pylist() if layout.key is not None else None
    topics = batch.column(layout.topic).to_pylist() if layout.topic is not None else None
    _awaitStart(txn)
    producer = txn.producer or _startProducer(
        txn, str(txn.defaultTopic or next((t for t in topics or () if t), ""))
    )
    if (
        layout.topic is None
        and layout.partition is None
        and layout.headers is None
        and hasattr(producer, "produce_batch")  # not in older confluent-kafka
    ):
        _produceBatch(txn, str(txn.defaultTopic), values, keys)
    else:
        partitions = (
            batch.column(layout.partition).to_pylist() if layout.partition is not None else None
        )
        headers = batch.column(layout.headers).to_pylist() if layout.headers is not None else None
        produce = producer.produce
        for i, value in enumerate(values):
            topic = topics[i] if topics is not None else txn.defaultTopic
            if topic is None:
                raise KafkaWriteError(
                    "kafka sink: a row has a null topic; set .option('topic', <name>) for a "
                    "default topic"
                )
            kwargs: dict[str, Any] = {}
            if keys is not None and keys[i] is not None:
                kwargs["key"] = keys[i]
            if partitions is not None and partitions[i] is not None:
                kwargs["partition"] = int(partitions[i])
            if headers is not None and headers[i]:
                kwargs["headers"] = [(h["key"], h["value"]) for h in headers[i]]
            while True:
                try:
                    produce(topic, value, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.05)
                    _raiseDeliveryErrors(txn)
                except KafkaException as exc:
                    raise KafkaWriteError(
                        f"kafka: producing to {topic}: {errorText(exc, named=True)}"
                    ) from exc
        txn.produced += len(values)
    producer.poll(0)
    _raiseDeliveryErrors(txn)


def _produceBatch(
    txn: KafkaTransaction, topic: str, values: list[Any], keys: list[Any] | None
) -> None:
    """The fast path: one topic, no explicit partitions or headers: ``produce_batch``.

    Records of a chunk are handed over only when the local queue has room for the chunk, so a
    full queue is rare; when it happens anyway the refused records must be a suffix of the
    chunk (then they are produced again, in order), else the task fails rather than reorder.
    """
    if keys is None:
        messages = [{"value": v} for v in values]
    else:
        messages = [
            {"value": v} if k is None else {"value": v, "key": k}
            for v, k in zip(values, keys, strict=True)
        ]
    producer = txn.producer
    assert producer is not None
    chunk = max(1, min(BATCH_CHUNK, txn.queueLimit // 2))
    for start in range(0, len(messages), chunk):
        pending = messages[start : start + chunk]
        while pending:
            while len(producer) + len(pending) > txn.queueLimit:
                producer.poll(0.005)
            _raiseDeliveryErrors(txn)
            try:
                producer.produce_batch(topic, pending)
            except KafkaException as exc:
                raise KafkaWriteError(
                    f"kafka: producing to {topic}: {errorText(exc, named=True)}"
                ) from exc
            failedAt = next((i for i, m in enumerate(pending) if "_error" in m), len(pending))
            txn.produced += failedAt
            failed = pending[failedAt:]
            if not failed:
                break
            refused = [m for m in failed if "_error" in m]
            if len(refused) != len(failed) or any(
                _errorCode(m["_error"]) != _QUEUE_FULL for m in refused
            ):
                raise KafkaWriteError(
                    f"kafka: producing to {topic} failed: {redact(str(refused[0]['_error']))} "
                    f"({len(refused)} of {len(pending)} records refused)"
                )
            for m in failed:
                del m["_error"]
            pending = failed
            producer.poll(0.05)


def _errorCode(error: Any) -> int | None:
    code = getattr(error, "code", None)
    return int(code()) if callable(code) else None


def _raiseDeliveryErrors(txn: KafkaTransaction) -> None:
    deliveries = txn.deliveries
    if deliveries.failed:
        raise KafkaWriteError(
            f"kafka: {deliveries.failed} record(s) of transactional id {txn.transactionalId} "
            f"were not delivered: {'; '.join(deliveries.errors)}"
        )


def preCommit(txn: KafkaTransaction) -> dict[str, Any]:
    """Flush, check every delivery report, read producer id and epoch; keep the txn open.

    Returns the handle fields that describe the transaction (the participant adds its own);
    a transaction without records has nothing to commit (its producer, if any, began a
    transaction only locally: librdkafka tells the broker at the first record).
    """
    _awaitStart(txn)
    producer = txn.producer
    if producer is None or txn.produced == 0:
        txn.state = "prepared"
        txn.statistics.stop()
        if producer is not None:
            markPrepared(txn.transactionalId, producer)
        return {"transactionalId": txn.transactionalId, "records": 0}
    deadline = time.monotonic() + txn.flushTimeoutSeconds
    remaining = producer.flush(txn.flushTimeoutSeconds)
    while remaining and time.monotonic() < deadline:
        remaining = producer.flush(max(0.1, deadline - time.monotonic()))
    _raiseDeliveryErrors(txn)
    if remaining:
        raise KafkaWriteError(
            f"kafka: {remaining} record(s) of transactional id {txn.transactionalId} were not "
            f"acknowledged within {txn.flushTimeoutSeconds:.0f} s"
        )
    if txn.deliveries.acked != txn.produced:
        raise KafkaWriteError(
            f"kafka: transactional id {txn.transactionalId}: {txn.produced} records produced "
            f"but {txn.deliveries.acked} acknowledged"
        )
    eos = _freshEos(txn)
    txnState = str(eos.get("txn_state", ""))
    if txnState not in _USABLE_STATES or eos.get("idemp_state") != "Assigned":
        raise KafkaWriteError(
            f"kafka: transactional id {txn.transactionalId} is in state {txnState!r} "
            f"(idempotence {eos.get('idemp_state')!r}): the transaction cannot be committed"
        )
    handle: dict[str, Any] = {
        "transactionalId": txn.transactionalId,
        "producerId": int(eos["producer_id"]),
        "producerEpoch": int(eos["producer_epoch"]),
        "records": txn.produced,
        "startedAtMs": txn.startedAtMs,
        "transactionTimeoutMs": txn.transactionTimeoutMs,
    }
    last = txn.deliveries.last
    if last is not None:
        handle["probe"] = {
            "topic": last.topic(),
            "partition": last.partition(),
            "offset": last.offset(),
        }
    if handle["producerId"] < 0:
        raise KafkaWriteError(
            f"kafka: librdkafka reports no producer id for {txn.transactionalId} ({eos})"
        )
    txn.state = "prepared"
    txn.statistics.stop()
    markPrepared(txn.transactionalId, producer)
    return handle


def _freshEos(txn: KafkaTransaction, timeoutSeconds: float = 10.0) -> dict[str, Any]:
    """The latest ``eos`` statistics with the producer id; waits for the first ones if needed."""
    deadline = time.monotonic() + timeoutSeconds
    statistics = txn.statistics
    producer = txn.producer
    assert producer is not None
    producer.poll(0)
    while statistics.eos is None:
        if time.monotonic() > deadline:
            raise KafkaWriteError(
                f"kafka: librdkafka sent no statistics for {txn.transactionalId} within "
                f"{timeoutSeconds:.0f} s, so its producer id and epoch are unknown"
            )
        producer.poll(0.01)
    return statistics.eos


def abortTransaction(txn: KafkaTransaction, timeoutSeconds: float = 10.0) -> None:
    """Best effort: drop unsent records, abort the open transaction, close the producer."""
    try:
        _awaitStart(txn)
    except BaseException:  # the start failed: nothing to abort on this side
        log.debug("kafka: %s never started", txn.transactionalId, exc_info=True)
    producer = txn.producer
    txn.state = "aborted"
    if producer is None:
        return
    try:
        producer.purge()
        producer.abort_transaction(timeoutSeconds)
    except Exception:  # fenced or broker down: the driver's sweep aborts it later
        log.debug("kafka: aborting %s on the executor failed", txn.transactionalId, exc_info=True)
    try:
        producer.close()
    except Exception:  # best effort
        log.debug("kafka: closing %s failed", txn.transactionalId, exc_info=True)
    release(txn.transactionalId, producer)
