"""The driver's PostgreSQL connections: kept across commits, their trouble made retryable.

The coordinator commits handles from a thread pool and recovery commits many, so each process
keeps idle autocommit connections (in its :class:`~twophase.resources.Resources`) instead of
paying TCP and SCRAM per handle; connection trouble inside a commit becomes
``TransientCommitError``, which the coordinator retries.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import psycopg
from psycopg import errors as pgerrors
from psycopg.pq import TransactionStatus

from twophase.clients.postgres import (
    AnswerWatch,
    ConnectionTarget,
    PostgresUnavailableError,
    Secrets,
    connect,
    errorText,
)
from twophase.protocol import TransientCommitError
from twophase.redaction import getLogger, redact
from twophase.resources import Resources

log = getLogger(__name__)


class _IdleConnections:
    """The idle driver connections of one process, by (target, secrets)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: dict[tuple[object, ...], list[psycopg.Connection[Any]]] = {}

    def close(self) -> None:
        with self.lock:
            conns = [c for idle in self.idle.values() for c in idle]
            self.idle = {}
        for conn in conns:
            try:
                conn.close()
            except Exception:  # best effort: the server ends the session when the socket goes
                log.debug("postgres: closing a driver connection failed", exc_info=True)


class DriverConnections:
    """Autocommit connections of a process, reused across commits (thread-safe), kept in its
    :class:`Resources` and closed with them.

    The coordinator commits handles from a thread pool, and recovery commits many: a fresh
    connection (TCP plus SCRAM) per handle would dominate the commit time. Broken connections
    are dropped, so a server restart costs one failed (retried) call.
    """

    maxIdle: ClassVar[int] = 16

    def __init__(self, resources: Resources | None = None) -> None:
        self.resources = resources

    def _pool(self) -> _IdleConnections:
        return (self.resources or Resources.ofProcess()).get(
            "postgres.driverConnections", _IdleConnections, _IdleConnections.close
        )

    @contextmanager
    def borrow(
        self,
        target: ConnectionTarget,
        secrets: Secrets,
        what: str,
        retrySeconds: float = 0.0,
        socketTimeout: float = 0.0,
    ) -> Iterator[psycopg.Connection[Any]]:
        """An idle autocommit connection to ``target`` (or a new one), returned when done; the
        block's wait for answers bounded by ``socketTimeout`` (``AnswerWatch``)."""
        key = (target.params, secrets)
        pool = self._pool()
        with pool.lock:
            idle = pool.idle.get(key) or []
            conn = idle.pop() if idle else None
        if conn is None or conn.closed or conn.broken:
            conn = connect(target, secrets, autocommit=True, retrySeconds=retrySeconds, what=what)
        watch = AnswerWatch(socketTimeout, lambda: conn, f"postgres: {what} at {target.describe()}")
        try:
            with watch:
                yield conn
        finally:
            if watch.fired:
                conn.close()  # its socket may be shut down: never reuse it
            healthy = (
                not conn.closed
                and not conn.broken
                and conn.info.transaction_status == TransactionStatus.IDLE
            )
            kept = False
            pool = self._pool()  # the one of now: a closed pool's connection is closed
            with pool.lock:
                idle = pool.idle.setdefault(key, [])
                if healthy and len(idle) < self.maxIdle:
                    idle.append(conn)
                    kept = True
            if not kept:
                conn.close()


DRIVER_CONNECTIONS = DriverConnections()
"""The driver-side connections of the process's :class:`Resources` (holds nothing itself)."""


@contextmanager
def driverErrors(what: str, target: ConnectionTarget) -> Iterator[None]:
    """Connection trouble inside the block becomes ``TransientCommitError`` (retried), raised
    from a ``PostgresUnavailableError`` that tells the command line the system and the fix."""
    try:
        yield
    except PostgresUnavailableError as exc:
        raise TransientCommitError(str(exc)) from exc  # the cause says the system and the fix
    except psycopg.OperationalError as exc:
        if isinstance(exc, pgerrors.LockNotAvailable | pgerrors.QueryCanceled):
            raise TransientCommitError(f"postgres: {what}: {redact(str(exc))}") from None
        said = f"postgres: {what}: connection to {target.describe()} failed: {errorText(exc)}"
        # The driver's own error stays out of logs, as before; ours says the system and fix.
        raise TransientCommitError(said) from PostgresUnavailableError(said)


__all__ = ["DRIVER_CONNECTIONS", "DriverConnections", "driverErrors"]
