"""The decision log's scans over one listing: outstanding decisions, last decided, status, pruning.

Each takes one directory listing and reads only the records it must return (normally none):
these bulk scans trust a committed record by its (non-empty) name, while a batch's state read
for its own sake verifies every record it reads (:mod:`~twophase.coordinator.reading`).
"""

from __future__ import annotations

from typing import Any

from twophase.coordinator.reading import readState
from twophase.coordinator.records import BatchState, BatchStatus, LogOwner, isoTime
from twophase.coordinator.runs import RUNS_KEPT
from twophase.coordinator.storage import Listing, LogStorage
from twophase.redaction import getLogger

log = getLogger(__name__)

DECIDED_OR_COMMITTED = frozenset({BatchStatus.DECIDED, BatchStatus.COMMITTED})


def outstanding(storage: LogStorage, listing: Listing) -> list[BatchState]:
    """Decided batches not yet marked committed, oldest first."""
    found: list[BatchState] = []
    for batchId, paths in sorted(listing.records.items()):
        if BatchStatus.DECIDED in paths and BatchStatus.COMMITTED not in paths:
            wanted = (BatchStatus.DECIDED, BatchStatus.REWRITE)
            state = readState(storage, batchId, {k: v for k, v in paths.items() if k in wanted})
            if state is not None and state.status is BatchStatus.DECIDED:
                found.append(state)
    return found


def committedBatchIds(listing: Listing) -> list[int]:
    """Ids of the committed batches still in the log (not pruned), ascending."""
    records = listing.records
    return sorted(b for b, paths in records.items() if BatchStatus.COMMITTED in paths)


def lastDecided(storage: LogStorage, listing: Listing) -> int | None:
    """The highest batch id that is decided or committed, or ``None``; its record verified."""
    records = listing.records
    for batchId in sorted(records, reverse=True):
        paths = records[batchId]
        if not paths.keys() & DECIDED_OR_COMMITTED:
            continue
        state = readState(storage, batchId, paths)
        if state is not None and state.isDecided:
            return batchId
    return None


def status(storage: LogStorage, listing: Listing, owner: LogOwner | None) -> dict[str, Any]:
    """A JSON-ready summary for ``twophase status``: counts, last batches, outstanding."""
    records = listing.records
    committed = sorted(b for b, p in records.items() if BatchStatus.COMMITTED in p)
    aborted = sorted(
        b for b, p in records.items() if BatchStatus.ABORTED in p and BatchStatus.DECIDED not in p
    )
    return {
        "url": storage.url,
        "owner": None
        if owner is None
        else {
            "sinkId": owner.sinkId,
            "queryId": owner.queryId,
            "createdAt": isoTime(owner.createdAt),
        },
        "committedBatches": len(committed),
        "lastCommitted": committed[-1] if committed else None,
        "abortedBatches": len(aborted),
        "lastDecided": lastDecided(storage, listing),
        "outstanding": [s.toJson() for s in outstanding(storage, listing)],
    }


def prune(storage: LogStorage, listing: Listing, retainBatches: int, tmpGraceSeconds: float) -> int:
    """Remove records of finished batches older than the newest ``retainBatches`` finished.

    Finished means committed, or aborted and not decided since; a decided batch that is not
    committed is never touched. A batch with nothing but a ``recovery(N)`` record (the query
    stopped before N was decided or aborted, and ran other batches since) goes once it is older
    than the newest batch pruned. Runs beyond the newest ``RUNS_KEPT`` go, and temporary files
    older than ``tmpGraceSeconds``.
    Returns the number of files removed.
    """
    finished = sorted(
        (
            b
            for b, p in listing.records.items()
            if BatchStatus.COMMITTED in p
            or (BatchStatus.ABORTED in p and BatchStatus.DECIDED not in p)
        ),
        reverse=True,
    )
    doomed = [path for b in finished[retainBatches:] for path in listing.pathsOf(b)]
    if len(finished) > retainBatches:
        cut = finished[retainBatches]
        doomed += [
            path
            for b, p in listing.records.items()
            if b < cut and p.keys() == {BatchStatus.RECOVERY}
            for path in p.values()
        ]
    doomed += [listing.runs[e] for e in sorted(listing.runs, reverse=True)[RUNS_KEPT:]]
    doomed += [
        path for path, age in listing.temporary if age is not None and age >= tmpGraceSeconds
    ]
    if doomed:
        storage.remove(doomed, what=f"{len(doomed)} pruned file(s)")
        log.debug("decision log %s: pruned %d files", storage.url, len(doomed))
    return len(doomed)
