"""Transactional producers pooled in their Python worker: kept for the driver, reused by tasks.

Spark reuses Python workers between tasks, so a worker keeps its producers (Flink's pooled
transactional ids, flink-connector-kafka's ``TransactionNamingStrategy.POOLING``) instead of
creating and fencing one per task. The ids are ``<prefix>-w<token>-<n>``: ``token`` is random
per worker process, so no two live workers (other processes, other executors, other hosts, a
restarted application) ever share an id; ``n`` counts the worker's ids, so a worker holds only
as many as it has transactions open at once.

A producer whose last transaction holds records (``prepared``) is reused only by a task of a
later batch of the same run, or of another run: by then the driver has committed every decided
transaction of earlier batches (micro-batches are sequential; a restart commits decided batches
before any task runs), so what is still open on the id is undecided and never will be decided.
Before reuse, one ListTransactions per worker and batch tells which of the worker's ids are
still open: those are aborted (``close()``); the others end with the producer's own
``commit_transaction()``, which the broker answers as a repeat of the driver's commit (no-op
success; pid and epoch unchanged) or refuses when the transaction was aborted (the producer is
then replaced). When the worker cannot list, the id is taken over by a new producer, whose
``init_transactions`` aborts whatever is open on it.

``Producer.close()`` aborts an open transaction and dropping a producer does not, so a producer
holding a prepared transaction is never closed here: beyond ``MAX_PRODUCERS`` it is dropped and
its id kept for a later task, which takes it over with ``init_transactions``.
"""

from __future__ import annotations

import enum
import secrets
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, Producer

from twophase.redaction import getLogger
from twophase.resources import Resources

log = getLogger(__name__)

MAX_PRODUCERS = 256
"""Producers a worker keeps per sink; further prepared ones are dropped (their ids are kept)."""

KEEPER_INTERVAL_SECONDS = 1.0
"""How often the keeper thread serves the event queues of producers no task uses."""


class State(enum.StrEnum):
    """Where a pooled id stands (a string enum: equal to its value)."""

    BUSY = "busy"
    """A task holds it."""
    PREPARED = "prepared"
    """Its transaction holds records of batch ``batchId`` of run ``runId`` (ended by the
    driver or by nobody), or whatever is open on it is left for a take-over."""
    READY = "ready"
    """No transaction open: the next task can begin at once."""


@dataclass(eq=False)
class Pooled:
    """One pooled transactional id and, while it is alive, its producer (``None`` when it was
    dropped)."""

    transactionalId: str
    prefix: str
    key: Hashable
    producer: Producer | None = None
    producerLog: Any = None
    """The producer's ``ProducerLog`` (its id and epoch)."""
    deliveries: Any = None
    """The producer's delivery-report callback, reset by each task."""
    runId: str = ""
    batchId: int = -1
    state: State = State.BUSY
    pool: Pool | None = None
    """The pool it returns to (one of a worker's :class:`Resources`)."""


class Pool:
    """The pooled ids of one worker process, kept in its :class:`Resources` (a forked worker
    starts with an empty pool), and the keeper thread that serves idle producers."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(6)
        self.lock = threading.RLock()
        self.entries: list[Pooled] = []
        self.counters: dict[str, int] = {}
        self.listed: dict[tuple[str, str, int], frozenset[str] | None] = {}
        self._keeper: threading.Thread | None = None
        self._stop = threading.Event()

    def startKeeper(self) -> None:
        with self.lock:
            if self._stop.is_set() or (self._keeper is not None and self._keeper.is_alive()):
                return
            self._keeper = threading.Thread(
                target=self._keep, name="twophase-kafka-keeper", daemon=True
            )
            self._keeper.start()

    def _keep(self) -> None:
        """Serve the event queues of producers no task polls (librdkafka's logs and errors)."""
        while not self._stop.wait(KEEPER_INTERVAL_SECONDS):
            with self.lock:
                producers = [
                    e.producer
                    for e in self.entries
                    if e.state is not State.BUSY and e.producer is not None
                ]
            for producer in producers:
                try:
                    producer.poll(0)
                except Exception:  # a producer being destroyed; the next round skips it
                    log.debug("kafka: keeper could not poll a pooled producer", exc_info=True)

    def close(self) -> None:
        """Stop the keeper; close the producers with nothing open and drop (never close, which
        would abort) those holding a prepared transaction: a later task takes their ids over."""
        self._stop.set()
        keeper = self._keeper
        if keeper is not None:
            keeper.join()
        with self.lock:
            entries, self.entries = self.entries, []
        for entry in entries:
            producer, entry.producer = entry.producer, None
            if producer is not None and entry.state is State.READY:
                _close(entry.transactionalId, producer)


def _pool(resources: Resources | None = None) -> Pool:
    return (resources or Resources.ofProcess()).get("kafka.pool", Pool, Pool.close)


def _poolOf(entry: Pooled) -> Pool:
    return entry.pool if entry.pool is not None else _pool()


def workerIdPrefix(prefix: str, resources: Resources | None = None) -> str:
    """``<prefix>-w<token>-``: the start of every id this worker process uses for ``prefix``."""
    return f"{prefix}-w{_pool(resources).token}-"


def acquire(
    prefix: str, key: Hashable, runId: str, batchId: int, resources: Resources | None = None
) -> tuple[Pooled, bool]:
    """An id (and producer, if alive) for a task of batch ``batchId`` of run ``runId``.

    Returns ``(entry, free)``: ``free`` when its producer is ready to begin now; otherwise the
    caller settles it (``settle``) or, with no producer, creates one for the id. Prefers ready
    producers, then prepared ones of earlier batches, then a new id. The pool is the one of
    ``resources`` (the process's unless given).
    """
    pool = _pool(resources)
    with pool.lock:
        mine = [e for e in pool.entries if e.prefix == prefix and e.key == key]
        for entry in mine:
            if entry.state is State.READY and entry.producer is not None:
                entry.state = State.BUSY
                return entry, True
        for entry in mine:
            if entry.state is State.PREPARED and (entry.runId != runId or entry.batchId < batchId):
                entry.state = State.BUSY
                return entry, False
        n = pool.counters.get(prefix, 0)
        pool.counters[prefix] = n + 1
        entry = Pooled(f"{prefix}-w{pool.token}-{n}", prefix, key, pool=pool)
        pool.entries.append(entry)
        return entry, False


def openIds(
    prefix: str,
    runId: str,
    batchId: int,
    listing: Callable[[str], list[str] | None],
    resources: Resources | None = None,
) -> frozenset[str] | None:
    """This worker's ids of ``prefix`` with an open transaction, listed once per batch.

    ``listing(idPrefix)`` asks the brokers (``None``: they cannot list). A listing made during
    batch ``batchId`` is later than every prepare of an earlier batch in this worker (a worker
    runs one task at a time), so it shows every still-open transaction a task may take over.
    """
    cacheKey = (prefix, runId, batchId)
    pool = _pool(resources)
    with pool.lock:
        if cacheKey in pool.listed:
            return pool.listed[cacheKey]
        idPrefix = f"{prefix}-w{pool.token}-"
    try:
        found = listing(idPrefix)
        result = None if found is None else frozenset(found)
    except Exception:  # the take-over by init_transactions is always safe
        log.debug("kafka: could not list this worker's open transactions", exc_info=True)
        result = None
    with pool.lock:
        pool.listed = {k: v for k, v in pool.listed.items() if k[0] != prefix}
        pool.listed[cacheKey] = result
    return result


def settle(entry: Pooled, openNow: frozenset[str] | None, timeoutSeconds: float) -> bool:
    """End the prepared transaction of ``entry``'s producer so it can begin another.

    True when the producer is ready; False when it was closed or dropped (the caller then takes
    the id over with a new producer). Only called for transactions of earlier batches, which
    the driver has committed if they were decided: ``commit_transaction`` is then a repeat (a
    no-op), and for an aborted one the broker refuses it. Open ones are undecided: aborted.
    """
    producer = entry.producer
    if producer is None:
        return False
    if openNow is not None and entry.transactionalId not in openNow:
        try:
            producer.commit_transaction(timeoutSeconds)
            return True
        except KafkaException as exc:
            log.debug(
                "kafka: %s cannot go on (%s); taking the id over",
                entry.transactionalId,
                exc.args[0] if exc.args else exc,
            )
    entry.producer = None
    if openNow is not None and entry.transactionalId in openNow:
        _close(entry.transactionalId, producer)  # aborts the undecided transaction
    return False


def _close(transactionalId: str, producer: Producer) -> None:
    try:
        producer.close()
    except Exception:  # best effort: the new producer's init_transactions fences the id
        log.debug("kafka: closing %s failed", transactionalId, exc_info=True)


def prepared(entry: Pooled, runId: str, batchId: int) -> None:
    """The task prepared a transaction with records on ``entry``: keep it for the driver."""
    pool = _poolOf(entry)
    with pool.lock:
        entry.state = State.PREPARED
        entry.runId = runId
        entry.batchId = batchId
        alive = [
            e
            for e in pool.entries
            if e.prefix == entry.prefix and e.key == entry.key and e.producer is not None
        ]
        if len(alive) > MAX_PRODUCERS:
            entry.producer = None  # dropped, not closed: the transaction stays open
    pool.startKeeper()


def ready(entry: Pooled) -> None:
    """The task ends with nothing open on ``entry``'s producer: the next task may take it."""
    pool = _poolOf(entry)
    with pool.lock:
        entry.state = State.READY if entry.producer is not None else State.PREPARED
    pool.startKeeper()


def discard(entry: Pooled) -> None:
    """Forget ``entry``'s producer (closed by the caller); the id stays for a later take-over."""
    with _poolOf(entry).lock:
        entry.producer = None
        entry.state = State.PREPARED  # whatever is left open is taken over by init_transactions
        entry.batchId = -1
        entry.runId = ""


def pooledTransactionalIds(resources: Resources | None = None) -> list[str]:
    """Ids whose producers this process keeps (for tests and diagnostics)."""
    pool = _pool(resources)
    with pool.lock:
        return sorted(e.transactionalId for e in pool.entries if e.producer is not None)
