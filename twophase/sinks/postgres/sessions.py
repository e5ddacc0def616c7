"""Task connections of one worker process, reused from task to task: PostgreSQL's side.

After ``PREPARE TRANSACTION`` or a staging ``COMMIT`` a task's session holds nothing, so the
next task of the worker reuses it (``twophase.sinks.relational.sessions`` keeps it), saving the
connection set-up (TCP, authentication, the session settings) per task. The ``BEGIN`` of the
next task checks a reused session (the server may have restarted): a broken one is replaced by
a new connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from twophase.clients.postgres import ConnectionTarget, Secrets, connect
from twophase.redaction import getLogger
from twophase.resources import Resources
from twophase.sinks.relational.sessions import IdleSessions

log = getLogger(__name__)


@dataclass(eq=False)
class TaskSession:
    """A task's connection with what the sink learned of the server on it."""

    conn: psycopg.Connection[Any]
    maxPreparedTransactions: int
    lockTimeoutMs: int


class TaskSessions:
    """Idle task sessions of a process, by (target, secrets, lock timeout), kept in its
    :class:`Resources` (closed when they close); thread-safe."""

    def __init__(self, resources: Resources | None = None) -> None:
        self.resources = resources

    @property
    def _idle(self) -> IdleSessions[tuple[object, ...], TaskSession]:
        return (self.resources or Resources.ofProcess()).get(
            "postgres.taskSessions", IdleSessions, _closeAll
        )

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
        while (session := self._idle.take(key)) is not None:
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
        if not (free and self._idle.keep((target.params, secrets, session.lockTimeoutMs), session)):
            _close(session)

    def clear(self) -> None:
        """Close every idle session."""
        _closeAll(self._idle)


def _closeAll(idle: IdleSessions[tuple[object, ...], TaskSession]) -> None:
    for session in idle.drain():
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
"""The idle task sessions of the process's :class:`Resources` (holds nothing itself)."""
