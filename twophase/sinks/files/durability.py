"""Local-filesystem durability for the files sink: every fsync the protocol needs, once.

A staged file must survive a machine crash once ``preCommit`` returned, and a committed rename
once ``commit`` returned. That takes the file's data, its directory's entry, and the entry of
every directory above it that was made recently. This module syncs each of those, no more:

- :func:`closeDurably` syncs an open file's data (``fdatasync``: the data and the size, not
  the times) through its own descriptor, then closes it;
- :func:`directories` (the process's :class:`DirectorySyncer`) fsyncs a directory; threads
  that ask for one directory at once (the committer's pool) share a single fsync that starts
  after each caller's change (group commit), so 200 renames into one directory do not cost
  200 fsyncs in a row;
- :func:`syncAncestorsOnce` fsyncs every directory above a long-lived one (the staging path,
  the sink's staging directory, the output path) once per process, keyed by the directory's
  device and inode, so it is made durable whoever made it and at no cost afterwards.

What is shared by the process lives in its :class:`~twophase.resources.Resources`. Everything
here is for the local filesystem; elsewhere closing a file is what makes it durable.
"""

from __future__ import annotations

import errno
import os
import threading
from typing import IO

from twophase.resources import Resources


def fsyncDirectory(path: str) -> None:
    """``fsync`` one directory so entries made or renamed in it persist; missing is skipped."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems refuse fsync on directories
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def closeDurably(raw: IO[bytes]) -> None:
    """Flush ``raw``, sync its data through its own descriptor, close it."""
    try:
        raw.flush()
        getattr(os, "fdatasync", os.fsync)(raw.fileno())
    finally:
        raw.close()


class DirectorySyncer:
    """``sync(path)`` returns once an fsync of ``path`` that began after the call has finished.

    Concurrent callers for one directory share one fsync (group commit): a caller takes a
    ticket, and any fsync started after its ticket covers it. A failed fsync raises in the
    thread that ran it; the others try again.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._state: dict[str, list[int]] = {}  # path -> [tickets issued, tickets done, busy]

    def sync(self, path: str) -> None:
        with self._cond:
            state = self._state.setdefault(path, [0, 0, 0])
            state[0] += 1
            ticket = state[0]
            while state[1] < ticket:
                if state[2]:
                    self._cond.wait()
                    continue
                state[2] = 1
                covered = state[0]
                try:
                    self._cond.release()
                    try:
                        fsyncDirectory(path)
                    finally:
                        self._cond.acquire()
                    state[1] = max(state[1], covered)
                finally:
                    state[2] = 0
                    self._cond.notify_all()


def directories(resources: Resources | None = None) -> DirectorySyncer:
    """The process's directory syncer (the committer's threads share it)."""
    return (resources or Resources.ofProcess()).get("files.directories", DirectorySyncer)


def _durable(resources: Resources | None = None) -> set[tuple[int, int, str]]:
    """Directories (device, inode, path) whose every ancestor this process has fsynced."""
    return (resources or Resources.ofProcess()).get("files.durable", set)


def syncAncestorsOnce(path: str) -> None:
    """Make the entry of ``path`` and of each directory above it durable, once per process.

    Only for directories the sink never deletes: the cache is keyed by device and inode, but
    a directory deleted and made again may reuse its inode.
    """
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, path)
    durable = _durable()
    if key in durable:
        return
    syncer = directories()
    current = os.path.abspath(path)
    while True:
        parent = os.path.dirname(current)
        if parent == current:
            break
        syncer.sync(parent)
        current = parent
    durable.add(key)  # one atomic step under the GIL


__all__ = [
    "DirectorySyncer",
    "closeDurably",
    "directories",
    "fsyncDirectory",
    "syncAncestorsOnce",
]
