"""A task's Kafka transaction and the producer it runs on: taken from the pool, begun, aborted.

A task takes a transactional librdkafka producer from its worker's pool
(``twophase.sinks.kafka.pool``) and begins a transaction at its first row; ``sending.py``
produces its rows, flushes, checks that every record was acknowledged, and leaves the
transaction **open** for the driver to end; the producer goes back to the pool, holding it.
The producer id and epoch come from librdkafka's own log (debug context ``eos``:
``Acquired PID{Id:..,Epoch:..}`` when ``init_transactions`` gets them), not from its statistics,
whose periodic JSON would cost every pooled producer CPU for as long as it lives. Two facts of
confluent-kafka shape this module (both checked by ``integration_tests/test_kafka_protocol.py``):

- ``Producer.close()`` aborts an open transaction (confluent-kafka >= 2.16), so a producer
  holding a prepared transaction is never closed;
- destroying a producer without ``close()`` (garbage collection, interpreter exit, SIGKILL)
  leaves its transaction open on the broker.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, Producer

from twophase.clients.kafka import errorText, newClient, shownConfig
from twophase.protocol import TransactionContext
from twophase.protocol.fingerprint import Fingerprint
from twophase.redaction import getLogger, redact
from twophase.resources import Resources
from twophase.sinks.kafka import pool
from twophase.sinks.kafka.columns import ColumnLayout
from twophase.sinks.kafka.deliveries import Deliveries
from twophase.sinks.kafka.encoding import RecordEncoding
from twophase.sinks.kafka.errors import KafkaWriteError
from twophase.sinks.kafka.pool import Pooled
from twophase.sinks.kafka.settings import DEFAULT_MESSAGE_TIMEOUT_MS

log = getLogger(__name__)

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


_ACQUIRED_PID = re.compile(r"Acquired PID\{Id:(-?\d+),Epoch:(-?\d+)\}")
"""librdkafka's ``GETPID`` debug line when ``init_transactions`` (or an epoch bump) ends."""


class ProducerLog:
    """librdkafka's log of one producer: the producer id and epoch it acquired, fatal errors.

    Set as the producer's ``logger`` with ``debug=eos``; confluent-kafka calls ``log(level,
    "%s [%s] %s", facility, name, message)`` from ``poll``/``flush``. The latest ``GETPID`` line
    gives the id and epoch (a transaction-version-1 producer keeps them from
    ``init_transactions`` on: ending a transaction does not bump the epoch). Warnings and errors
    go to this module's logger, redacted; debug lines are dropped.
    """

    __slots__ = ("producerId", "epoch", "fatal", "transactionalId", "forward")

    def __init__(self, transactionalId: str, forward: bool = False) -> None:
        self.producerId = -1
        self.epoch = -1
        self.fatal: str | None = None
        self.transactionalId = transactionalId
        self.forward = forward

    def log(self, level: int, fmt: str, *args: Any) -> None:
        facility = args[0] if args else ""
        if facility == "GETPID":
            found = _ACQUIRED_PID.search(str(args[2]))
            if found is not None:
                self.producerId, self.epoch = int(found.group(1)), int(found.group(2))
            return
        if facility in ("FATAL", "TXNERR") and self.fatal is None:
            self.fatal = redact(str(args[2]))
        if level >= 20 or self.forward:  # not a debug line
            log.log(max(level, 10), "librdkafka %s: %s", self.transactionalId, redact(fmt % args))

    def current(self) -> tuple[int, int]:
        return self.producerId, self.epoch


@dataclass(eq=False)
class KafkaTransaction:
    """One task attempt's Kafka transaction. Lives in one executor process; never pickled.

    With a default topic (option ``topic``), the producer is taken from the pool (created,
    or its previous transaction settled) in a background thread from ``beginTransaction`` on
    (``starting``), while Spark computes the task's first rows; otherwise at the first record.
    The transaction begins at the first record: a task without rows opens none.
    """

    ctx: TransactionContext = field(repr=False)  # its options may hold secrets
    prefix: str
    config: Mapping[str, str] = field(repr=False)  # may hold secrets
    defaultTopic: str | None
    transactionTimeoutMs: int
    flushTimeoutSeconds: float
    initTimeoutSeconds: float
    requestTimeoutSeconds: float = 30.0
    transactionalId: str = ""
    pooled: Pooled | None = field(default=None, repr=False)
    producer: Producer | None = None
    began: bool = False
    beganAs: tuple[int, int] = (-1, -1)
    starting: threading.Thread | None = None
    startError: BaseException | None = None
    deliveries: Deliveries = field(default_factory=Deliveries)
    startedAtMs: int = 0
    queueLimit: int = DEFAULT_QUEUE_MESSAGES
    layout: ColumnLayout | None = None
    encoding: RecordEncoding = field(default_factory=RecordEncoding.plain, repr=False)
    """How rows become record values and keys (options ``value.format``, ``key.format``)."""
    produced: int = 0
    largest: tuple[int, int] = (-1, -1)
    """The largest record produced: its key and value bytes, its position in the task."""
    fingerprint: Fingerprint = field(default_factory=Fingerprint)
    state: str = "open"
    deadLetterTopic: str | None = None
    """Option ``badRecords``: where refused rows go (``deadletter``); ``None``: they fail."""
    setAside: int = 0
    resources: Resources | None = field(default=None, repr=False)
    """Where the pooled producers are kept (the process's unless the writer was given some)."""

    @property
    def poolKey(self) -> Hashable:
        """What a pooled producer must share to serve this task: cluster, settings, timeout."""
        return (tuple(sorted(self.config.items())), self.transactionTimeoutMs)


def beginTransaction(
    ctx: TransactionContext,
    prefix: str,
    config: Mapping[str, str],
    *,
    defaultTopic: str | None,
    transactionTimeoutMs: int,
    flushTimeoutSeconds: float,
    initTimeoutSeconds: float,
    requestTimeoutSeconds: float = 30.0,
    deadLetterTopic: str | None = None,
    resources: Resources | None = None,
    encoding: RecordEncoding | None = None,
) -> KafkaTransaction:
    """A transaction of sink ``prefix``; its producer is taken now (in the background) when the
    topic is known, else at the first record."""
    txn = KafkaTransaction(
        ctx=ctx,
        prefix=prefix,
        config=config,
        defaultTopic=defaultTopic,
        transactionTimeoutMs=transactionTimeoutMs,
        flushTimeoutSeconds=flushTimeoutSeconds,
        initTimeoutSeconds=initTimeoutSeconds,
        requestTimeoutSeconds=requestTimeoutSeconds,
        queueLimit=int(config.get("queue.buffering.max.messages", DEFAULT_QUEUE_MESSAGES)),
        deadLetterTopic=deadLetterTopic,
        resources=resources,
        encoding=encoding or RecordEncoding.plain(),
    )
    if defaultTopic:

        def start() -> None:
            try:
                acquire(txn, defaultTopic)
            except BaseException as exc:  # handed to the task thread by _awaitStart
                txn.startError = exc

        txn.starting = threading.Thread(
            target=start, name=f"twophase-kafka-start-{prefix}", daemon=True
        )
        txn.starting.start()
    return txn


def awaitStart(txn: KafkaTransaction) -> None:
    """Wait for the background start of the producer; raise what it raised."""
    if txn.starting is None:
        return
    txn.starting.join()
    txn.starting = None
    if txn.startError is not None:
        error, txn.startError = txn.startError, None
        raise error


def _listOpen(txn: KafkaTransaction) -> Any:
    """``listing`` for ``pool.openIds``: the worker's open transactions, from the brokers."""
    from twophase.sinks.kafka.txn import sharedClient

    def listing(idPrefix: str) -> list[str] | None:
        client = sharedClient(
            txn.config, timeoutSeconds=txn.requestTimeoutSeconds, resources=txn.resources
        )
        found = client.listOngoing(idPrefix)
        return None if found is None else [t.transactionalId for t in found]

    return listing


def acquire(txn: KafkaTransaction, firstTopic: str) -> None:
    """Take a pooled producer: ready, or settled (its previous transaction ended), or new."""
    ctx = txn.ctx
    entry, free = pool.acquire(txn.prefix, txn.poolKey, ctx.runId, ctx.batchId, txn.resources)
    txn.pooled = entry
    txn.transactionalId = entry.transactionalId
    try:
        if not free and entry.producer is not None:
            openNow = pool.openIds(
                txn.prefix, ctx.runId, ctx.batchId, _listOpen(txn), txn.resources
            )
            free = pool.settle(entry, openNow, txn.initTimeoutSeconds)
        if not free:
            entry.producer, entry.producerLog = _createProducer(txn, firstTopic)
            entry.deliveries = txn.deliveries
    except BaseException:
        pool.discard(entry)
        raise
    # The pooled producer's delivery reports now count for this transaction.
    assert isinstance(entry.deliveries, Deliveries)
    entry.deliveries.reset()
    txn.deliveries = entry.deliveries
    txn.producer = entry.producer


def _createProducer(txn: KafkaTransaction, firstTopic: str) -> tuple[Producer, ProducerLog]:
    """Create the producer of ``txn.transactionalId`` and ``init_transactions`` (fencing and
    aborting whatever an earlier producer of the id left open).

    The producer first fetches ``firstTopic``'s metadata twice: librdkafka drops its
    bootstrap connection once it has learned the brokers, and ``init_transactions`` started
    with no learned broker connected waits for its 500 ms coordinator timer. The first request
    goes through the bootstrap broker, the second through a learned one, which is then up.
    Measured on Kafka 4.1 (20 inits each): no request 12/20 took 0.5 s, one 4/20, two 0/20
    (median 0.06 s).
    """
    producerConfig = withTimeouts(txn.config, txn.transactionTimeoutMs)
    debug = {c.strip() for c in str(producerConfig.get("debug", "")).split(",") if c.strip()}
    producerLog = ProducerLog(txn.transactionalId, forward=bool(debug))
    producerConfig.update(
        {
            "transactional.id": txn.transactionalId,
            "debug": ",".join(sorted(debug | {"eos"})),
            "logger": producerLog,
            "on_delivery": txn.deliveries,
        }
    )
    producer = newClient(Producer, producerConfig, "producer")
    log.debug("kafka: producer %s with %s", txn.transactionalId, shownConfig(txn.config))
    try:
        for _ in range(2):
            producer.list_topics(firstTopic or None, timeout=txn.initTimeoutSeconds)
        producer.init_transactions(txn.initTimeoutSeconds)
    except KafkaException as exc:
        try:
            producer.close()  # nothing of ours is open: close aborts nothing
        except Exception:  # best effort
            log.debug("kafka: closing %s failed", txn.transactionalId, exc_info=True)
        raise KafkaWriteError(
            f"kafka: could not begin a transaction with transactional id {txn.transactionalId} "
            f"at {txn.config.get('bootstrap.servers')}: {errorText(exc, named=True)}",
            reason=KafkaWriteError.classify(exc),
        ) from exc
    return producer, producerLog


def producerLogOf(txn: KafkaTransaction) -> ProducerLog:
    entry = txn.pooled
    assert entry is not None and isinstance(entry.producerLog, ProducerLog)
    return entry.producerLog


def begin(txn: KafkaTransaction, producer: Producer) -> None:
    """Begin the transaction (local to the producer: the broker hears of it at the first record)."""
    producerLog = producerLogOf(txn)
    try:
        producer.begin_transaction()
    except KafkaException as exc:
        raise KafkaWriteError(
            f"kafka: could not begin a transaction with transactional id {txn.transactionalId}: "
            f"{errorText(exc, named=True)}",
            reason=KafkaWriteError.classify(exc),
        ) from exc
    txn.began = True
    txn.startedAtMs = int(time.time() * 1000)
    deadline = time.monotonic() + 10.0
    producer.poll(0)
    while producerLog.producerId < 0:  # logged before init_transactions returned; not served?
        if time.monotonic() > deadline:
            raise KafkaWriteError(
                f"kafka: librdkafka logged no producer id for {txn.transactionalId} (debug "
                "context eos), so the transaction's producer id and epoch are unknown"
            )
        producer.poll(0.01)
    txn.beganAs = producerLog.current()


def abortTransaction(txn: KafkaTransaction, timeoutSeconds: float = 10.0) -> None:
    """Best effort: drop unsent records, abort the open transaction, close the producer."""
    try:
        awaitStart(txn)
    except BaseException:  # the start failed: nothing to abort on this side
        log.debug("kafka: %s never started", txn.transactionalId, exc_info=True)
    producer = txn.producer
    txn.state = "aborted"
    if txn.pooled is not None:
        pool.discard(txn.pooled)
    if producer is None:
        return
    try:
        producer.purge()
        if txn.began:
            producer.abort_transaction(timeoutSeconds)
    except Exception:  # fenced or broker down: the driver's sweep aborts it later
        log.debug("kafka: aborting %s on the executor failed", txn.transactionalId, exc_info=True)
    try:
        producer.close()
    except Exception:  # best effort
        log.debug("kafka: closing %s failed", txn.transactionalId, exc_info=True)
