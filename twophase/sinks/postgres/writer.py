"""The executor half of the postgres sink: one prepared transaction per task attempt.

Each attempt opens one connection at its first rows, starts a two-phase transaction (psycopg's
``tpc_begin``) under a gid that names the sink, batch, partition, attempt and run (see
``xid``), streams its Arrow record batches in (``statements``), and ``PREPARE TRANSACTION``s
it. Nothing is visible before the driver's ``COMMIT PREPARED``; a failed attempt rolls back
(its connection closes), a killed one leaves at most a prepared transaction that the
committer's ``recoverAndAbort`` rolls back unless a decision keeps it. psycopg errors become
errors that name the batch, the table and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import psycopg
import pyarrow as pa
from psycopg import errors as pgerrors
from psycopg import sql

from twophase.clients.postgres import connect, errorText
from twophase.protocol import Handle, TransactionContext, TransactionWriter
from twophase.redaction import getLogger, redact
from twophase.sinks.postgres.committer import PostgresCommitter
from twophase.sinks.postgres.encoding import csvChunk
from twophase.sinks.postgres.errors import (
    PostgresSinkError,
    PostgresUnavailableError,
    RowRejectedError,
)
from twophase.sinks.postgres.handles import KIND, currentXid, preparedHandle
from twophase.sinks.postgres.settings import PostgresSettings
from twophase.sinks.postgres.statements import copyStatement, upsertParameters, upsertStatement
from twophase.sinks.postgres.xid import GlobalXid, sinkPrefix

log = getLogger(__name__)


@dataclass(eq=False)
class PostgresTransaction:
    """One task attempt's two-phase transaction: its gid, connection and open COPY.

    Lives in one executor task only (holds a connection); never pickled. The connection opens
    at the first non-empty record batch, so an empty partition costs nothing.
    """

    ctx: TransactionContext
    gid: str
    conn: psycopg.Connection[Any] | None = None
    stack: ExitStack = field(default_factory=ExitStack)
    copy: Any = None
    schema: pa.Schema | None = None
    upsertSql: sql.Composed | None = None
    rows: int = 0
    state: str = "open"
    handle: Handle | None = None


class PostgresWriter(TransactionWriter[PostgresTransaction]):
    """Executor, once per task attempt: rows into a prepared transaction, nothing visible.

    Memory per task is one record batch and its CSV text (append) or one chunk of
    ``upsertBatchRows`` rows (upsert).
    """

    kind: ClassVar[str] = KIND

    def __init__(self, settings: PostgresSettings) -> None:
        self.settings = settings

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> PostgresWriter:
        return cls(PostgresSettings.fromOptions(options))

    def __repr__(self) -> str:
        s = self.settings
        return f"PostgresWriter(table={s.qualifiedName}, mode={s.mode}, at={s.target.describe()})"

    def beginTransaction(self, ctx: TransactionContext) -> PostgresTransaction:
        """Executor: name this attempt's transaction; the connection opens at the first rows."""
        gid = str(GlobalXid.forContext(ctx))
        log.debug("postgres: begin %s as %s", ctx.transactionTag, gid)
        return PostgresTransaction(ctx=ctx, gid=gid)

    def write(self, txn: PostgresTransaction, batch: pa.RecordBatch) -> None:
        """Executor: stream one record batch into the open transaction; nothing visible yet."""
        if txn.state != "open":
            raise RuntimeError(f"postgres: write to a {txn.state} transaction {txn.gid}")
        if batch.num_rows == 0:
            return
        with self._taskErrors(txn):
            if txn.conn is None:
                self._open(txn, batch.schema)
            elif not batch.schema.equals(txn.schema, check_metadata=False):
                raise ValueError(
                    "postgres: the record batch schema changed within one transaction "
                    f"({txn.schema} -> {batch.schema}); all rows of a task must share one schema"
                )
            if self.settings.mode == "append":
                txn.copy.write(memoryview(csvChunk(batch)))
            else:
                self._upsert(txn, batch)
            txn.rows += batch.num_rows

    def _open(self, txn: PostgresTransaction, schema: pa.Schema) -> None:
        s = self.settings
        ctx = txn.ctx
        conn = connect(
            s.target,
            s.secrets,
            autocommit=True,
            retrySeconds=s.connectRetrySeconds,
            what=f"batch {ctx.batchId} partition {ctx.partitionId}",
        )
        txn.conn = conn
        txn.schema = schema
        # Instants travel as UTC wall-clock text (see encoding.utcWallClock).
        conn.execute(
            "SELECT set_config('lock_timeout', %s, false), set_config('TimeZone', 'UTC', false)",
            (f"{int(s.lockTimeoutSeconds * 1000)}ms",),
        )
        conn.autocommit = False
        conn.tpc_begin(txn.gid)
        if s.mode == "append":
            statement = copyStatement(s, schema.names)
            txn.copy = txn.stack.enter_context(conn.cursor().copy(statement))
        else:
            txn.upsertSql = upsertStatement(conn, s, schema)

    def _upsert(self, txn: PostgresTransaction, batch: pa.RecordBatch) -> None:
        assert txn.conn is not None and txn.upsertSql is not None
        with txn.conn.cursor() as cur:
            for parameters in upsertParameters(self.settings, batch):
                cur.execute(txn.upsertSql, parameters)

    def preCommit(self, txn: PostgresTransaction) -> Handle:
        """Executor: end the COPY, ``PREPARE TRANSACTION``, close the session; return the handle.

        Nothing is visible yet. Calling it again returns the same handle (format in
        ``handles``); a task with no rows returns a handle whose gid is ``None``.
        """
        if txn.state == "prepared" and txn.handle is not None:
            return txn.handle
        if txn.state != "open":
            raise RuntimeError(f"postgres: preCommit of a {txn.state} transaction {txn.gid}")
        ctx = txn.ctx
        xid: str | None = None
        gid: str | None = None
        if txn.conn is not None:
            with self._taskErrors(txn):
                txn.stack.close()  # ends the COPY: the server checks the last rows here
                txn.copy = None
                xid = currentXid(txn.conn)
                txn.conn.tpc_prepare()
                gid = txn.gid
            txn.conn.close()
            txn.conn = None
        handle = preparedHandle(ctx, self.settings, gid, xid, txn.rows)
        txn.state = "prepared"
        txn.handle = handle
        log.debug("postgres: prepared %s: %d row(s) as %s", ctx.transactionTag, txn.rows, gid)
        return handle

    def abortTransaction(self, txn: PostgresTransaction) -> None:
        """Executor, best effort: close the connection, which rolls an unprepared transaction
        back. Never raises; what is left is found by ``recoverAndAbort``."""
        prepared = txn.state == "prepared" and txn.handle is not None and txn.handle.get("gid")
        txn.state = "aborted"
        try:
            txn.stack.close()
        except Exception:  # the COPY failed or the server is gone: closing settles it
            log.debug("postgres: ending the COPY of %s during abort failed", txn.gid)
        if txn.conn is not None:
            try:
                txn.conn.close()
            except Exception:
                log.debug("postgres: closing %s during abort failed", txn.gid, exc_info=True)
            txn.conn = None
        if prepared and txn.handle is not None:
            try:
                PostgresCommitter(self.settings).abort(txn.handle)
            except Exception:
                log.warning("postgres: could not roll back prepared %s; recovery will", txn.gid)

    @contextmanager
    def _taskErrors(self, txn: PostgresTransaction) -> Iterator[None]:
        """psycopg errors of a task, turned into errors that name the batch and the fix."""
        try:
            yield
        except psycopg.Error as exc:
            errorType, message = self._taskError(txn, exc)
            raise errorType(redact(message)) from None

    def _taskError(
        self, txn: PostgresTransaction, exc: psycopg.Error
    ) -> tuple[type[PostgresSinkError], str]:
        """The error class and message (not yet redacted) for a psycopg error of a task."""
        s = self.settings
        ctx = txn.ctx
        where = (
            f"postgres sink {ctx.sinkId}, batch {ctx.batchId}, partition {ctx.partitionId} "
            f"(attempt {ctx.attemptNumber}), table {s.qualifiedName}"
        )
        diag = exc.diag
        primary = diag.message_primary or errorText(exc)
        if isinstance(exc, pgerrors.IntegrityError | pgerrors.DataError):
            facts = [f"SQLSTATE {exc.sqlstate}"]
            if diag.column_name:
                facts.append(f"column {diag.column_name}")
            if diag.constraint_name:
                facts.append(f"constraint {diag.constraint_name}")
            if diag.context:
                facts.append(" ".join(diag.context.split())[:300])
            detail = (
                f" {' '.join(diag.message_detail.split())[:300]}" if diag.message_detail else ""
            )
            return RowRejectedError, (
                f"{where}: PostgreSQL rejected a row: {primary} ({'; '.join(facts)}).{detail} "
                f"Nothing of batch {ctx.batchId} becomes visible: its transactions are rolled "
                "back and the query fails. Fix the data in Spark (filter or fill the column) or "
                "the table's constraint, then restart the query: the batch is written again."
            )
        if isinstance(exc, pgerrors.LockNotAvailable):
            blockers = self._preparedOfSink(ctx.sinkId)
            return PostgresSinkError, (
                f"{where}: waited more than lockTimeoutSeconds={s.lockTimeoutSeconds:g} for a "
                f"row lock ({primary}). Prepared transactions of this sink: "
                f"{blockers or 'none'}. A prepared transaction keeps its locks until the driver "
                "commits it, so two tasks of one batch must not write the same key (in upsert "
                "mode repartition the DataFrame by keyColumns), and a task attempt that was "
                "killed after PREPARE blocks its retry until the query restarts and recovery "
                "rolls it back."
            )
        if isinstance(exc, psycopg.OperationalError) and (txn.conn is None or txn.conn.broken):
            return PostgresUnavailableError, (
                f"{where}: lost the connection to {s.target.describe()}: {primary}. Nothing of "
                "this task is visible; Spark retries the task, and a failed batch is written "
                "again when the query restarts."
            )
        return PostgresSinkError, (
            f"{where}: PostgreSQL error {exc.sqlstate or type(exc).__name__}: {primary}"
        )

    def _preparedOfSink(self, sinkId: str) -> str:
        """The gids of this sink's prepared transactions, for a lock report (best effort)."""
        s = self.settings
        try:
            with connect(
                s.target, s.secrets, autocommit=True, retrySeconds=0, what="lock report"
            ) as conn:
                rows = conn.execute(
                    "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)"
                    " ORDER BY prepared LIMIT 10",
                    (sinkPrefix(sinkId),),
                ).fetchall()
        except Exception:
            return "unknown"
        return ", ".join(r[0] for r in rows)
