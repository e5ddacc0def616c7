"""Where the files sink's bytes live: one base directory on an fsspec filesystem, durably.

Paths handed to and returned by :class:`Storage` are relative to the base directory and use
``/`` on every filesystem, so a handle written on one machine means the same files on another.
On the local filesystem, ``syncFile``/``syncDirs`` call ``os.fsync`` (file data, then the
directory entries); on other filesystems closing a file is what makes it durable, and they are
no-ops.
"""

from __future__ import annotations

import errno
import os
import posixpath
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from twophase.protocol import TransientCommitError
from twophase.redaction import redact

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
    Not thread-safe and not meant to be pickled: build one per process (:class:`Storages` does
    so lazily).
    """

    def __init__(self, path: str, storageOptions: Mapping[str, Any]) -> None:
        fs, root = fsspec.core.url_to_fs(path, **dict(storageOptions))
        self.fs: fsspec.AbstractFileSystem = fs
        self.isLocal = isinstance(fs, LocalFileSystem)
        stripped = root.rstrip("/")
        self.root: str = stripped if stripped or not root else "/"

    def full(self, rel: str) -> str:
        """The filesystem-native path of ``rel`` (no protocol), as fsspec methods expect."""
        rel = rel.strip("/")
        if not rel:
            return self.root
        return f"{self.root.rstrip('/')}/{rel}"

    def url(self) -> str:
        """The base directory as a URL another process can open (absolute for local paths)."""
        return str(self.fs.unstrip_protocol(self.root)) if not self.isLocal else self.root

    def makedirs(self, rel: str) -> None:
        """Create ``rel`` and its parents if missing (a no-op on most object stores)."""
        self.fs.makedirs(self.full(rel), exist_ok=True)

    def create(self, rel: str) -> IO[bytes]:
        """Open ``rel`` for writing from scratch; its parent directory must exist."""
        f: IO[bytes] = self.fs.open(self.full(rel), "wb")
        return f

    def syncFile(self, rel: str) -> None:
        """Local filesystem: ``fsync`` the file's data (any descriptor of the inode will do)."""
        if not self.isLocal:
            return
        fd = os.open(self.full(rel), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def syncDirs(self, rels: Iterable[str]) -> None:
        """Local filesystem: ``fsync`` each directory so created or renamed entries persist.

        Missing directories are skipped. Sorted deepest first, so a new directory's entry in
        its parent is synced after its own contents.
        """
        if not self.isLocal:
            return
        for rel in sorted(set(rels), key=lambda r: (-r.count("/"), r)):
            try:
                fd = os.open(self.full(rel), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            except OSError as exc:  # some filesystems refuse fsync on directories
                if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
                    raise
            finally:
                os.close(fd)

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self.full(rel)))

    def size(self, rel: str) -> int:
        return int(self.fs.size(self.full(rel)))

    def listFiles(self, rel: str) -> set[str]:
        """Every file below ``rel`` (recursively) as base-relative paths; empty when missing.

        One recursive listing on object stores.
        """
        base = self.full(rel)
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return set()
        prefix = self.root.rstrip("/") + "/"
        return {p[len(prefix) :] for p in found if p.startswith(prefix)}

    def listDirNames(self, rel: str) -> list[str]:
        """Names (not paths) of the directories directly inside ``rel``; empty when missing."""
        try:
            entries = self.fs.ls(self.full(rel), detail=True)
        except FileNotFoundError:
            return []
        names = []
        for entry in entries:
            if entry.get("type") == "directory":
                names.append(posixpath.basename(str(entry["name"]).rstrip("/")))
        return sorted(names)

    def invalidateCache(self) -> None:
        """Forget cached listings, so the next look reflects other processes' changes."""
        self.fs.invalidate_cache()

    def move(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` (atomic ``os.replace`` locally, copy + delete elsewhere)."""
        if self.isLocal:
            os.replace(self.full(src), self.full(dst))
        else:
            self.fs.mv(self.full(src), self.full(dst))

    def removeFile(self, rel: str) -> None:
        """Delete one file; a missing file is not an error."""
        try:
            self.fs.rm_file(self.full(rel))
        except FileNotFoundError:
            pass

    def removeTree(self, rel: str) -> bool:
        """Delete ``rel`` and everything below it; returns False when it did not exist."""
        path = self.full(rel)
        try:
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
            if self.fs.ls(path, detail=False):
                return False
            self.fs.rmdir(path)
        except (FileNotFoundError, NotADirectoryError, FileExistsError):
            return False
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise
        return True


class Storages:
    """The :class:`Storage` of each base path a process touches, opened lazily, once each.

    A committer may meet handles naming its output path as a URL (``file:///out``) or as the
    user wrote it (``out``): both keys lead to one ``Storage``. Pickled (to a task) as its
    options only: the open filesystems are opened again where it lands.
    """

    def __init__(self, storageOptions: Mapping[str, Any]) -> None:
        self.storageOptions = dict(storageOptions)
        self._byPath: dict[str, Storage] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"storageOptions": self.storageOptions}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["storageOptions"])  # type: ignore[misc]

    def get(self, path: str) -> Storage:
        """The storage of base directory ``path`` (any fsspec URL or local path)."""
        storage = self._byPath.get(path)
        if storage is None:
            storage = Storage(path, self.storageOptions)
            self._byPath[path] = storage
            self._byPath.setdefault(storage.url(), storage)
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


__all__ = ["Storage", "Storages", "ancestorsOf", "isTransient", "parentOf", "transientErrors"]
