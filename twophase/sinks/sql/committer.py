"""The driver half of the sql sink: commit or roll back prepared transactions by xid.

A prepared XA transaction (MariaDB >= 10.5, MySQL >= 5.7) or PostgreSQL prepared transaction
survives its session, the executor and a server restart, so any process with a handle and the
sink's options can finish it through SQLAlchemy's dialect (``do_commit_twophase(...,
recover=True)``) on an autocommit connection.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from twophase.protocol import (
    CommitStatus,
    Committer,
    Handle,
    Prepared,
    RecoveryScope,
    TransactionLostError,
    TransientCommitError,
)
from twophase.redaction import getLogger
from twophase.resources import Resources
from twophase.sinks.relational.naming import TransactionName, batchPrefix, sinkPrefix
from twophase.sinks.sql.connections import (
    connection,
    engineFor,
    isTimeout,
    isUnavailable,
    noAnswer,
)
from twophase.sinks.sql.dialect import (
    DRIVER_ERRORS,
    errorMessage,
    isUnknownXid,
    markerTable,
    preparedXids,
)
from twophase.sinks.sql.errors import SqlSinkError, SqlUnavailableError
from twophase.sinks.sql.handles import (
    KIND,
    checkHandle,
    foundHandle,
    handleUrl,
    preparingSession,
)
from twophase.sinks.sql.settings import SqlSettings

log = getLogger(__name__)

ATTACHED_WAIT_SECONDS = 30.0
"""How long a commit waits for a prepared xid still attached to the session that prepared it.

MariaDB refuses ``XA COMMIT`` from another connection (``XAER_NOTA``) until the preparing
session has ended; the task closes it right after ``XA PREPARE``, so this is the time the
server takes to notice that."""


SESSION_END_WAIT_SECONDS = 2.0
"""How long a commit waits for the session that prepared an xid to leave the server's process
list before its ``XA COMMIT`` (MySQL family).

MariaDB ends a session in steps: it hands the xid to XA (``XA COMMIT`` from another
connection stops answering ``XAER_NOTA``), takes the session out of the process list, then
detaches the InnoDB transaction. An ``XA COMMIT`` that comes before the last step is answered
OK and does nothing (``detachedXid``), so the commit first waits for the session to be gone,
then ``SESSION_END_GRACE_SECONDS`` more when it saw it. A session id still listed after this
wait belongs to a new session after a server restart (ids start again from 1), or to one
whose client is gone unnoticed; the commit then goes ahead (the xid is either the server's
own again, or still attached: ``XAER_NOTA``)."""

SESSION_END_GRACE_SECONDS = 0.05
"""After the preparing session left the process list: the rest of its end, which runs on
without a further step anyone else can see."""


class SqlCommitter(Committer):
    """Every method idempotent, in any process: finish the prepared transactions of a sink.

    - ``commit`` of an xid that is not prepared any more reads the commit marker its
      transaction wrote: there, the commit happened before (a no-op, logged at INFO); absent,
      the transaction was rolled back: ``TransactionLostError``.
    - ``recoverAndAbort`` (the framework's sweep over ``listPrepared``) rolls back only xids
      with this sink's prefix.
    - An unreachable server raises ``TransientCommitError`` (the coordinator retries).
    """

    kind: ClassVar[str] = KIND

    def __init__(self, settings: SqlSettings, resources: Resources | None = None) -> None:
        self.settings = settings
        self.resources = resources
        """Pooled engines: kept in ``resources`` (the process's unless given)."""

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> SqlCommitter:
        return cls(SqlSettings.fromOptions(options))

    def __repr__(self) -> str:
        s = self.settings
        return f"SqlCommitter(table={s.qualifiedName}, mode={s.mode}, at={s.describe()})"

    def _engine(self, handle: Handle | None = None) -> sa.Engine:
        s = self.settings
        url = s.url if handle is None else handleUrl(handle, s)
        return engineFor(
            url,
            pooled=True,
            connectTimeout=s.connectTimeout,
            socketTimeout=s.socketTimeout,
            resources=self.resources,
        )

    def _connection(self, what: str) -> contextlib.AbstractContextManager[Connection]:
        """A connection of the settings' own engine, in autocommit (XA statements)."""
        return connection(self._engine(), what, autocommit=True, resources=self.resources)

    def commit(self, handle: Handle) -> CommitStatus | None:
        """Idempotent: commit the prepared xid; one no longer prepared is checked (marker):
        ``ALREADY_COMMITTED`` when its marker is there."""
        h = checkHandle(handle)
        xid = h["xid"]
        if xid is None:
            return None
        what = f"commit of {self.describe(h)}"
        engine = self._engine(h)
        deadline = time.monotonic() + ATTACHED_WAIT_SECONDS
        try:
            with connection(engine, what, autocommit=True, resources=self.resources) as conn:
                if self.settings.family == "mysql":
                    awaitSessionEnd(conn, preparingSession(h))
                while True:
                    try:
                        engine.dialect.do_commit_twophase(conn, xid, is_prepared=True, recover=True)
                        self._checkCommitted(conn, xid, what)
                        log.debug("sql: committed %s", xid)
                        return None
                    except Exception as exc:  # the psycopg dialect raises psycopg's own
                        if not isUnknownXid(exc, self.settings.family):
                            raise
                    if not self._stillPrepared(conn, xid):
                        break
                    if time.monotonic() > deadline:
                        raise TransientCommitError(
                            f"sql: {what}: the xid is prepared but still attached to the "
                            f"session that prepared it after {ATTACHED_WAIT_SECONDS:g} s"
                        )
                    time.sleep(0.05)
                if self._markerExists(conn, xid):
                    log.info(
                        "sql: %s: not prepared any more, marker found: already committed", what
                    )
                    return CommitStatus.ALREADY_COMMITTED
                if self._markerHeld(conn, xid):
                    raise TransientCommitError(detachedXid(what, xid))
        except SqlUnavailableError as exc:
            raise TransientCommitError(str(exc)) from exc  # the cause says the system
        except DRIVER_ERRORS as exc:
            if isTimeout(exc):
                said = f"sql: {what}: {noAnswer(self.settings.socketTimeout)}: {errorMessage(exc)}"
                raise TransientCommitError(said) from SqlUnavailableError(said)
            if isUnavailable(exc):
                said = f"sql: {what}: {errorMessage(exc)}"
                raise TransientCommitError(said) from SqlUnavailableError(said)
            raise SqlSinkError(f"sql: {what}: {errorMessage(exc)}") from None
        raise TransactionLostError(
            f"sql: {what}: the xid is neither prepared on the server nor committed (no marker "
            f"in {self.settings.markerTable}): it was rolled back (by hand, or by another "
            "process's recovery), so its rows are lost; the batch is decided and cannot be "
            "written again"
        )

    def _stillPrepared(self, conn: Connection, xid: str) -> bool:
        return xid in preparedXids(conn, self.settings.family, xid)

    def _checkCommitted(self, conn: Connection, xid: str, what: str) -> None:
        """After an ``XA COMMIT`` the server answered OK, its marker must be readable.

        MariaDB 10.11 answers OK to an ``XA COMMIT`` that reaches the xid while the session
        that prepared it is still ending, yet leaves the InnoDB transaction prepared, out of
        ``XA RECOVER``, its rows invisible and its locks held until the server restarts (when
        InnoDB gives the xid back to XA). Such a commit is not done: the coordinator tries
        again. PostgreSQL has no such window: nothing is read."""
        if self.settings.family == "mysql" and not self._markerExists(conn, xid):
            raise TransientCommitError(detachedXid(what, xid))

    def _markerHeld(self, conn: Connection, xid: str) -> bool:
        """Whether a transaction that is neither committed nor in ``XA RECOVER`` holds the
        xid's marker row (MySQL family): a locking read of it waits out a one-second lock
        wait (error 1205) instead of finding nothing."""
        if self.settings.family != "mysql":
            return False
        s = self.settings
        markers = markerTable(s.markerTable, s.schema)
        conn.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1")
        try:
            conn.execute(
                sa.select(markers.c.xid).where(markers.c.xid == xid).with_for_update()
            ).first()
        except DRIVER_ERRORS as exc:
            if lockWaitTimedOut(exc):
                return True
            raise
        finally:
            conn.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = DEFAULT")
        return False

    def _markerExists(self, conn: Connection, xid: str) -> bool:
        s = self.settings
        markers = markerTable(s.markerTable, s.schema)
        row = conn.execute(sa.select(markers.c.xid).where(markers.c.xid == xid)).first()
        return row is not None

    def abort(self, handle: Handle) -> None:
        """Idempotent: roll back the prepared xid; one not prepared is a no-op."""
        h = checkHandle(handle)
        xid = h["xid"]
        if xid is None:
            return
        what = f"abort of {self.describe(h)}"
        engine = self._engine(h)
        with connection(engine, what, autocommit=True, resources=self.resources) as conn:
            if self.settings.family == "mysql":  # a rollback meets the same end as a commit
                awaitSessionEnd(conn, preparingSession(h))
            self._rollback(conn, xid)

    def _rollback(self, conn: Connection, xid: str) -> bool:
        try:
            conn.engine.dialect.do_rollback_twophase(conn, xid, is_prepared=True, recover=True)
        except DRIVER_ERRORS as exc:
            if isUnknownXid(exc, self.settings.family):
                return False  # finished meanwhile, or never prepared
            raise SqlSinkError(f"sql: rollback of {xid}: {errorMessage(exc)}") from None
        return True

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle]:
        """Idempotent: the framework's sweep (``listPrepared``, ``abortPrepared``); after a
        batch (``scope.batchId``), prune old commit markers."""
        aborted = list(super().recoverAndAbort(scope) or ())
        if scope.batchId is not None:
            what = f"recoverAndAbort of sql sink {scope.sinkId}"
            with self._driverErrors(what), self._connection(what) as c:
                self._pruneMarkers(c, scope.sinkId, scope.batchId)
        return aborted

    def preparedNames(self, handle: Handle) -> tuple[str, ...]:
        """What a handle names on the server: its xid."""
        return preparedNames(handle)

    def listPrepared(self, scope: RecoveryScope) -> list[Prepared]:
        """Read-only: this sink's prepared xids (``XA RECOVER``, or ``pg_prepared_xacts`` of the
        sink's database with their age), all batches or only ``scope.batchId``."""
        s = self.settings
        prefix = (
            sinkPrefix(scope.sinkId)
            if scope.batchId is None
            else batchPrefix(scope.sinkId, scope.batchId)
        )
        since: dict[str, datetime] = {}
        what = f"listing of sql sink {scope.sinkId}"
        with self._driverErrors(what), self._connection(what) as conn:
            xids = preparedXids(conn, s.family, prefix)
            if s.family == "postgresql" and xids:
                rows = conn.execute(
                    sa.text("SELECT gid, prepared FROM pg_prepared_xacts WHERE gid = ANY(:g)"),
                    {"g": xids},
                )
                since = {str(g): p for g, p in rows}
        found = []
        for xid in xids:
            parts = TransactionName.parse(xid)
            ours = parts is not None and parts.sinkId == scope.sinkId
            found.append(
                Prepared(
                    xid,
                    foundHandle(xid, s),
                    batchId=parts.batchId if ours and parts else None,
                    partitionId=parts.partitionId if ours and parts else None,
                    since=since.get(xid),
                    detail=f"{s.url.get_backend_name()} database {s.url.database}",
                    madeBySink=ours,
                )
            )
        return found

    def abortPrepared(self, item: Prepared) -> bool:
        """Idempotent: roll back a listed xid; ``False`` when it was finished meanwhile."""
        what = f"recoverAndAbort of {item.name}"
        with self._driverErrors(what), self._connection(what) as conn:
            return self._rollback(conn, item.name)

    @contextmanager
    def _driverErrors(self, what: str) -> Iterator[None]:
        """An unreachable server becomes ``TransientCommitError`` (the coordinator retries)."""
        try:
            yield
        except SqlUnavailableError as exc:
            raise TransientCommitError(str(exc)) from exc  # the cause says the system

    def _pruneMarkers(self, conn: Connection, sinkId: str, batchId: int) -> None:
        """Delete this sink's markers of batches other than ``batchId`` and the one before.

        Batches commit in order: once batch N is decided no commit asks for a marker of an
        earlier batch but N-1 (kept for margin); a higher id is from an earlier query."""
        s = self.settings
        m = markerTable(s.markerTable, s.schema)
        # Read the committed markers first, then delete them by key: a DELETE by sink would
        # wait for the row locks of markers still in prepared transactions.
        old = (
            conn.execute(
                sa.select(m.c.xid).where(
                    m.c.sink_id == sinkId,
                    sa.or_(m.c.batch_id < batchId - 1, m.c.batch_id > batchId),
                )
            )
            .scalars()
            .all()
        )
        for start in range(0, len(old), 500):
            conn.execute(sa.delete(m).where(m.c.xid.in_(old[start : start + 500])))

    def describe(self, handle: Handle) -> str:
        rows = f"{handle['rows']} row(s)" if "rows" in handle else "a prepared transaction"
        return (
            f"sql batch {handle.get('batchId')} partition {handle.get('partitionId')} attempt "
            f"{handle.get('attempt')}: {rows} into {handle.get('table')} as {handle.get('xid')}"
        )


def awaitSessionEnd(conn: Connection, session: int | None) -> None:
    """Wait, at most ``SESSION_END_WAIT_SECONDS``, for the MySQL-family session that prepared
    an xid to leave the process list (a role sees its own sessions there without ``PROCESS``),
    so that no ``XA COMMIT`` meets the end of that session."""
    if session is None:
        return
    query = "SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = %s"
    deadline = time.monotonic() + SESSION_END_WAIT_SECONDS
    seen = False
    while conn.exec_driver_sql(query, (session,)).first() is not None:
        seen = True
        if time.monotonic() > deadline:
            log.debug("sql: session %d still listed; committing anyway", session)
            return
        time.sleep(0.01)
    if seen:
        time.sleep(SESSION_END_GRACE_SECONDS)


def detachedXid(what: str, xid: str) -> str:
    """The message of a prepared transaction the server holds but no ``XA COMMIT`` reaches."""
    return (
        f"sql: {what}: the server answered XA COMMIT of {xid} but did not commit it: its "
        "InnoDB transaction stays prepared (its rows invisible, its locks held) while XA no "
        "longer lists the xid (a MariaDB 10.11 race with the end of the session that prepared "
        "it). Restart the server: it gives the xid back to XA RECOVER and the next commit "
        "finishes it; nothing is lost"
    )


def lockWaitTimedOut(exc: BaseException) -> bool:
    """MySQL/MariaDB's ``Lock wait timeout exceeded`` (error 1205)."""
    args: tuple[object, ...] = tuple(getattr(getattr(exc, "orig", exc), "args", ()))
    return bool(args) and args[0] == 1205


def preparedNames(handle: Handle) -> tuple[str, ...]:
    """What a logged handle names on the server: its xid."""
    xid = handle.get("xid") if handle.get("kind") == KIND else None
    return (xid,) if isinstance(xid, str) else ()


__all__ = ["SqlCommitter", "preparedNames"]
