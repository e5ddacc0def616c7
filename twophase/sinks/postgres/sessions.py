"""Task connections of one worker process, reused from task to task (in memory only).

PySpark reuses Python workers, so the next task of the same sink usually runs in a process
whose last task left a free session: after ``PREPARE TRANSACTION`` or a staging ``COMMIT`` the
session holds nothing. Reusing it saves the connection set-up (TCP, authentication, the
session settings) per task. The ``BEGIN`` of the next task checks a reused session (the
server may have restarted): a broken one is replaced by a new connection. Never pickled, never
persisted; a process forked after caching drops the parent's sessions without touching them.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from twophase.clients.postgres import ConnectionTarget, Secrets, connect
from twophase.redaction import getLogger

log = getLogger(__name__)

MAX_IDLE_PER_TARGET = 2
"""Idle sessions kept per connection target (a worker runs one task at a time)."""


@dataclass(eq=False)
class TaskSession:
    """A task's connection with what the sink learned of the server on it."""

    conn: psycopg.Connection[Any]
    maxPreparedTransactions: int
    lockTimeoutMs: int


class TaskSessions:
    """Idle task sessions of this process, by (target, secrets, lock timeout); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._idle: dict[tuple[object, ...], list[TaskSession]] = {}

    def take(
        self,
        target: ConnectionTarget,
        secrets: Secrets,
        *,
        lockTimeoutMs: int,
        retrySeconds: float,
        what: str,
    ) -> TaskSession:
        """A session to ``target`` with a transaction begun: a reused idle one, else a new one.

        A new session gets the sink's settings (UTC, ``lock_timeout``) once and reads the
        server's ``max_prepared_transactions``; the caller owns the session until ``give``.
        """
        key = (target.params, secrets, lockTimeoutMs)
        while True:
            with self._lock:
                if self._pid != os.getpid():  # forked: the sessions are the parent's
                    self._idle = {}
                    self._pid = os.getpid()
                idle = self._idle.get(key) or []
                session = idle.pop() if idle else None
            if session is None:
                break
            if _begun(session):
                return session
            _close(session)
        conn = connect(target, secrets, autocommit=True, retrySeconds=retrySeconds, what=what)
        try:
            # Instants travel as UTC wall-clock text (see encoding.utcWallClock).
            row = conn.execute(
                "SELECT set_config('lock_timeout', %s, false), set_config('TimeZone', 'UTC', "
                "false), current_setting('max_prepared_transactions')::int",
                (f"{lockTimeoutMs}ms",),
            ).fetchone()
            conn.execute("BEGIN")
        except BaseException:
            conn.close()
            raise
        return TaskSession(conn, int(row[2]) if row else 0, lockTimeoutMs)

    def give(self, target: ConnectionTarget, secrets: Secrets, session: TaskSession) -> None:
        """Return a session whose transaction is finished; anything else is closed."""
        conn = session.conn
        free = (
            not conn.closed
            and not conn.broken
            and conn.info.transaction_status == TransactionStatus.IDLE
        )
        key = (target.params, secrets, session.lockTimeoutMs)
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if free and self._pid == os.getpid() and len(idle) < MAX_IDLE_PER_TARGET:
                idle.append(session)
                return
        _close(session)

    def clear(self) -> None:
        """Close every idle session (tests; a worker just exits)."""
        with self._lock:
            sessions = [s for idle in self._idle.values() for s in idle]
            self._idle = {}
        for session in sessions:
            _close(session)


def _begun(session: TaskSession) -> bool:
    """``BEGIN`` on a reused session; ``False`` when the session turns out broken."""
    conn = session.conn
    if conn.closed or conn.broken or conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    try:
        conn.execute("BEGIN")
    except psycopg.Error:
        log.debug("postgres: a cached task session is broken; connecting again")
        return False
    return True


def _close(session: TaskSession) -> None:
    try:
        session.conn.close()
    except Exception:
        log.debug("postgres: closing a task session failed", exc_info=True)


TASK_SESSIONS = TaskSessions()
"""This process's idle task sessions."""
