"""The durable decision log of one sink: which batches are decided, committed or aborted.

Layout, in one directory reached through fsspec (local disk, ``file://``, HDFS, object stores,
``memory://``), by default ``<checkpointLocation>/twophase/<sinkId>/``::

    owner.json                                  sinkId, queryId, createdAt
    batch-00000000000000000007.decided.json     queryId, handles (partition, attempt, rows, handle)
    batch-00000000000000000007.rewrite.json     lost partitions, the replay's handles for them
    batch-00000000000000000007.committed.json   commitSeconds
    batch-00000000000000000008.aborted.json

One small indented JSON file per state change, each published atomically: written under a
``_tmp-<uuid>.json`` name in the same directory, flushed (and fsynced on local disk), then
renamed to its final name (a hard link, which fails instead of overwriting, where a decision
must not replace another). Every record carries ``checksum`` (sha256 of its canonical body): a
torn or garbage file is never taken for a record, it is ignored with a WARNING. Temporary files
are ignored and removed by ``prune`` once they are old.

States of batch N: ``decided(N, handles) -> committed(N)``, or ``aborted(N)``; Spark may replay
an aborted batch, so a later ``decided(N)`` overrides ``aborted(N)``. ``aborted(N)`` is refused
once N is decided. The state of N is therefore: committed if a committed record exists, else
decided if a decided record exists, else aborted. A ``rewrite(N)`` record beside a decision
names the partitions whose decided transactions the participant aborted by itself (Kafka's
transaction timeout) and the replay's handles that replace them; each new one replaces the last.

Cost: ``outstanding``, ``lastDecided`` and ``prune`` take one directory listing and read only
the records they must return (normally none); those bulk scans trust a committed record by its
(non-empty) name, while ``state`` verifies every record it reads. No cache: several processes
(Spark's driver-side Python workers, executors) read the same log.
"""

from __future__ import annotations

import errno
import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import fsspec.core
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from twophase.coordinator.errors import DecisionConflictError, LogOwnershipError
from twophase.coordinator.paths import logLocationFor
from twophase.coordinator.records import (
    FORMAT,
    RECORD_NAME,
    BatchState,
    BatchStatus,
    LoggedHandle,
    LogOwner,
    checksum,
    isoTime,
    parseTime,
    parseTimeOrNone,
    recordName,
)
from twophase.protocol import TaskResult
from twophase.redaction import getLogger

log = getLogger(__name__)

OWNER_FILE = "owner.json"
TMP_PREFIX = "_tmp-"

_DECIDED_OR_COMMITTED = frozenset({BatchStatus.DECIDED, BatchStatus.COMMITTED})


class _CorruptRecord(Exception):
    """A file under a record's name that is not a complete record."""


@dataclass
class _Listing:
    records: dict[int, dict[BatchStatus, str]] = field(default_factory=dict)
    temporary: list[tuple[str, float | None]] = field(default_factory=list)


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

    def __init__(self, url: str, storageOptions: Mapping[str, Any] | None = None) -> None:
        self._url = url
        self._storageOptions = dict(storageOptions or {})
        fs, root = fsspec.core.url_to_fs(url, **self._storageOptions)
        self._fs: AbstractFileSystem = fs
        self._root: str = root.rstrip("/") or root
        self._local = isinstance(fs, LocalFileSystem)
        self._madeRoot = False

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
        return {"url": self._url, "storageOptions": self._storageOptions}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["storageOptions"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"DecisionLog({self._url!r})"

    @property
    def url(self) -> str:
        return self._url

    # ------------------------------------------------------------------ ownership

    def owner(self) -> LogOwner | None:
        """The query that owns the log, or ``None`` (new log, or unreadable ``owner.json``)."""
        try:
            body = self._readRecord(self._path(OWNER_FILE))
        except FileNotFoundError:
            return None
        except _CorruptRecord as exc:
            log.warning("decision log %s: ignoring %s: %s", self._url, OWNER_FILE, exc)
            return None
        return LogOwner(str(body["sinkId"]), str(body["queryId"]), parseTime(body["createdAt"]))

    def claim(self, sinkId: str, queryId: str, reset: bool = False) -> LogOwner:
        """Make ``queryId`` the owner of the log; refuses a log owned by another query.

        Idempotent for the owning query. With ``reset=True`` a log of another query is cleared
        and taken over, but only when no decided batch is still waiting for its commit (the
        coordinator's ``claim`` commits those first); ``reset`` does nothing to a log the query
        already owns, so leaving the option on is harmless.
        """
        current = self.owner()
        if current is not None and (current.queryId, current.sinkId) == (queryId, sinkId):
            return current
        if current is not None and not reset:
            raise LogOwnershipError(self._url, sinkId, current.queryId, queryId)
        if current is not None:
            waiting = self.outstanding()
            if waiting:
                raise LogOwnershipError(
                    self._url,
                    sinkId,
                    current.queryId,
                    queryId,
                    detail="Cannot reset yet: batches "
                    f"{', '.join(str(s.batchId) for s in waiting)} are decided but not "
                    "committed; the coordinator commits them before a reset.",
                )
            removed = self._clear()
            log.warning(
                "twophase sink %s: reset decision log %s of query %s for query %s "
                "(%d records removed)",
                sinkId,
                self._url,
                current.queryId,
                queryId,
                removed,
            )
        owner = LogOwner(sinkId, queryId, datetime.now(UTC))
        body = {
            "format": FORMAT,
            "sinkId": sinkId,
            "queryId": queryId,
            "createdAt": isoTime(owner.createdAt),
        }
        try:
            # Exclusive only for a fresh log: two first starts racing must not both win.
            self._publish(OWNER_FILE, body, exclusive=current is None)
        except FileExistsError:
            winner = self.owner()
            if winner is None:  # an unreadable owner.json: nobody can own the log through it
                self._publish(OWNER_FILE, body, exclusive=False)
                return owner
            if (winner.queryId, winner.sinkId) != (queryId, sinkId):
                raise LogOwnershipError(self._url, sinkId, winner.queryId, queryId) from None
            return winner
        return owner

    # ------------------------------------------------------------------ state changes

    def decide(
        self, batchId: int, results: Sequence[TaskResult], *, queryId: str | None = None
    ) -> BatchState:
        """Durably decide to commit batch N with the handles of ``results``; the commit point.

        Exclusive: if N is already decided the existing decision holds and is returned (a
        decision is never replaced), so callers must commit the handles of the returned state.
        Results without a handle (tasks that wrote nothing) are left out; duplicates collapse.
        """
        entries: dict[str, LoggedHandle] = {}
        for result in results:
            if result.handle is not None:
                entry = LoggedHandle.fromResult(result)
                entries.setdefault(entry.key, entry)
        if queryId is None and results:
            queryId = results[0].queryId
        now = datetime.now(UTC)
        body = {
            "format": FORMAT,
            "batchId": batchId,
            "state": str(BatchStatus.DECIDED),
            "queryId": queryId,
            "decidedAt": isoTime(now),
            "rows": sum(e.rows for e in entries.values()),
            "handles": [e.toJson() for e in entries.values()],
        }
        name = recordName(batchId, BatchStatus.DECIDED)
        try:
            self._publish(name, body, exclusive=True)
        except FileExistsError:
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
            log.warning(
                "decision log %s: replacing an unreadable decision record of batch %d",
                self._url,
                batchId,
            )
            self._publish(name, body, exclusive=False)
        return BatchState(
            batchId,
            BatchStatus.DECIDED,
            tuple(entries.values()),
            queryId=queryId,
            decidedAt=now,
        )

    def recordRewrite(
        self, batchId: int, lost: Sequence[int], replacements: Sequence[LoggedHandle]
    ) -> None:
        """Record which partitions of decided N were lost and which replay handles replace them.

        Replaces the previous rewrite record of N atomically (the caller passes the whole new
        state). Refused unless N is decided: only a decision's transactions can be lost.
        """
        self._requireDecided(batchId, "record lost partitions of")
        body = {
            "format": FORMAT,
            "batchId": batchId,
            "state": str(BatchStatus.REWRITE),
            "updatedAt": isoTime(datetime.now(UTC)),
            "lost": sorted(set(lost)),
            "replacements": [h.toJson() for h in replacements],
        }
        self._publish(recordName(batchId, BatchStatus.REWRITE), body, exclusive=False)

    def markCommitted(self, batchId: int, commitSeconds: float) -> None:
        """Record that every handle of decided batch N is committed. Idempotent."""
        self._requireDecided(batchId, "mark committed")
        body = {
            "format": FORMAT,
            "batchId": batchId,
            "state": str(BatchStatus.COMMITTED),
            "committedAt": isoTime(datetime.now(UTC)),
            "commitSeconds": round(commitSeconds, 6),
        }
        self._publish(recordName(batchId, BatchStatus.COMMITTED), body, exclusive=False)

    def _requireDecided(self, batchId: int, what: str) -> None:
        if BatchStatus.DECIDED not in self._list().records.get(batchId, {}):
            raise DecisionConflictError(
                f"decision log {self._url}: cannot {what} batch {batchId}, it was never decided"
            )

    def markAborted(self, batchId: int) -> None:
        """Record that undecided batch N was aborted; refused once N is decided. Idempotent."""
        if BatchStatus.DECIDED in self._list().records.get(batchId, {}):
            raise DecisionConflictError(
                f"decision log {self._url}: batch {batchId} is decided; a decided batch is "
                "rolled forward, never aborted"
            )
        body = {
            "format": FORMAT,
            "batchId": batchId,
            "state": str(BatchStatus.ABORTED),
            "abortedAt": isoTime(datetime.now(UTC)),
        }
        self._publish(recordName(batchId, BatchStatus.ABORTED), body, exclusive=False)

    # ------------------------------------------------------------------ queries

    def state(self, batchId: int) -> BatchState | None:
        """The last complete state of batch N, or ``None`` if the log knows nothing of N."""
        return self._readState(batchId, self._list().records.get(batchId, {}))

    def isDecided(self, batchId: int) -> bool:
        """True if N is decided or committed: its tasks must not write it again."""
        state = self.state(batchId)
        return state is not None and state.isDecided

    def outstanding(self) -> list[BatchState]:
        """Decided batches not yet marked committed, oldest first (one listing)."""
        return self._outstanding(self._list())

    def _outstanding(self, listing: _Listing) -> list[BatchState]:
        found: list[BatchState] = []
        for batchId, paths in sorted(listing.records.items()):
            if BatchStatus.DECIDED in paths and BatchStatus.COMMITTED not in paths:
                wanted = (BatchStatus.DECIDED, BatchStatus.REWRITE)
                state = self._readState(batchId, {k: v for k, v in paths.items() if k in wanted})
                if state is not None and state.status is BatchStatus.DECIDED:
                    found.append(state)
        return found

    def committedBatchIds(self) -> list[int]:
        """Ids of the committed batches still in the log (not pruned), ascending; one listing."""
        records = self._list().records
        return sorted(b for b, paths in records.items() if BatchStatus.COMMITTED in paths)

    def lastDecided(self) -> int | None:
        """The highest batch id that is decided or committed, or ``None``; verified.

        Tasks of batches up to it write nothing, so the candidate's record is read and checked
        (one listing, normally one or two reads): an unreadable record never counts.
        """
        records = self._list().records
        for batchId in sorted(records, reverse=True):
            paths = records[batchId]
            if not paths.keys() & _DECIDED_OR_COMMITTED:
                continue
            state = self._readState(batchId, paths)
            if state is not None and state.isDecided:
                return batchId
        return None

    def status(self) -> dict[str, Any]:
        """A JSON-ready summary for ``twophase status``: counts, last batches, outstanding."""
        listing = self._list()
        records = listing.records
        committed = sorted(b for b, p in records.items() if BatchStatus.COMMITTED in p)
        aborted = sorted(
            b
            for b, p in records.items()
            if BatchStatus.ABORTED in p and BatchStatus.DECIDED not in p
        )
        owner = self.owner()
        return {
            "url": self._url,
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
            "lastDecided": max(
                (b for b, p in records.items() if p.keys() & _DECIDED_OR_COMMITTED), default=None
            ),
            "outstanding": [s.toJson() for s in self._outstanding(listing)],
        }

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
        listing = self._list()
        finished = sorted(
            (
                b
                for b, p in listing.records.items()
                if BatchStatus.COMMITTED in p
                or (BatchStatus.ABORTED in p and BatchStatus.DECIDED not in p)
            ),
            reverse=True,
        )
        doomed = [path for b in finished[retainBatches:] for path in listing.records[b].values()]
        doomed += [
            path for path, age in listing.temporary if age is not None and age >= tmpGraceSeconds
        ]
        if doomed:
            self._fs.rm(doomed)
            log.debug("decision log %s: pruned %d files", self._url, len(doomed))
        return len(doomed)

    # ------------------------------------------------------------------ internals

    def _path(self, name: str) -> str:
        return f"{self._root}/{name}"

    def _list(self) -> _Listing:
        listing = _Listing()
        self._fs.invalidate_cache(self._root)
        try:
            entries = self._fs.ls(self._root, detail=True)
        except FileNotFoundError:
            return listing
        now = time.time()
        for entry in entries:
            path = str(entry["name"])
            name = path.rstrip("/").rsplit("/", 1)[-1]
            if entry.get("type") == "directory":
                continue
            if name.startswith(TMP_PREFIX):
                listing.temporary.append((path, _ageSeconds(entry, now)))
                continue
            match = RECORD_NAME.match(name)
            if match is None:
                continue
            if entry.get("size") == 0:
                log.warning("decision log %s: ignoring empty record %s", self._url, name)
                continue
            batchId, status = int(match.group(1)), BatchStatus(match.group(2))
            listing.records.setdefault(batchId, {})[status] = path
        return listing

    def _readState(self, batchId: int, paths: Mapping[BatchStatus, str]) -> BatchState | None:
        bodies: dict[BatchStatus, dict[str, Any]] = {}
        for status in (BatchStatus.COMMITTED, BatchStatus.DECIDED, BatchStatus.ABORTED):
            if status not in paths or (status is BatchStatus.ABORTED and bodies):
                continue
            try:
                body = self._readRecord(paths[status])
                if body.get("batchId") != batchId or body.get("state") != str(status):
                    raise _CorruptRecord("its content names another batch or state")
                handles = tuple(LoggedHandle.fromJson(h) for h in body.get("handles", ()))
            except FileNotFoundError:
                continue  # pruned or reset between listing and reading
            except (_CorruptRecord, KeyError, TypeError, ValueError) as exc:
                log.warning(
                    "decision log %s: ignoring record %s: %s", self._url, paths[status], exc
                )
                continue
            body["_handles"] = handles
            bodies[status] = body
        if not bodies:
            return None
        status = next(iter(bodies))
        rewrite = self._readRewrite(batchId, paths) if BatchStatus.DECIDED in bodies else {}
        decided = bodies.get(BatchStatus.DECIDED, {})
        committed = bodies.get(BatchStatus.COMMITTED, {})
        aborted = bodies.get(BatchStatus.ABORTED, {})
        return BatchState(
            batchId,
            status,
            decided.get("_handles", ()),
            queryId=decided.get("queryId"),
            decidedAt=parseTimeOrNone(decided.get("decidedAt")),
            committedAt=parseTimeOrNone(committed.get("committedAt")),
            abortedAt=parseTimeOrNone(aborted.get("abortedAt")),
            commitSeconds=committed.get("commitSeconds"),
            awaitingRewrite=rewrite.get("awaiting", ()),
            lostPartitions=rewrite.get("lost", ()),
            replacements=rewrite.get("replacements", ()),
        )

    def _readRewrite(self, batchId: int, paths: Mapping[BatchStatus, str]) -> dict[str, Any]:
        """The rewrite record of N as ``lost``, ``awaiting`` and ``replacements``, or ``{}``."""
        path = paths.get(BatchStatus.REWRITE)
        if path is None:
            return {}
        try:
            body = self._readRecord(path)
            if body.get("batchId") != batchId or body.get("state") != str(BatchStatus.REWRITE):
                raise _CorruptRecord("its content names another batch or state")
            lost = tuple(sorted(int(p) for p in body["lost"]))
            replacements = tuple(LoggedHandle.fromJson(h) for h in body.get("replacements", ()))
        except FileNotFoundError:
            return {}
        except (_CorruptRecord, KeyError, TypeError, ValueError) as exc:
            # Unreadable: losing the list of lost partitions must not pass for "nothing lost".
            raise DecisionConflictError(
                f"decision log {self._url}: the rewrite record of decided batch {batchId} "
                f"({path}) is unreadable ({exc}); it names partitions whose transactions were "
                "lost. Restore it from a backup of the checkpoint, or move the checkpoint "
                "aside and rebuild the topic from the source."
            ) from None
        replaced = {h.partitionId for h in replacements}
        return {
            "lost": lost,
            "awaiting": tuple(p for p in lost if p not in replaced),
            "replacements": replacements,
        }

    def _readRecord(self, path: str) -> dict[str, Any]:
        data = self._fs.cat_file(path)
        try:
            body = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _CorruptRecord(f"not complete JSON ({exc})") from None
        if not isinstance(body, dict):
            raise _CorruptRecord("not a JSON object")
        stored = body.pop("checksum", None)
        if stored != checksum(body):
            raise _CorruptRecord("checksum mismatch (torn or edited file)")
        return body

    def _clear(self) -> int:
        listing = self._list()
        doomed = [p for paths in listing.records.values() for p in paths.values()]
        doomed += [p for p, _ in listing.temporary]
        if doomed:
            self._fs.rm(doomed)
        return len(doomed)

    def _publish(self, name: str, body: Mapping[str, Any], *, exclusive: bool) -> None:
        """Create ``name`` atomically with ``body``; ``exclusive`` fails if it already exists."""
        data = (json.dumps({**body, "checksum": checksum(body)}, indent=2) + "\n").encode()
        final = self._path(name)
        tmp = self._path(f"{TMP_PREFIX}{uuid.uuid4().hex}.json")
        if not self._madeRoot:
            self._fs.makedirs(self._root, exist_ok=True)
            self._madeRoot = True
        if self._local:
            self._publishLocal(tmp, final, data, exclusive)
            return
        self._fs.pipe_file(tmp, data)
        try:
            if exclusive and self._fs.exists(final):
                raise FileExistsError(errno.EEXIST, "log record exists", final)
            self._fs.mv(tmp, final)
        except BaseException:
            if self._fs.exists(tmp):
                self._fs.rm(tmp)
            raise

    def _publishLocal(self, tmp: str, final: str, data: bytes, exclusive: bool) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            if exclusive:
                try:
                    os.link(tmp, final)  # atomic, and never replaces an existing record
                except FileExistsError:
                    raise
                except OSError:  # no hard links here (some FUSE / network mounts)
                    if os.path.exists(final):
                        raise FileExistsError(errno.EEXIST, "log record exists", final) from None
                    os.replace(tmp, final)
            else:
                os.replace(tmp, final)
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        dirfd = os.open(os.path.dirname(final), os.O_RDONLY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)


def _ageSeconds(entry: Mapping[str, Any], now: float) -> float | None:
    """Age of a listed file from whatever time its filesystem reports, or ``None``."""
    for key in ("mtime", "created", "LastModified", "last_modified", "updated"):
        value = entry.get(key)
        if isinstance(value, int | float):
            return now - float(value)
        if isinstance(value, datetime):
            return now - value.timestamp()
        if isinstance(value, str):
            try:
                return now - datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None
