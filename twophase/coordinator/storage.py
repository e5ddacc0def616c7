"""The decision log's storage: one directory through fsspec, records published atomically.

Every record is one small indented JSON file, published atomically: on local disk written
under a ``_tmp-<uuid>.json`` name in the same directory, fsynced, then renamed to its final name;
on an object store put whole in one request. Where a record must not replace another (a
decision, a run's claim, a fence), the store's own create-if-absent makes it
(:mod:`~twophase.coordinator.exclusive`: a hard link, S3's conditional PUT), so of two writers
exactly one wins. A write the filesystem refuses (a full or read-only disk) raises
:class:`~twophase.coordinator.errors.DecisionLogWriteError` naming the record, after removing its
own temporary file, so nothing half written is left under a final name. Reading a record
verifies its ``checksum``
(:func:`~twophase.coordinator.records.checksum`): a torn or garbage file raises
:class:`CorruptRecord`, never passes for a record; one of a newer ``format`` raises
:class:`~twophase.coordinator.errors.LogFormatError`, never passes for a torn one. A listing
sorts the directory into records by batch and status, the links of fenced decision slots, the
runs, and temporary files with their age, which ``prune`` removes once they are old.
No cache: several processes (Spark's driver-side Python workers, executors) read the same log.
"""

from __future__ import annotations

import errno
import json
import os
import ssl
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import fsspec.core
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from twophase.clients.s3trust import storageRefusal
from twophase.coordinator.errors import DecisionLogWriteError, UnfencedLogStoreError
from twophase.coordinator.exclusive import (
    createRemote,
    exclusiveCreateOf,
    isObjectStore,
    protocolOf,
)
from twophase.coordinator.formats import refuseNewer, versionOf
from twophase.coordinator.records import (
    FORMAT,
    LINK_NAME,
    RECORD_NAME,
    RUN_NAME,
    BatchStatus,
    checksum,
)
from twophase.redaction import getLogger

log = getLogger(__name__)

TMP_PREFIX = "_tmp-"
"""The name prefix of a record being written, before its rename."""


class CorruptRecord(Exception):
    """A file under a record's name that is not a complete record."""


@dataclass
class Listing:
    """One listing of the log's directory: the records' paths by batch and status, and the
    temporary files with their age in seconds (``None`` where the filesystem gives no time)."""

    records: dict[int, dict[BatchStatus, str]] = field(default_factory=dict)
    links: dict[int, dict[int, str]] = field(default_factory=dict)
    """Per batch, the links of its decision slot by the epoch of the fence that points to each
    (:mod:`~twophase.coordinator.slots`)."""
    runs: dict[int, str] = field(default_factory=dict)
    """The runs' records by epoch (:mod:`~twophase.coordinator.runs`)."""
    temporary: list[tuple[str, float | None]] = field(default_factory=list)

    def pathsOf(self, batchId: int) -> list[str]:
        """Every file of batch N: its records and its slot's links."""
        return [*self.records.get(batchId, {}).values(), *self.links.get(batchId, {}).values()]


class LogStorage:
    """The log's directory on any fsspec filesystem: publish, list, read and remove records.

    ``url`` is a local path or any fsspec URL; the directory is created on the first publish,
    so read-only users (executors) never create it. ``unfenced`` accepts a store without a
    create-if-absent (``exclusive``): its exclusive publishes then check, then move.
    """

    def __init__(
        self, url: str, storageOptions: Mapping[str, Any], *, unfenced: bool = False
    ) -> None:
        self.url = url
        self.storageOptions = dict(storageOptions)
        fs, root = fsspec.core.url_to_fs(url, **storageOptions)
        self.fs: AbstractFileSystem = fs
        self.root: str = root.rstrip("/") or root
        self._local = isinstance(fs, LocalFileSystem)
        self._unfenced = unfenced
        self._madeRoot = False
        self._trusted = not isObjectStore(fs)

    @property
    def exclusiveCreate(self) -> str | None:
        """How this store creates a record only where none exists, or ``None``."""
        return exclusiveCreateOf(self.fs)

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _checkTrust(self, what: str, verb: str) -> None:
        """Before this instance's first call to S3 over HTTPS: one TLS handshake under the
        trust s3fs is given. A certificate that does not verify is a ``DecisionLogWriteError``
        at once, where botocore and s3fs would retry it for many seconds."""
        if self._trusted:
            return
        refusal = storageRefusal(self.storageOptions, who="the decision log")
        if refusal is not None:
            cause = ssl.SSLCertVerificationError(refusal)
            raise DecisionLogWriteError(self.url, what, cause, verb=verb)
        self._trusted = True

    def listing(self) -> Listing:
        """One ``ls`` of the directory; an empty record is left out with a WARNING."""
        listing = Listing()
        self._checkTrust("the listing", "read")
        self.fs.invalidate_cache(self.root)
        try:
            entries = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return listing
        except PermissionError as exc:  # refused, not missing: never worth a retry
            raise DecisionLogWriteError(self.url, "the listing", exc, verb="read") from exc
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
                self._listOther(listing, name, path)
                continue
            if entry.get("size") == 0:
                log.warning("decision log %s: ignoring empty record %s", self.url, name)
                continue
            batchId, status = int(match.group(1)), BatchStatus(match.group(2))
            listing.records.setdefault(batchId, {})[status] = path
        return listing

    @staticmethod
    def _listOther(listing: Listing, name: str, path: str) -> None:
        """File a slot's link or a run's record in ``listing``; anything else is not the log's."""
        link = LINK_NAME.match(name)
        if link is not None:
            listing.links.setdefault(int(link.group(1)), {})[int(link.group(2))] = path
            return
        run = RUN_NAME.match(name)
        if run is not None:
            listing.runs[int(run.group(1))] = path

    def readRecord(self, path: str) -> dict[str, Any]:
        """The body of the record at ``path``, its checksum verified; ``CorruptRecord`` if not
        a complete record, ``LogFormatError`` if of a newer format than this code reads,
        ``FileNotFoundError`` if gone. Never from a cached listing: a record another driver
        created since must be found."""
        self._checkTrust(path, "read")
        self.fs.invalidate_cache(path)
        try:
            data = self.fs.cat_file(path)
        except PermissionError as exc:  # refused, not missing: never worth a retry
            raise DecisionLogWriteError(self.url, path, exc, verb="read") from exc
        try:
            body = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptRecord(f"not complete JSON ({exc})") from None
        if not isinstance(body, dict):
            raise CorruptRecord("not a JSON object")
        try:
            found = versionOf(body.get("format"), "the record")
        except ValueError as exc:
            raise CorruptRecord(str(exc)) from None
        # Before the checksum: a newer release may sum its records otherwise, and a record it
        # wrote must stop this code, never pass for a torn one.
        refuseNewer(found, FORMAT, f"decision log record {path}", body.get("twophase"))
        stored = body.pop("checksum", None)
        if stored != checksum(body):
            raise CorruptRecord("checksum mismatch (torn or edited file)")
        return body

    def remove(self, paths: Sequence[str], *, what: str) -> None:
        """Delete ``paths`` (``what`` names them); ``DecisionLogWriteError`` if refused.

        On an object store the listing is read back once: a bulk delete (S3's
        ``DeleteObjects``, as s3fs sends it) refuses objects one by one inside an answer that
        succeeds, and s3fs reports no refusal."""
        try:
            self.fs.rm(list(paths))
            if isObjectStore(self.fs):
                self._checkRemoved(paths)
        except OSError as exc:
            raise DecisionLogWriteError(self.url, what, exc, verb="remove") from exc

    def _checkRemoved(self, paths: Sequence[str]) -> None:
        """``PermissionError`` when any of ``paths`` is still listed after its delete."""
        self.fs.invalidate_cache(self.root)
        try:
            listed = {str(e["name"]).rstrip("/") for e in self.fs.ls(self.root, detail=True)}
        except FileNotFoundError:
            return
        left = sorted(set(paths) & listed)
        if left:
            raise PermissionError(
                errno.EACCES,
                f"the store answered the delete but kept {len(left)} of {len(paths)} file(s), "
                "as it does for a key whose DeleteObject is refused",
                left[0],
            )

    def clear(self, *, what: str) -> int:
        """Remove every batch's files and every temporary file; returns how many. The runs stay:
        their epochs only ever grow, so a driver fenced before stays fenced."""
        listing = self.listing()
        batches = {*listing.records, *listing.links}
        doomed = [p for batchId in batches for p in listing.pathsOf(batchId)]
        doomed += [p for p, _ in listing.temporary]
        if doomed:
            self.remove(doomed, what=what)
        return len(doomed)

    def publish(self, name: str, body: Mapping[str, Any], *, exclusive: bool, what: str) -> None:
        """Create ``name`` atomically with ``body``; ``exclusive`` fails if it already exists.

        ``what`` names the record for an operator ("the decision of batch 7"): a write the
        filesystem refuses raises ``DecisionLogWriteError`` with it, the ``OSError`` chained.
        Refused while the bytes are written (``ENOSPC``, ``EROFS``), it leaves ``name`` as it
        was and removes its temporary file; refused after the rename (the directory's fsync),
        the complete record is in place.
        """
        self._checkTrust(what, "write")
        data = (json.dumps({**body, "checksum": checksum(body)}, indent=2) + "\n").encode()
        final = self.path(name)
        tmp = self.path(f"{TMP_PREFIX}{uuid.uuid4().hex}.json")
        try:
            if not self._madeRoot:
                self.fs.makedirs(self.root, exist_ok=True)
                self._madeRoot = True
            if self._local:
                self._publishLocal(tmp, final, data, exclusive)
            elif exclusive and self.exclusiveCreate is not None:
                createRemote(self.fs, final, data)
            elif exclusive and not self._unfenced:
                raise UnfencedLogStoreError(protocolOf(self.fs), final)
            elif not exclusive and isObjectStore(self.fs):
                self.fs.pipe_file(final, data)  # one PUT: the object appears whole
            else:
                self._publishRemote(tmp, final, data, exclusive)
        except FileExistsError:
            raise  # an exclusive create that lost: the caller reads what is there
        except OSError as exc:
            raise DecisionLogWriteError(self.url, what, exc) from exc

    def _publishRemote(self, tmp: str, final: str, data: bytes, exclusive: bool) -> None:
        """Write ``tmp``, then move it to ``final``: atomic where the store's move is; an
        exclusive publish checks first, which two writers can both pass (accepted by the user
        with ``twophase.unfencedLogStore``)."""
        try:
            self.fs.pipe_file(tmp, data)
            if exclusive and self.fs.exists(final):
                raise FileExistsError(errno.EEXIST, "log record exists", final)
            self.fs.mv(tmp, final)
        except BaseException:
            try:
                if self.fs.exists(tmp):
                    self.fs.rm(tmp)
            except Exception as exc:  # the write's own error matters more
                log.warning("decision log %s: could not remove %s: %s", self.url, tmp, exc)
            raise

    def _publishLocal(self, tmp: str, final: str, data: bytes, exclusive: bool) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            if exclusive:
                try:
                    os.link(tmp, final)  # atomic, and never replaces an existing record
                except FileExistsError:
                    raise
                except OSError as exc:  # no hard links here (some FUSE / network mounts)
                    if exc.errno not in _NO_LINKS or not self._unfenced:
                        if exc.errno in _NO_LINKS:
                            raise UnfencedLogStoreError("file", final) from exc
                        raise
                    if os.path.exists(final):
                        raise FileExistsError(errno.EEXIST, "log record exists", final) from None
                    os.replace(tmp, final)
            else:
                os.replace(tmp, final)
        finally:
            # Gone after a rename; after a link, or a failed write (a full disk), it is ours.
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            except OSError as exc:  # the write's own error matters more; prune removes it
                log.warning("decision log %s: could not remove %s: %s", self.url, tmp, exc)
        dirfd = os.open(os.path.dirname(final), os.O_RDONLY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)


_NO_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS})
"""What ``link`` answers on a filesystem without hard links (some FUSE and network mounts)."""


def _ageSeconds(entry: Mapping[str, Any], now: float) -> float | None:
    """Age of a listed file from whatever time its filesystem reports, or ``None``."""
    modified = modifiedAt(entry)
    return None if modified is None else now - modified.timestamp()


def modifiedAt(entry: Mapping[str, Any]) -> datetime | None:
    """When a file listed by fsspec (``ls(detail=True)``) was last written, from whatever time
    its filesystem reports (local ``mtime``, S3 ``LastModified``, ...), or ``None``."""
    for key in ("mtime", "created", "LastModified", "last_modified", "updated"):
        value = entry.get(key)
        if isinstance(value, int | float):
            return datetime.fromtimestamp(float(value), UTC)
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
    return None
