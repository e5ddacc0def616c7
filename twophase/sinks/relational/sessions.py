"""The idle task sessions a worker process keeps for its next task, by key: both sinks' pool.

PySpark reuses Python workers, so the next task of a sink usually runs in a process whose last
task left a free session. ``IdleSessions`` keeps at most ``maxIdle`` of them per key; what a
session is, whether it may be kept and how it is checked before reuse is each sink's
(``twophase.sinks.postgres.sessions``, ``twophase.sinks.sql.sessions``). Sessions live in
memory only, never pickled. A process forked after keeping sessions never touches the parent's
(their sockets are the parent's): it drops them from the pool and holds on to them, so that
collecting them does not close the parent's connections either.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Hashable
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Session = TypeVar("Session")

MAX_IDLE_PER_KEY = 2
"""Idle sessions kept per key (a worker runs one task at a time)."""


class IdleSessions(Generic[Key, Session]):
    """Idle sessions of this process, by key; thread-safe."""

    def __init__(self, maxIdle: int = MAX_IDLE_PER_KEY) -> None:
        self.maxIdle = maxIdle
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._idle: dict[Key, list[Session]] = {}
        self._inherited: list[Session] = []

    def take(self, key: Key) -> Session | None:
        """An idle session of ``key`` (the caller checks it before use), or ``None``."""
        with self._lock:
            self._forkCheck()
            idle = self._idle.get(key)
            return idle.pop() if idle else None

    def keep(self, key: Key, session: Session) -> bool:
        """Keep a free session for the next task; ``False`` when ``key`` has enough (the
        caller then closes it)."""
        with self._lock:
            self._forkCheck()
            idle = self._idle.setdefault(key, [])
            if len(idle) >= self.maxIdle:
                return False
            idle.append(session)
            return True

    def count(self, key: Key) -> int:
        with self._lock:
            return len(self._idle.get(key) or [])

    def drain(self) -> list[Session]:
        """Every idle session, taken out of the pool for the caller to close."""
        with self._lock:
            self._forkCheck()
            sessions = [s for idle in self._idle.values() for s in idle]
            self._idle = {}
        return sessions

    def _forkCheck(self) -> None:
        if self._pid != os.getpid():  # forked: the sessions are the parent's; never touch them
            self._inherited.extend(s for idle in self._idle.values() for s in idle)
            self._idle = {}
            self._pid = os.getpid()


__all__ = ["MAX_IDLE_PER_KEY", "IdleSessions"]
