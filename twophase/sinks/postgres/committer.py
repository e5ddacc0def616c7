"""The driver half of the postgres sink: ``COMMIT PREPARED`` by gid, or the staged rows' move.

A prepared transaction survives its session, the executor and a server restart, so any process
with a handle (and the sink's options) can finish it, on a reused autocommit connection. A
staged handle's rows are durable in the staging table; its commit moves them into the target
with a marker in one transaction (``staging``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from psycopg import errors as pgerrors
from psycopg import sql

from twophase.clients.postgres import DRIVER_CONNECTIONS, ConnectionTarget, driverErrors
from twophase.protocol import Committer, Handle, RecoveryScope, TransactionLostError
from twophase.redaction import getLogger, redact
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
    sweepStaged,
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
    - ``recoverAndAbort`` touches only gids with this sink's prefix, in the sink's database.
    - An unreachable server raises ``TransientCommitError`` (the coordinator retries).
    """

    kind: ClassVar[str] = KIND

    def __init__(self, settings: PostgresSettings) -> None:
        self.settings = settings

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> PostgresCommitter:
        return cls(PostgresSettings.fromOptions(options))

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"PostgresCommitter(table={s.qualifiedName}, mode={s.mode}, at={s.target.describe()})"
        )

    def commit(self, handle: Handle) -> None:
        """Idempotent: ``COMMIT PREPARED``; a gid no longer prepared is checked.

        The coordinator commits only decided handles, so a gid that is not prepared any more
        was committed by an earlier call: logged at INFO, nothing done. When the server says
        the transaction was rolled back instead, ``TransactionLostError``. Unreachable server:
        ``TransientCommitError``.
        """
        h = checkHandle(handle)
        if isStaged(h):
            self._commitStaged(h)
            return
        if h["gid"] is None:
            return
        target, secrets = handleTarget(h, self.settings)
        what = f"commit of {self.describe(h)}"
        with (
            driverErrors(what, target),
            DRIVER_CONNECTIONS.borrow(
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
                return
            except pgerrors.InsufficientPrivilege as exc:
                raise PostgresSinkError(
                    f"postgres: {what}: {exc.diag.message_primary}; connect as the role that "
                    "prepared it (or a superuser)"
                ) from None
        log.debug("postgres: committed %s", h["gid"])

    def _commitStaged(self, h: Handle) -> None:
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
            DRIVER_CONNECTIONS.borrow(
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
                            return
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
                    "and INSERT (UPDATE in upsert mode) on the target"
                ) from None
        log.debug("postgres: moved %d staged row(s) of %s", h["rows"], token)

    def abort(self, handle: Handle) -> None:
        """Idempotent: ``ROLLBACK PREPARED``, or delete the staged rows; gone is a no-op."""
        h = checkHandle(handle)
        if isStaged(h):
            target, secrets = handleTarget(h, self.settings)
            what = f"abort of {self.describe(h)}"
            with (
                driverErrors(what, target),
                DRIVER_CONNECTIONS.borrow(
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
            DRIVER_CONNECTIONS.borrow(
                target, secrets, what, socketTimeout=self.settings.socketTimeout
            ) as conn,
        ):
            try:
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(h["gid"])))
            except pgerrors.UndefinedObject:
                log.debug("postgres: %s: not prepared (already finished)", what)
                return
        log.debug("postgres: rolled back %s", h["gid"])

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle]:
        """Idempotent: roll back this sink's prepared transactions that no kept handle names,
        in the sink's database (all batches, or only ``scope.batchId``).

        One query on ``pg_prepared_xacts`` when there is nothing to do. Prepared transactions
        of this sink in another database are reported, not touched. Returns one brief handle
        per transaction rolled back.
        """
        s = self.settings
        prefix = (
            sinkPrefix(scope.sinkId)
            if scope.batchId is None
            else batchPrefix(scope.sinkId, scope.batchId)
        )
        keep = {h.get("gid") for h in scope.keep if h.get("kind") == KIND and not isStaged(h)}
        aborted: list[Handle] = []
        what = f"recoverAndAbort of postgres sink {scope.sinkId}"
        with (
            driverErrors(what, s.target),
            DRIVER_CONNECTIONS.borrow(
                s.target, s.secrets, what, socketTimeout=s.socketTimeout
            ) as conn,
        ):
            rows = conn.execute(
                "SELECT gid, database = current_database(), database FROM pg_prepared_xacts"
                " WHERE starts_with(gid, %s) ORDER BY prepared",
                (prefix,),
            ).fetchall()
            elsewhere = sorted({str(r[2]) for r in rows if not r[1]})
            if elsewhere:
                log.warning(
                    "postgres: sink %s has prepared transactions in other databases %s; "
                    "connect a recovery to each (twophase recover with its url) to finish them",
                    scope.sinkId,
                    elsewhere,
                )
            for gid, here, _ in rows:
                if not here or gid in keep:
                    continue
                try:
                    conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
                except pgerrors.UndefinedObject:
                    continue  # finished meanwhile by someone else
                aborted.append(briefHandle(gid, s))
            aborted.extend(self._sweepStaged(conn, scope))
        if aborted:
            log.info(
                "postgres: recoverAndAbort rolled back %d prepared or staged transaction(s) of "
                "sink %s: %s",
                len(aborted),
                scope.sinkId,
                ", ".join(str(h.get("gid") or h.get("token")) for h in aborted),
            )
        return aborted

    def _sweepStaged(self, conn: Any, scope: RecoveryScope) -> list[Handle]:
        """Delete this sink's staged rows that no kept handle names; after a batch's decision
        (``scope.batchId``), prune the markers no commit can ask for any more."""
        s = self.settings
        names = StagingNames.of(s)
        keep = {str(h["token"]) for h in scope.keep if h.get("kind") == KIND and isStaged(h)}
        swept = sweepStaged(conn, names, scope.sinkId, scope.batchId, keep)
        pruned = (
            0 if scope.batchId is None else pruneMarkers(conn, names, scope.sinkId, scope.batchId)
        )
        if pruned:
            log.debug("postgres: pruned %d commit marker(s) of sink %s", pruned, scope.sinkId)
        return [briefStagedHandle(token, rows, s) for token, rows in swept]

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


def _tableParts(text: str, s: PostgresSettings) -> tuple[str, str]:
    """The handle's target table (schema, name); the settings' when it names the same."""
    if text == s.qualifiedName:
        return s.schema, s.table
    return parseTableName(text)
