"""Task connections of one worker process: which may serve the next task, and the check first.

The next task of a sink usually runs in the worker process whose last task left its connection
behind (``twophase.sinks.relational.sessions`` keeps it). Whether that connection can serve
again depends on the server:

- PostgreSQL: ``PREPARE TRANSACTION`` dissociates the prepared transaction from the session at
  once (any session can ``COMMIT PREPARED`` it), so the session is free and is kept for the
  next task. The next task pings it first; a broken one (server restarted, session killed) is
  closed and replaced by a new connection before the task writes.
- MySQL/MariaDB: after ``XA PREPARE`` the xid stays attached to its session, which can neither
  start another XA transaction (``XAER_RMFAIL``) nor let another connection commit the xid
  (``XAER_NOTA``) until it ends; only a disconnect detaches the xid safely (on MariaDB 10.11
  ``COM_RESET_CONNECTION`` detaches the xid from the InnoDB transaction, which then no commit
  reaches). These sessions are never kept; the engine, its dialect and its TLS choice are
  (``connections``).
"""

from __future__ import annotations

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy.engine import Connection, Engine

from twophase.clients.postgres_answers import pingAnswers
from twophase.redaction import getLogger
from twophase.resources import Resources
from twophase.sinks.relational.sessions import MAX_IDLE_PER_KEY, IdleSessions
from twophase.sinks.sql.connections import connect
from twophase.sinks.sql.dialect import DRIVER_ERRORS
from twophase.sinks.sql.settings import FAMILIES

log = getLogger(__name__)

MAX_IDLE_PER_ENGINE = MAX_IDLE_PER_KEY
"""Idle sessions kept per engine (a worker runs one task at a time)."""


def reusable(engine: Engine) -> bool:
    """Whether a session of ``engine`` may serve another task after its transaction is
    prepared: PostgreSQL yes, MySQL/MariaDB no (the session must end to detach the xid)."""
    return FAMILIES[engine.url.get_backend_name()] == "postgresql"


class TaskSessions:
    """Idle task sessions of a process, by engine, kept in its :class:`Resources` (ended when
    they close); thread-safe."""

    def __init__(self, resources: Resources | None = None) -> None:
        self.resources = resources

    @property
    def _idle(self) -> IdleSessions[Engine, Connection]:
        return (self.resources or Resources.ofProcess()).get(
            "sql.taskSessions", lambda: IdleSessions(MAX_IDLE_PER_ENGINE), _endAll
        )

    def take(self, engine: Engine, what: str, retrySeconds: float) -> Connection:
        """A connection for one task: a kept one that answers the dialect's ping (one round
        trip), else a new one (``connections.connect``: retried for ``retrySeconds``)."""
        while (conn := self._idle.take(engine)) is not None:
            if _alive(conn):
                return conn
            end(conn)
        return connect(engine, what, retrySeconds, self.resources)

    def give(self, engine: Engine, conn: Connection) -> None:
        """Take back a task's connection whose transaction is prepared or rolled back: kept
        when the server lets its session serve again and it holds nothing, else ended."""
        if not (reusable(engine) and _idle(conn) and self._idle.keep(engine, conn)):
            end(conn)

    def idleCount(self, engine: Engine) -> int:
        return self._idle.count(engine)

    def clear(self) -> None:
        """Close every idle session."""
        _endAll(self._idle)


def _endAll(idle: IdleSessions[Engine, Connection]) -> None:
    for conn in idle.drain():
        end(conn)


def end(conn: Connection) -> None:
    """End a task's session without the rollback SQLAlchemy would send on close: the server
    detaches a prepared XA transaction when its session ends, and keeps it. Never raises."""
    try:
        conn.invalidate()
        conn.close()
    except Exception:
        log.debug("sql: ending a task session failed", exc_info=True)


def serverSession(conn: Connection) -> int | None:
    """The server's id of the session behind ``conn`` (``CONNECTION_ID()``), as the MySQL
    drivers read it from the handshake: no round trip."""
    threadId = getattr(conn.connection.dbapi_connection, "thread_id", None)
    if not callable(threadId):
        return None
    try:
        value = threadId()
    except Exception:
        return None
    return value if isinstance(value, int) else None


def _idle(conn: Connection) -> bool:
    """A psycopg session that holds no transaction and is not known to be broken.

    ``PREPARE TRANSACTION`` (or ``ROLLBACK``) left the server session idle; SQLAlchemy's
    rollback then only ends its own bookkeeping (psycopg sends nothing on an idle session).
    """
    if conn.closed or conn.invalidated:
        return False
    try:
        conn.rollback()
        raw = conn.connection.dbapi_connection
    except DRIVER_ERRORS:
        return False
    return (
        isinstance(raw, psycopg.Connection)
        and not raw.closed
        and not raw.broken
        and raw.info.transaction_status == TransactionStatus.IDLE
    )


def _alive(conn: Connection) -> bool:
    """A kept session answers the dialect's ping within the engine's ``socketTimeout``;
    ``False`` when it turns out broken or silent."""
    try:
        raw = conn.connection.dbapi_connection
        return raw is not None and pingAnswers(conn.engine, raw)
    except DRIVER_ERRORS:
        log.debug("sql: a kept task session is broken; connecting again")
        return False


TASK_SESSIONS = TaskSessions()
"""The idle task sessions of the process's :class:`Resources` (holds nothing itself)."""


__all__ = ["MAX_IDLE_PER_ENGINE", "TASK_SESSIONS", "TaskSessions", "end", "reusable"]
