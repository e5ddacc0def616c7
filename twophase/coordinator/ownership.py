"""Which streaming query owns a decision log (``owner.json``), and taking a log over.

A new checkpoint location means a new query id and batch ids that start again at 0, so the
log refuses a query other than its owner unless the user resets it (``twophase.resetLog``).
Which *driver* of the owning query may write it is :mod:`~twophase.coordinator.holding`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from twophase.coordinator.errors import LogOwnershipError
from twophase.coordinator.records import FORMAT, BatchState, LogOwner, isoTime, parseTime
from twophase.coordinator.storage import CorruptRecord, LogStorage
from twophase.redaction import getLogger

log = getLogger(__name__)

OWNER_FILE = "owner.json"


def readOwner(storage: LogStorage) -> LogOwner | None:
    """The query that owns the log, or ``None`` (new log, or unreadable ``owner.json``)."""
    try:
        body = storage.readRecord(storage.path(OWNER_FILE))
    except FileNotFoundError:
        return None
    except CorruptRecord as exc:
        log.warning("decision log %s: ignoring %s: %s", storage.url, OWNER_FILE, exc)
        return None
    return LogOwner(str(body["sinkId"]), str(body["queryId"]), parseTime(body["createdAt"]))


def claim(
    storage: LogStorage,
    sinkId: str,
    queryId: str,
    reset: bool,
    outstanding: Callable[[], list[BatchState]],
) -> LogOwner:
    """``DecisionLog.claim``: ``outstanding`` lists the decided batches a reset must wait for."""
    current = readOwner(storage)
    if current is not None and (current.queryId, current.sinkId) == (queryId, sinkId):
        return current
    if current is not None and not reset:
        raise LogOwnershipError(storage.url, sinkId, current.queryId, queryId)
    if current is not None:
        waiting = outstanding()
        if waiting:
            raise LogOwnershipError(
                storage.url,
                sinkId,
                current.queryId,
                queryId,
                detail="Cannot reset yet: batches "
                f"{', '.join(str(s.batchId) for s in waiting)} are decided but not "
                "committed; the coordinator commits them before a reset.",
            )
        removed = storage.clear(what=f"the records of query {current.queryId} (twophase.resetLog)")
        log.warning(
            "twophase sink %s: reset decision log %s of query %s for query %s (%d records removed)",
            sinkId,
            storage.url,
            current.queryId,
            queryId,
            removed,
        )
    claimed = LogOwner(sinkId, queryId, datetime.now(UTC))
    body = {
        "format": FORMAT,
        "sinkId": sinkId,
        "queryId": queryId,
        "createdAt": isoTime(claimed.createdAt),
    }
    what = f"the owner record ({OWNER_FILE}) of query {queryId}"
    try:
        # Exclusive only for a fresh log: two first starts racing must not both win.
        storage.publish(OWNER_FILE, body, exclusive=current is None, what=what)
    except FileExistsError:
        winner = readOwner(storage)
        if winner is None:  # an unreadable owner.json: nobody can own the log through it
            storage.publish(OWNER_FILE, body, exclusive=False, what=what)
            return claimed
        if (winner.queryId, winner.sinkId) != (queryId, sinkId):
            raise LogOwnershipError(storage.url, sinkId, winner.queryId, queryId) from None
        return winner
    return claimed
