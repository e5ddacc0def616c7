"""Prepared producers kept alive in their Python worker until their transaction cannot matter.

``Producer.close()`` aborts an open transaction (confluent-kafka >= 2.16), and destroying a
producer without it leaves the transaction open on the broker. So a prepared producer is never
closed: it stays in this per-process registry until this worker begins a later batch of the
same sink (by then the driver has committed the earlier one; micro-batches are sequential) or
the same transactional id again (a new ``init_transactions`` fences the old producer anyway).
Spark reuses Python workers between tasks by default, so this bounds the producers per worker
by the sink's partitions; a worker that exits simply drops them, and their transactions stay
open. A daemon thread serves the event queues of retained producers (librdkafka keeps queueing
statistics for them).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from confluent_kafka import Producer

from twophase.redaction import getLogger

log = getLogger(__name__)

KEEPER_INTERVAL_SECONDS = 1.0
"""How often the keeper thread serves the event queues of prepared producers."""


@dataclass
class Retained:
    """A producer kept for the driver, with the sink (id prefix) and batch it wrote for."""

    producer: Producer
    prefix: str
    batchId: int
    prepared: bool = False


_RETAINED: dict[str, Retained] = {}
"""Producers whose transactions may still be waiting for the driver, by transactional id."""
_RETAINED_LOCK = threading.Lock()


def retain(transactionalId: str, entry: Retained) -> None:
    """Keep ``entry`` alive; release producers this transaction makes irrelevant.

    Released: the previous producer of the same transactional id (its transaction is committed,
    or undecided and about to be fenced) and producers of earlier batches of the same sink
    (their batch is committed: Spark starts batch N only after committing N-1). Released
    producers are dropped, never closed: ``close()`` would abort, and dropping does not.
    """
    with _RETAINED_LOCK:
        stale = [
            tid
            for tid, old in _RETAINED.items()
            if tid == transactionalId
            or (old.prefix == entry.prefix and old.batchId < entry.batchId)
        ]
        for tid in stale:
            del _RETAINED[tid]
        _RETAINED[transactionalId] = entry


def markPrepared(transactionalId: str, producer: Producer) -> None:
    """The task is done with ``producer``: from now on the keeper thread serves its queue."""
    with _RETAINED_LOCK:
        entry = _RETAINED.get(transactionalId)
        if entry is not None and entry.producer is producer:
            entry.prepared = True
    _startKeeper()


_KEEPER: threading.Thread | None = None


def _startKeeper() -> None:
    global _KEEPER
    with _RETAINED_LOCK:
        if _KEEPER is not None and _KEEPER.is_alive():
            return
        _KEEPER = threading.Thread(target=_keep, name="twophase-kafka-keeper", daemon=True)
        _KEEPER.start()


def _keep() -> None:
    """Serve the event queues of prepared producers, which no task polls any more.

    librdkafka queues a statistics event every period for the application to poll; unserved,
    a retained producer's queue would grow for as long as the worker keeps it. Polling serves
    no delivery report (all were served before ``preCommit`` returned) and ends nothing.
    """
    while True:
        time.sleep(KEEPER_INTERVAL_SECONDS)
        with _RETAINED_LOCK:
            producers = [e.producer for e in _RETAINED.values() if e.prepared]
        for producer in producers:
            try:
                producer.poll(0)
            except Exception:  # a producer being destroyed; the next round skips it
                log.debug("kafka: keeper could not poll a retained producer", exc_info=True)


def release(transactionalId: str, producer: Producer) -> None:
    """Forget ``producer`` (its transaction was aborted on the executor)."""
    with _RETAINED_LOCK:
        entry = _RETAINED.get(transactionalId)
        if entry is not None and entry.producer is producer:
            del _RETAINED[transactionalId]


def retainedTransactionalIds() -> list[str]:
    """Transactional ids whose producers this process keeps (for tests and diagnostics)."""
    with _RETAINED_LOCK:
        return sorted(_RETAINED)
