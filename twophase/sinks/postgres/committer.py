"""The driver half of the postgres sink: ``COMMIT PREPARED`` by gid, or the staged rows' move.

A prepared transaction survives its session, the executor and a server restart, so any process
with a handle (and the sink's options) can finish it, on a reused autocommit connection. A
staged handle's rows are durable in the staging table; its commit moves them into the target
with a marker in one transaction (``staging``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql

from twophase.clients.postgres import ConnectionTarget
from twophase.clients.postgres_driver import DriverConnections, driverErrors
from twophase.protocol import (
    CommitStatus,
    Committer,
    Handle,
    Prepared,
    RecoveryScope,
    TransactionLostError,
)
from twophase.protocol.errors import SinkFailure
from twophase.redaction import getLogger, redact
from twophase.resources import Resources
from twophase.sinks.postgres.dialect import parseTableName
from twophase.sinks.postgres.errors import PostgresSinkError, RowRejectedError
from twophase.sinks.postgres.handles import (
    KIND,
    briefHandle,
    briefStagedHandle,
    checkHandle,
    handleTarget,
    isStaged,
    xactStatus,
)
from twophase.sinks.postgres.privileges import finishRefused
from twophase.sinks.postgres.rejections import (
    describe,
    fixFor,
    rejectionOf,
    stagedConflict,
    withoutRowData,
)
from twophase.sinks.postgres.settings import PostgresSettings
from twophase.sinks.postgres.staging import (
    StagingNames,
    deleteToken,
    markerExists,
    markerInsert,
    moveStatement,
    pruneMarkers,
    stagedTokens,
)
from twophase.sinks.relational.naming import TransactionName as GlobalXid
from twophase.sinks.relational.naming import batchPrefix, sinkPrefix

log = getLogger(__name__)


class PostgresCommitter(Committer):
    """Every method idempotent, in any process: finish the prepared transactions of a sink.

    - ``commit`` of a gid that is no longer prepared asks the server what became of the
      transaction (``pg_xact_status``): committed (or too old to know) is a no-op, logged at
      INFO, because the coordinator only commits decided handles; rolled back raises
      ``TransactionLostError``.
    - ``recoverAndAbort`` (the framework's sweep over ``listPrepared``) touches only gids and
      staging tokens with this sink's prefix, in the sink's database.
    - An unreachable server raises ``TransientCommitError`` (the coordinator retries).
    """

    kind: ClassVar[str] = KIND

    def __init__(self, settings: PostgresSettings, resources: Resources | None = None) -> None:
        self.settings = settings
        self.connections = DriverConnections(resources)
        """Driver connections, kept in ``resources`` (the process's unless given)."""

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> PostgresCommitter:
        return cls(PostgresSettings.fromOptions(options))

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"PostgresCommitter(table={s.qualifiedName}, mode={s.mode}, at={s.target.describe()})"
        )

    def commit(self, handle: Handle) -> CommitStatus | None:
        """Idempotent: ``COMMIT PREPARED``; a gid no longer prepared is checked.

        The coordinator commits only decided handles, so a gid that is not prepared any more
        was committed by an earlier call: logged at INFO, nothing done. When the server says
        the transaction was rolled back instead, ``TransactionLostError``. Unreachable server:
        ``TransientCommitError``. Returns ``ALREADY_COMMITTED`` for a commit found done before.
        """
        h = checkHandle(handle)
        if isStaged(h):
            return self._commitStaged(h)
        if h["gid"] is None:
            return None
        target, secrets = handleTarget(h, self.settings)
        what = f"commit of {self.describe(h)}"
        with (
            driverErrors(what, target),
            self.connections.borrow(
                target, secrets, what, socketTimeout=self.settings.socketTimeout
            ) as conn,
        ):
            try:
                conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(h["gid"])))
            except pgerrors.UndefinedObject:
                status = xactStatus(conn, h.get("xid"))
                if status == "aborted":
                    raise TransactionLostError(
                        f"postgres: {what}: the prepared transaction was rolled back on the "
                        "server (by hand, or by another process's recovery), so its rows are "
                        "lost; the batch is decided and cannot be written again"
                    ) from None
                log.info(
                    "postgres: %s: not prepared any more (transaction status %s): already "
                    "committed",
                    what,
                    status or "unknown",
                )
                return CommitStatus.ALREADY_COMMITTED
            except pgerrors.InsufficientPrivilege:
                raise finishRefused(conn, h["gid"], "COMMIT PREPARED", what) from None
        log.debug("postgres: committed %s", h["gid"])
        return None

    def _commitStaged(self, h: Handle) -> CommitStatus | None:
        """Idempotent: move a token's staged rows into the target with a marker, at once.

        No rows left and a marker: committed before, a no-op. No rows and no marker: the rows
        were aborted or swept, ``TransactionLostError``. A constraint of the target that
        refuses a row (a unique key, a foreign key) fails the commit with the constraint
        named; the decided rows stay staged until the cause is fixed and the query restarts.
        """
        target, secrets = handleTarget(h, self.settings)
        names = StagingNames.fromHandle(h)
        token = str(h["token"])
        parts = GlobalXid.parse(token)
        assert parts is not None  # checkHandle
        what = f"commit of {self.describe(h)}"
        table = sql.Identifier(*_tableParts(str(h.get("table")), self.settings))
        move = moveStatement(names, table, list(h["columns"]), list(h["keys"]))
        with (
            driverErrors(what, target),
            self.connections.borrow(
                target, secrets, what, socketTimeout=self.settings.socketTimeout
            ) as conn,
        ):
            try:
                with conn.transaction():
                    conn.execute(
                        "SELECT set_config('lock_timeout', %s, true)",
                        (f"{int(self.settings.lockTimeoutSeconds * 1000)}ms",),
                    )
                    row = conn.execute(move, {"token": token}).fetchone()
                    moved = int(row[0]) if row else 0
                    if moved == 0:
                        if markerExists(conn, names, token):
                            log.info("postgres: %s: moved before (marker found): no-op", what)
                            return CommitStatus.ALREADY_COMMITTED
                        if h["rows"] > 0:
                            raise TransactionLostError(
                                f"postgres: {what}: its staged rows are gone from "
                                f"{names.stagingText} and {names.markersText} has no marker "
                                "for it: they were aborted (by hand, or by another process's "
                                "recovery), so its rows are lost; the batch is decided and "
                                "cannot be written again"
                            )
                    if moved != h["rows"]:
                        raise PostgresSinkError(
                            f"postgres: {what}: found {moved} staged row(s) for the token, "
                            f"the task reported {h['rows']}; nothing moved. Was "
                            f"{names.stagingText} changed by hand?"
                        )
                    conn.execute(markerInsert(names), (token, parts.sinkId, parts.batchId, moved))
            except (pgerrors.IntegrityError, pgerrors.DataError) as exc:
                rejection = stagedConflict(
                    conn, names, table, token, rejectionOf(exc), list(h["keys"])
                )
                raise RowRejectedError(
                    redact(
                        f"postgres: {what}: the target refused staged "
                        f"{describe(rejection, int(h.get('partitionId', -1)))}. The batch is "
                        "decided: this partition's rows stay in the staging table and none of "
                        "them is visible. Fix: "
                        f"{fixFor(rejection, str(h.get('table')), staged=True)}."
                    )
                ) from withoutRowData(exc)
            except pgerrors.InsufficientPrivilege as exc:
                raise PostgresSinkError(
                    f"postgres: {what}: {exc.diag.message_primary}; the committing user needs "
                    f"DELETE on {names.stagingText}, SELECT and INSERT on {names.markersText} "
                    "and INSERT (UPDATE in upsert mode) on the target",
                    reason=SinkFailure.CREDENTIALS,
                ) from None
        log.debug("postgres: moved %d staged row(s) of %s", h["rows"], token)
        return None

    def abort(self, handle: Handle) -> None:
        """Idempotent: ``ROLLBACK PREPARED``, or delete the staged rows; gone is a no-op."""
        h = checkHandle(handle)
        if isStaged(h):
            target, secrets = handleTarget(h, self.settings)
            what = f"abort of {self.describe(h)}"
            with (
                driverErrors(what, target),
                self.connections.borrow(
                    target, secrets, what, socketTimeout=self.settings.socketTimeout
                ) as conn,
            ):
                deleteToken(conn, StagingNames.fromHandle(h), str(h["token"]))
            return
        if h["gid"] is None:
            return
        target, secrets = handleTarget(h, self.settings)
        what = f"abort of {self.describe(h)}"
        with (
            driverErrors(what, target),
            self.connections.borrow(
                target, secrets, what, socketTimeout=self.settings.socketTimeout
            ) as conn,
        ):
            try:
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(h["gid"])))
            except pgerrors.UndefinedObject:
                log.debug("postgres: %s: not prepared (already finished)", what)
                return
            except pgerrors.InsufficientPrivilege:
                raise finishRefused(conn, h["gid"], "ROLLBACK PREPARED", what) from None
        log.debug("postgres: rolled back %s", h["gid"])

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle]:
        """Idempotent: the framework's sweep (``listPrepared``, ``abortPrepared``); after a
        batch's decision (``scope.batchId``), also prune the commit markers no commit can ask
        for any more. Returns one brief handle per transaction rolled back or token deleted.
        """
        aborted = list(super().recoverAndAbort(scope) or ())
        if scope.batchId is not None:
            s = self.settings
            what = f"recoverAndAbort of postgres sink {scope.sinkId}"
            with self._connection(what) as conn:
                pruned = pruneMarkers(conn, StagingNames.of(s), scope.sinkId, scope.batchId)
            if pruned:
                log.debug("postgres: pruned %d commit marker(s) of sink %s", pruned, scope.sinkId)
        return aborted

    def preparedNames(self, handle: Handle) -> tuple[str, ...]:
        """What a handle names on the server: its staging token, else its gid."""
        return preparedNames(handle)

    def listPrepared(self, scope: RecoveryScope) -> list[Prepared]:
        """Read-only: this sink's prepared transactions (``pg_prepared_xacts``, every database
        of the server; one in another database is foreign: recovery of this sink connects only
        to its own) and its staged tokens, all batches or only ``scope.batchId``."""
        s = self.settings
        prefix = (
            sinkPrefix(scope.sinkId)
            if scope.batchId is None
            else batchPrefix(scope.sinkId, scope.batchId)
        )
        names = StagingNames.of(s)
        what = f"listing of postgres sink {scope.sinkId}"
        with self._connection(what) as conn:
            rows = conn.execute(
                "SELECT gid, prepared, database, database = current_database(), owner"
                " FROM pg_prepared_xacts WHERE starts_with(gid, %s) ORDER BY prepared",
                (prefix,),
            ).fetchall()
            staged = stagedTokens(conn, names, scope.sinkId, scope.batchId)
        elsewhere = sorted({str(r[2]) for r in rows if not r[3]})
        if elsewhere:
            log.warning(
                "postgres: sink %s has prepared transactions in other databases %s; "
                "connect a recovery to each (twophase recover with its url) to finish them",
                scope.sinkId,
                elsewhere,
            )
        found = [
            _listed(
                str(gid),
                briefHandle(str(gid), s),
                scope.sinkId,
                what="prepared transaction",
                since=prepared,
                detail=f"database {database}, owner {owner}",
                foreign=None
                if here
                else f"it is prepared in database {database}, and recovery of this sink "
                "only connects to its own; run twophase recover with a url naming "
                f"database {database}",
            )
            for gid, prepared, database, here, owner in rows
        ]
        found.extend(
            _listed(
                token,
                briefStagedHandle(token, count, s),
                scope.sinkId,
                what="staged rows",
                detail=f"{count} row(s) in {names.stagingText}",
            )
            for token, count in staged
        )
        return found

    def abortPrepared(self, item: Prepared) -> bool:
        """Idempotent: ``ROLLBACK PREPARED`` a listed gid, or delete a listed token's staged
        rows; ``False`` when it was finished meanwhile by another process."""
        with self._connection(f"recoverAndAbort of {item.name}") as conn:
            if isStaged(item.handle):
                return deleteToken(conn, StagingNames.of(self.settings), item.name) > 0
            try:
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(item.name)))
            except pgerrors.UndefinedObject:
                return False
            except pgerrors.InsufficientPrivilege:
                raise finishRefused(
                    conn, item.name, "ROLLBACK PREPARED", f"recoverAndAbort of {item.name}"
                ) from None
        return True

    @contextmanager
    def _connection(self, what: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection to the sink's own server; trouble reaching it is transient."""
        s = self.settings
        with (
            driverErrors(what, s.target),
            self.connections.borrow(
                s.target, s.secrets, what, socketTimeout=s.socketTimeout
            ) as conn,
        ):
            yield conn

    def describe(self, handle: Handle) -> str:
        """``postgres batch N partition p attempt a: r row(s) into <table> as <gid> at <where>``."""
        try:
            where = ConnectionTarget.fromJson(handle.get("connection")).describe()
        except ValueError:
            where = "?"
        rows = f"{handle['rows']} row(s)" if "rows" in handle else "a prepared transaction"
        how = f"staged as {handle.get('token')}" if isStaged(handle) else f"as {handle.get('gid')}"
        return (
            f"postgres batch {handle.get('batchId')} partition {handle.get('partitionId')} "
            f"attempt {handle.get('attempt')}: {rows} into {handle.get('table')} {how} "
            f"at {where}"
        )


def preparedNames(handle: Handle) -> tuple[str, ...]:
    """What a logged handle names on the server: its staging token, else its gid."""
    if handle.get("kind") != KIND:
        return ()
    name = handle.get("token") if isStaged(handle) else handle.get("gid")
    return (name,) if isinstance(name, str) else ()


def _listed(name: str, handle: Handle, sinkId: str, *, what: str, **found: Any) -> Prepared:
    """A listed gid or token, with the batch and partition its name gives when the sink made
    it (``madeBySink`` false for a name with the sink's prefix that it does not make)."""
    parts = GlobalXid.parse(name)
    ours = parts is not None and parts.sinkId == sinkId
    return Prepared(
        name,
        handle,
        what=what,
        batchId=parts.batchId if ours and parts else None,
        partitionId=parts.partitionId if ours and parts else None,
        madeBySink=ours,
        **found,
    )


def _tableParts(text: str, s: PostgresSettings) -> tuple[str, str]:
    """The handle's target table (schema, name); the settings' when it names the same."""
    if text == s.qualifiedName:
        return s.schema, s.table
    return parseTableName(text)
