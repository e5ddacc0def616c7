"""The resources of one Python process: every pool, engine, producer and client sinks open.

Sinks keep what is costly to open (Kafka producers, SQLAlchemy engines, PostgreSQL sessions,
catalogs, filesystems) for the next task or batch of the same process: PySpark reuses its Python
workers, so that reuse is most of a task's speed (docs/performance.md). Everything kept lives in
the process's :class:`Resources`, under a key, with the function that closes it; no sink
module holds state of its own. ``Resources.ofProcess()`` is the one of this process (a forked
child gets its own and never touches its parent's sockets). It is closed when the last query
of ours in the process stops (``twophase.spark.query_end`` tells it, in a ``foreachBatch``
driver) and at interpreter exit; a PySpark worker ends without exit handlers, and what it
holds closes with the process (Spark stops the Python workers an executor left idle for a
minute). A resource asked for after a close is opened again.

Writers and committers hold the object they were given; pickled (to a task), it lands as the
receiving process's own.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

from twophase.redaction import getLogger

log = getLogger(__name__)

T = TypeVar("T")


class Resources:
    """Named resources of one process, each opened once and closed with the rest; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._released = threading.Condition(self._lock)
        self._items: dict[Hashable, tuple[Any, Callable[[Any], None] | None]] = {}
        self._users: set[str] = set()
        self._opening: dict[Hashable, threading.Lock] = {}

    def __reduce__(self) -> tuple[Callable[[], Resources], tuple[()]]:
        return (Resources.ofProcess, ())

    def get(
        self, key: Hashable, open: Callable[[], T], close: Callable[[T], None] | None = None
    ) -> T:
        """The resource under ``key``, opened by ``open()`` on first use; ``close(resource)``
        ends it when this object is closed (``None``: nothing to end, e.g. a set of facts).

        A slow ``open`` (a catalog loaded over the network) holds up only the callers of the
        same key."""
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                return cast(T, found[0])
            opening = self._opening.setdefault(key, threading.Lock())
        with opening:
            with self._lock:
                found = self._items.get(key)
                if found is not None:
                    return cast(T, found[0])
            resource = open()
            with self._lock:
                self._items[key] = (resource, cast(Callable[[Any], None] | None, close))
                self._opening.pop(key, None)
            return resource

    def peek(self, key: Hashable) -> Any:
        """The resource under ``key`` if open, else ``None`` (never opens it)."""
        with self._lock:
            found = self._items.get(key)
            return None if found is None else found[0]

    def keys(self) -> list[Hashable]:
        """The keys of the open resources (tests and diagnostics)."""
        with self._lock:
            return list(self._items)

    def use(self, user: str) -> None:
        """``user`` (a query) relies on these resources until ``release(user)``."""
        with self._lock:
            self._users.add(user)

    def release(self, user: str) -> bool:
        """``user`` stopped; closes everything once no user is left. True when closed."""
        with self._lock:
            self._users.discard(user)
            if self._users:
                return False
            self.close()
            self._released.notify_all()
            return True

    def awaitReleased(self, timeoutSeconds: float) -> bool:
        """Wait until every user released these resources (and they were closed); False after
        ``timeoutSeconds``. Spark tells a query's end to its listeners after ``stop()``."""
        with self._lock:
            return self._released.wait_for(lambda: not self._users, timeoutSeconds)

    def close(self) -> None:
        """Close every resource, newest first; a failing close is logged and the rest go on."""
        with self._lock:
            items = list(self._items.items())
            self._items = {}
        for key, (resource, close) in reversed(items):
            if close is None:
                continue
            try:
                close(resource)
            except Exception:  # one stuck resource must not keep the others open
                log.warning("closing %r failed", key, exc_info=True)

    @staticmethod
    def ofProcess() -> Resources:
        """This process's resources (a forked child's are new: the parent's stay untouched)."""
        global _process, _processPid
        pid = os.getpid()
        if _process is None or _processPid != pid:
            with _processLock:
                if _process is None or _processPid != pid:
                    if _process is not None:
                        _inherited.append(_process)  # a parent's: never closed, never collected
                    _process, _processPid = Resources(), pid
        return _process


_process: Resources | None = None
_processPid = -1
_processLock = threading.Lock()
_inherited: list[Resources] = []


def _closeAtExit() -> None:
    if _process is not None and _processPid == os.getpid():
        _process.close()


atexit.register(_closeAtExit)


__all__ = ["Resources"]
