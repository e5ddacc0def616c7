"""The driver half of the postgres sink: ``COMMIT PREPARED`` / ``ROLLBACK PREPARED`` by gid.

A prepared transaction survives its session, the executor and a server restart, so any process
with a handle (and the sink's options) can finish it, on a reused autocommit connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from psycopg import errors as pgerrors
from psycopg import sql

from twophase.clients.postgres import DRIVER_CONNECTIONS, ConnectionTarget, driverErrors
from twophase.protocol import Committer, Handle, RecoveryScope, TransactionLostError
from twophase.redaction import getLogger
from twophase.sinks.postgres.errors import PostgresSinkError
from twophase.sinks.postgres.handles import (
    KIND,
    briefHandle,
    checkHandle,
    handleTarget,
    xactStatus,
)
from twophase.sinks.postgres.settings import PostgresSettings
from twophase.sinks.postgres.xid import batchPrefix, sinkPrefix

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
        if h["gid"] is None:
            return
        target, secrets = handleTarget(h, self.settings)
        what = f"commit of {self.describe(h)}"
        with driverErrors(what, target), DRIVER_CONNECTIONS.borrow(target, secrets, what) as conn:
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

    def abort(self, handle: Handle) -> None:
        """Idempotent: ``ROLLBACK PREPARED``; a gid that is gone is a no-op."""
        h = checkHandle(handle)
        if h["gid"] is None:
            return
        target, secrets = handleTarget(h, self.settings)
        what = f"abort of {self.describe(h)}"
        with driverErrors(what, target), DRIVER_CONNECTIONS.borrow(target, secrets, what) as conn:
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
        keep = {h.get("gid") for h in scope.keep if h.get("kind") == KIND}
        aborted: list[Handle] = []
        what = f"recoverAndAbort of postgres sink {scope.sinkId}"
        with (
            driverErrors(what, s.target),
            DRIVER_CONNECTIONS.borrow(s.target, s.secrets, what) as conn,
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
        if aborted:
            log.info(
                "postgres: recoverAndAbort rolled back %d prepared transaction(s) of sink %s: %s",
                len(aborted),
                scope.sinkId,
                ", ".join(str(h["gid"]) for h in aborted),
            )
        return aborted

    def describe(self, handle: Handle) -> str:
        """``postgres batch N partition p attempt a: r row(s) into <table> as <gid> at <where>``."""
        try:
            where = ConnectionTarget.fromJson(handle.get("connection")).describe()
        except ValueError:
            where = "?"
        rows = f"{handle['rows']} row(s)" if "rows" in handle else "a prepared transaction"
        return (
            f"postgres batch {handle.get('batchId')} partition {handle.get('partitionId')} "
            f"attempt {handle.get('attempt')}: {rows} into {handle.get('table')} as "
            f"{handle.get('gid')} at {where}"
        )
