"""Which streaming query owns a decision log (``owner.json``), and taking a log over.

A new checkpoint location means a new query id and batch ids that start again at 0, so the
log refuses a query other than its owner unless the user resets it (``twophase.resetLog``).
A log no query owns yet refuses a query whose other sink log in the same checkpoint still holds
decided batches not committed: the query was started again with another ``sinkId``, and only
the old sink can commit what it decided. Which *driver* of the owning query may write it is
:mod:`~twophase.coordinator.holding`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from twophase.coordinator import scans
from twophase.coordinator.errors import LogOwnershipError, SinkChangedError
from twophase.coordinator.paths import LOG_DIRECTORY
from twophase.coordinator.records import BatchState, LogOwner, header, isoTime, parseTime
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
    writer = body.get("twophase")
    return LogOwner(
        str(body["sinkId"]),
        str(body["queryId"]),
        parseTime(body["createdAt"]),
        writer if isinstance(writer, str) else None,
    )


def refuseMovedSink(storage: LogStorage, sinkId: str, queryId: str) -> None:
    """For a log no query owns yet: raise ``SinkChangedError`` when another sink's log in the
    same checkpoint (``<checkpointLocation>/twophase/<other id>``), owned by this query, holds
    decided batches not committed. Reads only; a log elsewhere (``twophase.logLocation``) has
    no such neighbours to ask."""
    parent, _, _ = storage.root.rpartition("/")
    if parent.rpartition("/")[2] != LOG_DIRECTORY:
        return
    try:
        entries = storage.fs.ls(parent, detail=True)
    except FileNotFoundError:
        return
    base = storage.url.rstrip("/").rpartition("/")[0]
    for entry in entries:
        name = str(entry["name"]).rstrip("/").rpartition("/")[2]
        if entry.get("type") != "directory" or name == sinkId:
            continue
        other = LogStorage(f"{base}/{name}", storage.storageOptions)
        owner = readOwner(other)
        if owner is None or owner.queryId != queryId:
            continue
        waiting = scans.outstanding(other, other.listing())
        if waiting:
            raise SinkChangedError(
                other.url,
                sinkId,
                f"this query ({queryId}) wrote through sink {owner.sinkId} before and now "
                f"starts sink {sinkId} on the same checkpoint",
                f"option sinkId={owner.sinkId}",
                [s.batchId for s in waiting],
            )


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
    if current is None:
        refuseMovedSink(storage, sinkId, queryId)
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
        **header(),
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
