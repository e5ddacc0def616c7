"""The durable decision log of one sink: which batches are decided, committed or aborted.

Layout, in one directory reached through fsspec (local disk, ``file://``, HDFS, object stores,
``memory://``), by default ``<checkpointLocation>/twophase/<sinkId>/``::

    owner.json                                  sinkId, queryId, createdAt
    run-0000000003.json                         a driver's claim: epoch, driver, claimedAt
    batch-00000000000000000007.decided.json     queryId, epoch, handles (partition, attempt, ...)
    batch-00000000000000000008.decided.json     or a fence: a newer run took the log here ...
    batch-00000000000000000008.decided-0000000003.json   ... and decided one link further
    batch-00000000000000000007.rewrite.json     lost partitions, the replay's handles for them
    batch-00000000000000000007.committed.json   commitSeconds and the commit's figures
    batch-00000000000000000008.aborted.json
    batch-00000000000000000008.recovery.json    what the recovery before batch 8 did, if anything

One small indented JSON file per state change, each published atomically and carrying
``format``, ``twophase`` (the version that wrote it) and ``checksum`` (sha256 of its canonical
body), so a torn or garbage file is never taken for a record: it is ignored with a WARNING
(:mod:`~twophase.coordinator.storage`); one of a newer format stops its reader
(:mod:`~twophase.coordinator.formats`). Temporary files are
ignored and removed by ``prune`` once they are old.

States of batch N: ``decided(N, handles) -> committed(N)``, or ``aborted(N)``; Spark may replay
an aborted batch, so a later ``decided(N)`` overrides ``aborted(N)``. ``aborted(N)`` is refused
once N is decided. The state of N is therefore: committed if a committed record exists, else
decided if its decision slot ends in a decision (:mod:`~twophase.coordinator.slots`), else
aborted. A ``rewrite(N)`` record beside a decision
names the partitions whose decided transactions the participant aborted by itself (Kafka's
transaction timeout) and the replay's handles that replace them; each new one replaces the last.
The records also carry figures for operators that the protocol never reads
(:mod:`~twophase.coordinator.figures`), and ``recovery(N)`` holds nothing but such figures.

``DecisionLog`` owns who may write the log (``claim``) and each state change, checked against
the state before; a batch's state is read by :mod:`~twophase.coordinator.reading`, and
``outstanding``, ``lastDecided``, ``status`` and ``prune`` are scans of one directory listing
that read only the records they must return (:mod:`~twophase.coordinator.scans`). No cache:
several processes (Spark's driver-side Python workers, executors) read the same log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from twophase.coordinator import ownership, scans, slots
from twophase.coordinator.errors import DecisionConflictError, LogOwnershipError
from twophase.coordinator.figures import (
    RECOVERY_RUNS_KEPT,
    AbortFigures,
    BatchFigures,
    CommitFigures,
    readFigures,
)
from twophase.coordinator.paths import logLocationFor
from twophase.coordinator.reading import readState
from twophase.coordinator.records import (
    BatchState,
    BatchStatus,
    LoggedHandle,
    LogOwner,
    header,
    isoTime,
    recordName,
)
from twophase.coordinator.runs import RunRecords
from twophase.coordinator.storage import CorruptRecord, LogStorage
from twophase.protocol import TaskResult
from twophase.redaction import getLogger

log = getLogger(__name__)


class DecisionLog:
    """A durable per-sink transaction log; every record is created atomically, never torn.

    Parameters
    ----------
    url:
        The log directory: a local path or any fsspec URL (``file://``, ``hdfs://``, ``s3://``,
        ``memory://``). Created on the first write, so read-only users (executors) never
        create it.
    storageOptions:
        Keyword arguments for the fsspec filesystem (credentials, endpoints).

    The object pickles as its URL and options, so it can travel to executors.
    """

    def __init__(
        self,
        url: str,
        storageOptions: Mapping[str, Any] | None = None,
        *,
        unfenced: bool = False,
    ) -> None:
        self._url = url
        self._storageOptions = dict(storageOptions or {})
        self._unfenced = unfenced
        self._storage = LogStorage(url, self._storageOptions, unfenced=unfenced)
        self.runs = RunRecords(self._storage)
        """The runs that claimed the log (:mod:`~twophase.coordinator.runs`)."""

    @classmethod
    def forCheckpoint(
        cls,
        checkpointLocation: str,
        sinkId: str,
        storageOptions: Mapping[str, Any] | None = None,
    ) -> DecisionLog:
        """The log of ``sinkId`` in its default place: ``<checkpointLocation>/twophase/<sinkId>``.

        ``sinkId`` must be usable as one path segment.
        """
        return cls(logLocationFor(checkpointLocation, sinkId), storageOptions)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self._url,
            "storageOptions": self._storageOptions,
            "unfenced": self._unfenced,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["url"], state["storageOptions"], unfenced=state.get("unfenced", False)
        )

    def __repr__(self) -> str:
        return f"DecisionLog({self._url!r})"

    @property
    def url(self) -> str:
        return self._url

    # ------------------------------------------------------------------ ownership

    def owner(self) -> LogOwner | None:
        """The query that owns the log, or ``None`` (new log, or unreadable ``owner.json``)."""
        return ownership.readOwner(self._storage)

    def refuseOtherQuery(self, sinkId: str, queryId: str) -> None:
        """Raise ``LogOwnershipError`` if another query owns the log, ``SinkChangedError`` if
        no query does yet and this query's log of another sink id waits for its commits,
        ``LogFormatError`` if a newer twophase wrote ``owner.json``; writes nothing."""
        current = self.owner()
        if current is None:
            ownership.refuseMovedSink(self._storage, sinkId, queryId)
        elif (current.queryId, current.sinkId) != (queryId, sinkId):
            raise LogOwnershipError(self._url, sinkId, current.queryId, queryId)

    def claim(self, sinkId: str, queryId: str, reset: bool = False) -> LogOwner:
        """Make ``queryId`` the owner of the log; refuses a log owned by another query.

        Idempotent for the owning query. With ``reset=True`` a log of another query is cleared
        and taken over, but only when no decided batch is still waiting for its commit (the
        coordinator's ``claim`` commits those first); ``reset`` does nothing to a log the query
        already owns, so leaving the option on is harmless.
        """
        return ownership.claim(self._storage, sinkId, queryId, reset, self.outstanding)

    # ------------------------------------------------------------------ state changes

    def decide(
        self,
        batchId: int,
        results: Sequence[TaskResult],
        *,
        queryId: str | None = None,
        epoch: int | None = None,
    ) -> BatchState:
        """Durably decide to commit batch N with the handles of ``results``; the commit point.

        Exclusive: if N is already decided the existing decision holds and is returned (a
        decision is never replaced), so callers must commit the handles of the returned state.
        ``epoch`` is the deciding run (:mod:`~twophase.coordinator.runs`): a fence or decision
        of a newer run in N's slot raises ``SlotFenced`` instead. Results without a handle
        (tasks that wrote nothing) are left out; duplicates collapse. The record also carries
        the logged handles' Arrow bytes and the slowest task's prepare time (figures).
        """
        entries: dict[str, LoggedHandle] = {}
        reported: dict[str, TaskResult] = {}
        for result in results:
            if result.handle is not None:
                entry = LoggedHandle.fromResult(result)
                entries.setdefault(entry.key, entry)
                reported.setdefault(entry.key, result)
        timed = [r.seconds for r in reported.values() if r.seconds is not None]
        if queryId is None and results:
            queryId = results[0].queryId
        now = datetime.now(UTC)
        body = {
            **header(),
            "batchId": batchId,
            "state": str(BatchStatus.DECIDED),
            "queryId": queryId,
            "decidedAt": isoTime(now),
            "rows": sum(e.rows for e in entries.values()),
            "bytes": sum(r.bytes for r in reported.values()),
            "tasks": len(results),
            "handles": [e.toJson() for e in entries.values()],
        }
        if timed:
            body["prepareSeconds"] = round(max(timed), 6)
        if epoch is not None:
            body["epoch"] = epoch
        first = slots.decide(
            self._storage, batchId, body, epoch, what=f"the decision of batch {batchId}"
        )
        if first is not None:
            other = first.get("epoch")
            if isinstance(other, int) and other > (epoch or 0):
                raise slots.SlotFenced(batchId, other)
            existing = self.state(batchId)
            if existing is not None and existing.isDecided:
                if existing.handleKeys != frozenset(entries):
                    log.warning(
                        "decision log %s: batch %d was already decided with other handles; "
                        "the existing decision holds",
                        self._url,
                        batchId,
                    )
                return existing
        return BatchState(
            batchId,
            BatchStatus.DECIDED,
            tuple(entries.values()),
            queryId=queryId,
            epoch=epoch,
            decidedAt=now,
        )

    def fence(self, batchId: int, epoch: int) -> bool:
        """Stop every run older than ``epoch`` from deciding batch N (``slots.fence``); False
        when N was decided first."""
        return slots.fence(self._storage, batchId, epoch)

    def recordRewrite(
        self, batchId: int, lost: Sequence[int], replacements: Sequence[LoggedHandle]
    ) -> None:
        """Record which partitions of decided N were lost and which replay handles replace them.

        Replaces the previous rewrite record of N atomically (the caller passes the whole new
        state). Refused unless N is decided: only a decision's transactions can be lost.
        """
        self._requireDecided(batchId, "record lost partitions of")
        body = {
            **header(),
            "batchId": batchId,
            "state": str(BatchStatus.REWRITE),
            "updatedAt": isoTime(datetime.now(UTC)),
            "lost": sorted(set(lost)),
            "replacements": [h.toJson() for h in replacements],
        }
        self._storage.publish(
            recordName(batchId, BatchStatus.REWRITE),
            body,
            exclusive=False,
            what=f"the rewrite record (lost partitions {body['lost']}) of batch {batchId}",
        )

    def markCommitted(
        self, batchId: int, commitSeconds: float, figures: CommitFigures | None = None
    ) -> None:
        """Record that every handle of decided batch N is committed. Idempotent.

        ``figures`` (who committed, how many handles, retries, the decision's write time) are
        kept in the record for operators; writing the mark again with new figures is safe.
        """
        self._requireDecided(batchId, "mark committed")
        body = {
            **header(),
            "batchId": batchId,
            "state": str(BatchStatus.COMMITTED),
            "committedAt": isoTime(datetime.now(UTC)),
            "commitSeconds": round(commitSeconds, 6),
            **(figures.toJson() if figures is not None else {}),
        }
        self._storage.publish(
            recordName(batchId, BatchStatus.COMMITTED),
            body,
            exclusive=False,
            what=f"the committed mark of batch {batchId}",
        )

    def _requireDecided(self, batchId: int, what: str) -> None:
        if BatchStatus.DECIDED not in self._storage.listing().records.get(batchId, {}):
            raise DecisionConflictError(
                f"decision log {self._url}: cannot {what} batch {batchId}, it was never decided"
            )

    def markAborted(self, batchId: int, figures: AbortFigures | None = None) -> None:
        """Record that undecided batch N was aborted; refused once N is decided. Idempotent."""
        paths = self._storage.listing().records.get(batchId, {})
        state = readState(self._storage, batchId, paths) if BatchStatus.DECIDED in paths else None
        if state is not None and state.isDecided:  # a fence alone decides nothing
            raise DecisionConflictError(
                f"decision log {self._url}: batch {batchId} is decided; a decided batch is "
                "rolled forward, never aborted"
            )
        body = {
            **header(),
            "batchId": batchId,
            "state": str(BatchStatus.ABORTED),
            "abortedAt": isoTime(datetime.now(UTC)),
            **(figures.toJson() if figures is not None else {}),
        }
        self._storage.publish(
            recordName(batchId, BatchStatus.ABORTED),
            body,
            exclusive=False,
            what=f"the aborted mark of batch {batchId}",
        )

    def recordRecovery(self, batchId: int, entry: Mapping[str, Any]) -> None:
        """Add what a recovery before batch N did to ``recovery(N)`` (figures for operators).

        Called only when the recovery did something. Keeps the newest ``RECOVERY_RUNS_KEPT``
        entries of the recoveries before N (a query that keeps failing before N runs).
        """
        path = self._storage.listing().records.get(batchId, {}).get(BatchStatus.RECOVERY)
        runs: list[Any] = []
        if path is not None:
            try:
                earlier = self._storage.readRecord(path).get("runs")
                runs = list(earlier) if isinstance(earlier, list) else []
            except (FileNotFoundError, CorruptRecord):
                runs = []
        body = {
            **header(),
            "batchId": batchId,
            "state": str(BatchStatus.RECOVERY),
            "runs": [*runs, dict(entry)][-RECOVERY_RUNS_KEPT:],
        }
        self._storage.publish(
            recordName(batchId, BatchStatus.RECOVERY),
            body,
            exclusive=False,
            what=f"the recovery record of batch {batchId}",
        )

    # ------------------------------------------------------------------ queries

    def state(self, batchId: int) -> BatchState | None:
        """The last complete state of batch N, or ``None`` if the log knows nothing of N."""
        return readState(self._storage, batchId, self._storage.listing().records.get(batchId, {}))

    def isDecided(self, batchId: int) -> bool:
        """True if N is decided or committed: its tasks must not write it again."""
        state = self.state(batchId)
        return state is not None and state.isDecided

    def figures(self, batchId: int) -> BatchFigures | None:
        """What the log recorded of batch N for operators, or ``None`` if it has no state."""
        paths = self._storage.listing().records.get(batchId, {})
        return readFigures(self._storage, batchId, paths)

    def recentFigures(self, count: int) -> list[BatchFigures]:
        """The figures of the newest ``count`` batches that have a state, oldest first."""
        records = self._storage.listing().records
        found: list[BatchFigures] = []
        for batchId in sorted(records, reverse=True):
            if len(found) >= count:
                break
            figures = readFigures(self._storage, batchId, records[batchId])
            if figures is not None:
                found.append(figures)
        return found[::-1]

    def outstanding(self) -> list[BatchState]:
        """Decided batches not yet marked committed, oldest first (one listing)."""
        return scans.outstanding(self._storage, self._storage.listing())

    def pending(self) -> tuple[list[BatchState], int | None]:
        """``outstanding()`` and the newest run's epoch, from one listing."""
        listing = self._storage.listing()
        return scans.outstanding(self._storage, listing), max(listing.runs, default=None)

    def committedBatchIds(self) -> list[int]:
        """Ids of the committed batches still in the log (not pruned), ascending; one listing."""
        return scans.committedBatchIds(self._storage.listing())

    def lastDecided(self) -> int | None:
        """The highest batch id that is decided or committed, or ``None``; verified.

        Tasks of batches up to it write nothing, so the candidate's record is read and checked
        (one listing, normally one or two reads): an unreadable record never counts.
        """
        return scans.lastDecided(self._storage, self._storage.listing())

    def status(self) -> dict[str, Any]:
        """A JSON-ready summary for ``twophase status``: counts, last batches, outstanding, and
        the run that holds the log."""
        listing = self._storage.listing()
        summary = scans.status(self._storage, listing, self.owner())
        newest = max(listing.runs, default=None)
        run = None if newest is None else self.runs.read(newest)
        if run is not None:
            summary["run"] = run.toJson()
        else:  # no run yet, or its record unreadable
            summary["run"] = None if newest is None else {"epoch": newest}
        return summary

    # ------------------------------------------------------------------ housekeeping

    def prune(self, retainBatches: int, *, tmpGraceSeconds: float = 3600.0) -> int:
        """Remove records of finished batches older than the newest ``retainBatches`` finished.

        Finished means committed, or aborted and not decided since. A decided batch that is not
        committed is never touched, however old. Temporary files older than
        ``tmpGraceSeconds`` (debris of a crashed writer) are removed too. Returns the number
        of files removed.
        """
        if retainBatches < 0:
            raise ValueError("retainBatches must be >= 0")
        return scans.prune(self._storage, self._storage.listing(), retainBatches, tmpGraceSeconds)
