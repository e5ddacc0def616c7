"""Where the files sink's bytes live: one base directory on an fsspec filesystem, durably.

Paths handed to and returned by :class:`Storage` are relative to the base directory and use
``/`` on every filesystem, so a handle written on one machine means the same files on another.
On the local filesystem, ``close``/``syncDirs``/``syncAncestorsOnce`` call ``os.fsync`` (file
data, then the directory entries, see :mod:`twophase.sinks.files.durability`); on other
filesystems closing a file is what makes it durable, and they are no-ops.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from twophase.protocol import TransientCommitError
from twophase.redaction import redact
from twophase.resources import Resources
from twophase.sinks.files.durability import closeDurably, directories, syncAncestorsOnce
from twophase.sinks.files.errors import FilesAccessError
from twophase.sinks.files.s3 import isTransient as s3IsTransient
from twophase.sinks.files.trust import checkStorageTrust

_TRANSIENT_ERRNOS = frozenset(
    {
        errno.EAGAIN,
        errno.EBUSY,
        errno.EINTR,
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.ENETDOWN,
        errno.ENETUNREACH,
        errno.ENETRESET,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
    }
)


def isTransient(exc: BaseException) -> bool:
    """True for errors where retrying the same filesystem call later may succeed.

    Connection and timeout errors (``ConnectionError``, ``TimeoutError``, which cover most
    remote filesystems' network failures) and ``OSError``s whose errno says "try again".
    Missing files, permissions and full disks are permanent.
    """
    if isinstance(exc, ConnectionError | TimeoutError | InterruptedError | BlockingIOError):
        return True
    if s3IsTransient(exc):  # botocore's connection errors are not OSErrors
        return True
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS


@contextmanager
def transientErrors(what: str) -> Iterator[None]:
    """Re-raise transient filesystem errors inside the block as ``TransientCommitError``.

    ``what`` names the operation and its target for the message; other errors propagate as
    they are, so the coordinator fails fast on permanent problems.
    """
    try:
        yield
    except TransientCommitError:
        raise
    except Exception as exc:
        if isTransient(exc):
            raise TransientCommitError(redact(f"{what}: {type(exc).__name__}: {exc}")) from exc
        raise


class Storage:
    """A base directory on one fsspec filesystem; every method takes paths relative to it.

    Built from the user's ``path`` (any fsspec URL or local path) and fsspec storage options.
    On the local filesystem the methods call ``os`` directly (fsspec's path handling costs more
    than the system calls for a small task); elsewhere they go through fsspec. Safe to share
    between the committer's threads; not meant to be pickled (:class:`Storages` opens one per
    base directory and process).
    """

    def __init__(self, path: str, storageOptions: Mapping[str, Any]) -> None:
        checkStorageTrust(storageOptions)  # the CA file is on this host, driver or executor
        fs, root = fsspec.core.url_to_fs(path, **dict(storageOptions))
        self.fs: fsspec.AbstractFileSystem = fs
        self.isLocal = isinstance(fs, LocalFileSystem)
        stripped = root.rstrip("/")
        self.root: str = stripped if stripped or not root else "/"
        self._url = str(self.fs.unstrip_protocol(self.root)) if not self.isLocal else self.root
        self._made = False

    def full(self, rel: str) -> str:
        """The filesystem-native path of ``rel`` (no protocol), as fsspec methods expect."""
        rel = rel.strip("/")
        if not rel:
            return self.root
        return f"{self.root.rstrip('/')}/{rel}"

    def url(self) -> str:
        """The base directory as a URL another process can open (absolute for local paths)."""
        return self._url

    def makedirs(self, rel: str) -> None:
        """Create ``rel`` and its parents if missing (a no-op on most object stores)."""
        if self.isLocal:
            os.makedirs(self.full(rel), exist_ok=True)
        else:
            self.fs.makedirs(self.full(rel), exist_ok=True)

    def makedirsOnce(self) -> None:
        """Create the base directory if missing, once per :class:`Storage` (so per process)."""
        if not self._made:
            self.makedirs("")
            self._made = True

    def create(self, rel: str) -> IO[bytes]:
        """Open ``rel`` for writing from scratch; its parent directory must exist."""
        if self.isLocal:
            return open(self.full(rel), "wb")  # noqa: SIM115 - the caller closes it
        f: IO[bytes] = self.fs.open(self.full(rel), "wb")
        return f

    def close(self, raw: IO[bytes]) -> None:
        """Close a file from :meth:`create`; locally its data is fsynced first."""
        if self.isLocal:
            closeDurably(raw)
        else:
            raw.close()

    def syncDirs(self, rels: Iterable[str]) -> None:
        """Local filesystem: ``fsync`` each directory so created or renamed entries persist.

        Missing directories are skipped. Sorted deepest first, so a new directory's entry in
        its parent is synced after its own contents. Threads syncing one directory at once
        share the fsync (:func:`twophase.sinks.files.durability.directories`).
        """
        if not self.isLocal:
            return
        depth = {r: r.strip("/").count("/") + 1 if r.strip("/") else 0 for r in set(rels)}
        for rel in sorted(depth, key=lambda r: (-depth[r], r)):
            directories().sync(self.full(rel))

    def syncAncestorsOnce(self, rel: str = "") -> None:
        """Local filesystem: make ``rel`` (a directory the sink never deletes) and every
        directory above it durable in their parents, once per process."""
        if self.isLocal:
            syncAncestorsOnce(self.full(rel))

    def exists(self, rel: str) -> bool:
        if self.isLocal:
            return os.path.exists(self.full(rel))
        return bool(self.fs.exists(self.full(rel)))

    def size(self, rel: str) -> int:
        if self.isLocal:
            return os.path.getsize(self.full(rel))
        return int(self.fs.size(self.full(rel)))

    def listFiles(self, rel: str) -> set[str]:
        """Every file below ``rel`` (recursively) as base-relative paths; empty when missing.

        One recursive listing on object stores.
        """
        base = self.full(rel)
        prefix = self.root.rstrip("/") + "/"
        if self.isLocal:
            found: list[str] = []
            for directory, _, names in os.walk(base):
                found.extend(f"{directory}/{name}" for name in names)
        else:
            try:
                found = self.fs.find(base)
            except FileNotFoundError:
                return set()
        return {p[len(prefix) :] for p in found if p.startswith(prefix)}

    def listFileNames(self, rel: str) -> list[str]:
        """Names (not paths) of the files directly inside ``rel``; empty when missing."""
        return self._listNames(rel, directories=False)

    def listDirNames(self, rel: str) -> list[str]:
        """Names (not paths) of the directories directly inside ``rel``; empty when missing."""
        return self._listNames(rel, directories=True)

    def _listNames(self, rel: str, *, directories: bool) -> list[str]:
        """Sorted names of the files (or directories) directly inside ``rel``."""
        if self.isLocal:
            try:
                with os.scandir(self.full(rel)) as entries:
                    return sorted(
                        e.name
                        for e in entries
                        if (e.is_dir if directories else e.is_file)(follow_symlinks=False)
                    )
            except (FileNotFoundError, NotADirectoryError):
                return []
        try:
            listed = self.fs.ls(self.full(rel), detail=True)
        except FileNotFoundError:
            return []
        wanted = "directory" if directories else "file"
        return sorted(
            posixpath.basename(str(e["name"]).rstrip("/"))
            for e in listed
            if e.get("type") == wanted
        )

    def invalidateCache(self) -> None:
        """Forget cached listings, so the next look reflects other processes' changes."""
        if not self.isLocal:
            self.fs.invalidate_cache()

    def move(self, src: str, dst: str, target: Storage | None = None) -> None:
        """Rename ``src`` to ``dst`` of ``target`` (default: this base directory).

        Atomic ``os.replace`` locally, copy + delete elsewhere. Both bases must be on one
        filesystem (:func:`checkStagingArea`); a cross-device rename raises ``OSError`` EXDEV.
        """
        into = target or self
        if self.isLocal:
            os.replace(self.full(src), into.full(dst))
        else:
            self.fs.mv(self.full(src), into.full(dst))

    def removeFile(self, rel: str) -> bool:
        """Delete one file; a missing file is not an error (returns False)."""
        try:
            if self.isLocal:
                os.unlink(self.full(rel))
            else:
                self.fs.rm_file(self.full(rel))
        except FileNotFoundError:
            return False
        return True

    def removeTree(self, rel: str) -> bool:
        """Delete ``rel`` and everything below it; returns False when it did not exist."""
        path = self.full(rel)
        try:
            if self.isLocal:
                shutil.rmtree(path)
                return True
            if not self.fs.exists(path):
                return False
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            return False
        return True

    def removeEmptyDir(self, rel: str) -> bool:
        """Remove ``rel`` if it is an empty directory; anything else leaves it (returns False)."""
        path = self.full(rel)
        try:
            if not self.isLocal and self.fs.ls(path, detail=False):
                return False
            if self.isLocal:
                os.rmdir(path)
            else:
                self.fs.rmdir(path)
        except (FileNotFoundError, NotADirectoryError, FileExistsError):
            return False
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise
        return True


def checkStagingArea(output: Storage, staging: Storage) -> None:
    """Prove the commit's rename can move a staged entry into ``output``; once per process.

    Creates both directories, then (local filesystem) renames an empty probe directory from
    the staging path into the output path and removes it: a staging path on another device or
    mount fails here with a ``ValueError`` naming option ``stagingPath``, before any data is
    written, instead of at a commit after the batch is decided. Elsewhere (object stores,
    where a rename is copy + delete within the store) it only creates the staging directory.
    """
    key = (output.url(), staging.url())
    # (output URL, staging URL) pairs this process has proven a rename can join
    checked: set[tuple[str, str]] = Resources.ofProcess().get("files.checkedStaging", set)
    if key in checked:
        return
    fix = (
        "set option stagingPath to a writable directory on the same filesystem as path, "
        "outside path"
    )
    try:
        staging.makedirs("")
        output.makedirs("")
    except OSError as exc:
        if not isinstance(exc, PermissionError) and exc.errno != errno.EROFS:
            raise
        if not staging.isLocal:  # S3's AccessDenied: an action the keys lack, not the option
            raise FilesAccessError(
                redact(
                    f"files: S3 refused creating {staging.url()!r} or {output.url()!r} ({exc}): "
                    "the keys lack s3:ListBucket on the bucket (s3fs looks before it writes)"
                )
            ) from exc
        raise ValueError(
            redact(f"files: cannot create the staging path {staging.url()!r}: {exc}; {fix}")
        ) from exc
    if output.isLocal and staging.isLocal:
        name = f".twophase-probe-{uuid.uuid4().hex[:12]}"
        probe = staging.full(name)
        os.mkdir(probe)
        try:
            os.rename(probe, output.full(name))
        except OSError as exc:
            os.rmdir(probe)
            if exc.errno != errno.EXDEV:
                raise
            raise ValueError(
                f"files: the staging path {staging.url()!r} is on another filesystem or mount "
                f"than path {output.url()!r}, so the commit cannot rename staged files into "
                f"place atomically; {fix}"
            ) from exc
        os.rmdir(output.full(name))
    checked.add(key)


class Storages:
    """The :class:`Storage` of each base path a process touches, opened lazily, once each.

    A committer may meet handles naming its output path as a URL (``file:///out``) or as the
    user wrote it (``out``): both keys lead to one ``Storage``, shared by every writer and
    committer of the process with the same storage options: every :class:`Storage` the
    process opened is kept in its :class:`Resources`, by (path, storage options), so a Python
    worker that runs many tasks opens each filesystem once. Pickled (to a task) as its options
    only: the open filesystems are opened again where it lands.
    """

    def __init__(self, storageOptions: Mapping[str, Any]) -> None:
        self.storageOptions = dict(storageOptions)
        self._key = json.dumps(self.storageOptions, sort_keys=True, default=repr)

    def __getstate__(self) -> dict[str, Any]:
        return {"storageOptions": self.storageOptions}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["storageOptions"])  # type: ignore[misc]

    def get(self, path: str) -> Storage:
        """The storage of base directory ``path`` (any fsspec URL or local path)."""
        opened: dict[tuple[str, str], Storage] = Resources.ofProcess().get("files.storages", dict)
        storage = opened.get((path, self._key))
        if storage is None:
            storage = Storage(path, self.storageOptions)
            opened[(path, self._key)] = storage
            opened.setdefault((storage.url(), self._key), storage)
        return storage


def parentOf(rel: str) -> str:
    """The parent of a base-relative path (``""`` for the base itself)."""
    return posixpath.dirname(rel.strip("/"))


def ancestorsOf(rel: str, stop: str = "") -> list[str]:
    """``rel``'s parent, grandparent, ... down to (and including) ``stop``; relative paths."""
    out = []
    cur = parentOf(rel)
    while True:
        out.append(cur)
        if cur == stop.strip("/") or not cur:
            break
        cur = parentOf(cur)
    return out


__all__ = [
    "Storage",
    "Storages",
    "ancestorsOf",
    "checkStagingArea",
    "isTransient",
    "parentOf",
    "transientErrors",
]
