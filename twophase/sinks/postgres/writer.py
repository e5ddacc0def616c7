"""The executor half of the postgres sink: one prepared or staged transaction per task attempt.

Each attempt takes a session at its first rows (reused from an earlier task of the worker
process when one is free, see ``sessions``) and picks its commit path (``commitMode``):

- prepared: the rows go into the target in a transaction that ``PREPARE TRANSACTION`` ends,
  under a gid that names the sink, batch, partition, attempt and run (see ``xid``); nothing is
  visible before the driver's ``COMMIT PREPARED``;
- staged: the rows are ``COPY``ed into the staging table tagged with a token of the same form
  and committed; nothing is visible before the driver moves them (see ``staging``).

A failed attempt rolls back (its session closes); a killed one leaves at most a prepared
transaction or staged rows that the committer's ``recoverAndAbort`` removes unless a decision
keeps them. psycopg errors become errors that name the batch, the table and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import psycopg
import pyarrow as pa
from psycopg import errors as pgerrors
from psycopg import sql

from twophase.clients.postgres import AnswerWatch, connect, errorText
from twophase.protocol import Handle, TransactionContext, TransactionWriter
from twophase.redaction import getLogger, redact
from twophase.resources import Resources
from twophase.sinks.postgres import deadletter
from twophase.sinks.postgres.committer import PostgresCommitter
from twophase.sinks.postgres.dialect import gidFor, quoteIdent
from twophase.sinks.postgres.encoding import csvChunk
from twophase.sinks.postgres.errors import (
    PostgresSinkError,
    PostgresUnavailableError,
    PreparedLimitError,
    RowRejectedError,
)
from twophase.sinks.postgres.handles import KIND, currentXid, preparedHandle, stagedHandle
from twophase.sinks.postgres.rejections import (
    describe,
    fixFor,
    locateInChunk,
    rejectionOf,
    withoutRowData,
)
from twophase.sinks.postgres.sessions import TaskSession, TaskSessions
from twophase.sinks.postgres.settings import PostgresSettings
from twophase.sinks.postgres.staging import (
    SEQ_COLUMN,
    TOKEN_COLUMN,
    StagingNames,
    stagingCopyStatement,
)
from twophase.sinks.postgres.statements import (
    copyStatement,
    tableTypes,
    upsertChunks,
    upsertStatement,
)
from twophase.sinks.relational.naming import sinkPrefix

log = getLogger(__name__)


@dataclass(eq=False)
class PostgresTransaction:
    """One task attempt's transaction: its gid (the token when staged), session and COPY.

    Lives in one executor task only (holds a connection); never pickled. The session is taken
    at the first non-empty record batch, so an empty partition costs nothing. ``path`` is
    ``prepared`` or ``staged`` once the session is taken.
    """

    ctx: TransactionContext
    gid: str
    session: TaskSession | None = None
    path: str = ""
    stack: ExitStack = field(default_factory=ExitStack)
    copy: Any = None
    schema: pa.Schema | None = None
    upsertSql: sql.Composed | None = None
    types: dict[str, tuple[str, str]] = field(default_factory=dict)
    chunk: tuple[pa.RecordBatch, np.ndarray] | None = None
    """The upsert statement running: its rows, and their positions in the task."""
    rows: int = 0
    setAside: int = 0
    """Rows PostgreSQL rejected and the task wrote to the ``badRecords`` table."""
    state: str = "open"
    handle: Handle | None = None

    @property
    def conn(self) -> psycopg.Connection[Any] | None:
        return self.session.conn if self.session is not None else None


class PostgresWriter(TransactionWriter[PostgresTransaction]):
    """Executor, once per task attempt: rows into a prepared or staged transaction.

    Nothing is visible before the driver commits. Memory per task is one record batch and its
    CSV text (append, staged) or one chunk of ``upsertBatchRows`` rows (prepared upsert).
    """

    kind: ClassVar[str] = KIND

    def __init__(self, settings: PostgresSettings, resources: Resources | None = None) -> None:
        self.settings = settings
        self.sessions = TaskSessions(resources)
        """Task sessions, kept in ``resources`` (the process's unless given) for the next task."""

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> PostgresWriter:
        return cls(PostgresSettings.fromOptions(options))

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"PostgresWriter(table={s.qualifiedName}, mode={s.mode}, "
            f"commitMode={s.commitMode}, at={s.target.describe()})"
        )

    def beginTransaction(self, ctx: TransactionContext) -> PostgresTransaction:
        """Executor: name this attempt's transaction; the session is taken at the first rows."""
        gid = str(gidFor(ctx))
        log.debug("postgres: begin %s as %s", ctx.transactionTag, gid)
        return PostgresTransaction(ctx=ctx, gid=gid)

    def write(self, txn: PostgresTransaction, batch: pa.RecordBatch) -> None:
        """Executor: stream one record batch into the open transaction; nothing visible yet."""
        if txn.state != "open":
            raise RuntimeError(f"postgres: write to a {txn.state} transaction {txn.gid}")
        if batch.num_rows == 0:
            return
        with self._taskErrors(txn):
            if txn.session is None:
                self._open(txn, batch.schema)
            elif not batch.schema.equals(txn.schema, check_metadata=False):
                raise ValueError(
                    "postgres: the record batch schema changed within one transaction "
                    f"({txn.schema} -> {batch.schema}); all rows of a task must share one schema"
                )
            if txn.path == "staged":
                txn.copy.write(memoryview(csvChunk(self._tagged(txn, batch))))
            elif self.settings.badRecords is not None:
                assert txn.conn is not None
                txn.setAside += deadletter.sendSettingAside(
                    txn.conn,
                    self.settings,
                    txn.ctx,
                    txn.gid,
                    deadletter.Sent(batch, txn.rows, txn.upsertSql, txn.types),
                )
            elif self.settings.mode == "append":
                txn.copy.write(memoryview(csvChunk(batch)))
            else:
                self._upsert(txn, batch)
            txn.rows += batch.num_rows

    def _open(self, txn: PostgresTransaction, schema: pa.Schema) -> None:
        s = self.settings
        ctx = txn.ctx
        session = self.sessions.take(
            s.target,
            s.secrets,
            lockTimeoutMs=int(s.lockTimeoutSeconds * 1000),
            retrySeconds=s.connectRetrySeconds,
            what=f"batch {ctx.batchId} partition {ctx.partitionId}",
        )
        txn.session = session
        txn.schema = schema
        limit = session.maxPreparedTransactions
        if (s.commitMode == "prepared" or s.badRecords is not None) and ctx.partitionId >= limit:
            raise PreparedLimitError(self._limitMessage(ctx, limit))
        txn.path = "prepared" if ctx.partitionId < s.preparedBudget(limit) else "staged"
        conn = session.conn
        if txn.path == "staged":
            statement = stagingCopyStatement(StagingNames.of(s), schema.names)
            txn.copy = txn.stack.enter_context(conn.cursor().copy(statement))
        elif s.mode == "append":
            if s.badRecords is None:  # with it, one COPY per record batch (_writeSettingAside)
                statement = copyStatement(s, schema.names)
                txn.copy = txn.stack.enter_context(conn.cursor().copy(statement))
        else:
            txn.types = tableTypes(conn, s)
            txn.upsertSql = upsertStatement(s, schema, txn.types)

    def _limitMessage(self, ctx: TransactionContext, limit: int) -> str:
        s = self.settings
        if s.badRecords is not None:
            return (
                f"postgres sink {ctx.sinkId}, batch {ctx.batchId}, partition {ctx.partitionId}, "
                f"table {s.qualifiedName}: with option badRecords every partition holds a "
                "prepared transaction until the driver commits (rejected rows are set aside "
                f"in it), and the server at {s.target.describe()} allows "
                f"max_prepared_transactions = {limit}, so a batch with {ctx.partitionId + 1} or "
                "more partitions cannot be prepared at once. Nothing was written. Fix one of: "
                "write fewer partitions (df.coalesce(n) or spark.sql.shuffle.partitions); raise "
                "max_prepared_transactions in postgresql.conf above the number of partitions "
                "and restart the server; or set badRecords=fail (the default), with which "
                "partitions beyond the budget stage their rows."
            )
        return (
            f"postgres sink {ctx.sinkId}, batch {ctx.batchId}, partition {ctx.partitionId}, "
            f"table {s.qualifiedName}: commitMode=prepared holds one prepared transaction per "
            f"partition until the driver commits, and the server at {s.target.describe()} "
            f"allows max_prepared_transactions = {limit}, so a batch with "
            f"{ctx.partitionId + 1} or more partitions cannot be prepared at once. Nothing was "
            "written. Fix one of: set commitMode=auto (the default: partitions beyond "
            "maxPreparedPartitions, half the server's limit, stage their rows and commit "
            "without a prepared transaction) or commitMode=staged; raise "
            "max_prepared_transactions in postgresql.conf above the number of partitions and "
            "restart the server; or write fewer partitions (df.coalesce(n) or "
            "spark.sql.shuffle.partitions)."
        )

    def _tagged(self, txn: PostgresTransaction, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` plus the staging columns: the token and the row's position in the task."""
        n = batch.num_rows
        token = pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(n, dtype=np.int32)), pa.array([txn.gid])
        )
        seq = pa.array(np.arange(txn.rows, txn.rows + n, dtype=np.int64))
        return batch.append_column(TOKEN_COLUMN, token).append_column(SEQ_COLUMN, seq)

    def _upsert(self, txn: PostgresTransaction, batch: pa.RecordBatch) -> None:
        assert txn.conn is not None and txn.upsertSql is not None
        with txn.conn.cursor() as cur:
            for chunk in upsertChunks(self.settings, batch):
                txn.chunk = (chunk.batch, chunk.rows + txn.rows)
                cur.execute(txn.upsertSql, chunk.parameters)
            txn.chunk = None

    def preCommit(self, txn: PostgresTransaction) -> Handle:
        """Executor: end the COPY, then ``PREPARE TRANSACTION`` (prepared) or ``COMMIT`` into
        the staging table (staged); free the session for the next task; return the handle.

        Nothing is visible yet. Calling it again returns the same handle (format in
        ``handles``); a task with no rows returns a handle whose gid is ``None``.
        """
        if txn.state == "prepared" and txn.handle is not None:
            return txn.handle
        if txn.state != "open":
            raise RuntimeError(f"postgres: preCommit of a {txn.state} transaction {txn.gid}")
        ctx = txn.ctx
        s = self.settings
        session = txn.session
        if session is not None and txn.path == "staged":
            with self._taskErrors(txn):
                txn.stack.close()  # ends the COPY: the server checks the last rows here
                txn.copy = None
                session.conn.execute("COMMIT")
            names = StagingNames.of(s)
            handle = stagedHandle(
                ctx,
                s,
                txn.gid,
                ([names.schema, names.staging], [names.schema, names.markers]),
                list(txn.schema.names) if txn.schema is not None else [],
                txn.rows,
            )
        else:
            xid: str | None = None
            gid: str | None = None
            if session is not None:
                with self._taskErrors(txn):
                    txn.stack.close()  # ends the COPY: the server checks the last rows here
                    txn.copy = None
                    xid = currentXid(session.conn)
                    session.conn.execute(
                        sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(txn.gid))
                    )
                    gid = txn.gid
            handle = preparedHandle(ctx, s, gid, xid, txn.rows)
            if txn.setAside:
                handle["setAside"] = txn.setAside
        if session is not None:
            txn.session = None
            self.sessions.give(s.target, s.secrets, session)
        txn.state = "prepared"
        txn.handle = handle
        log.debug(
            "postgres: %s %s: %d row(s) as %s",
            txn.path or "empty",
            ctx.transactionTag,
            txn.rows,
            txn.gid,
        )
        return handle

    def abortTransaction(self, txn: PostgresTransaction) -> None:
        """Executor, best effort: close the session, which rolls an unfinished transaction
        back; undo a prepared or staged one. Never raises; what is left is found by
        ``recoverAndAbort``."""
        finished = txn.state == "prepared" and txn.handle is not None
        txn.state = "aborted"
        try:
            txn.stack.close()
        except Exception:  # the COPY failed or the server is gone: closing settles it
            log.debug("postgres: ending the COPY of %s during abort failed", txn.gid)
        if txn.session is not None:
            try:
                txn.session.conn.close()
            except Exception:
                log.debug("postgres: closing %s during abort failed", txn.gid, exc_info=True)
            txn.session = None
        if (
            finished
            and txn.handle is not None
            and (txn.handle.get("gid") or txn.handle.get("token"))
        ):
            try:
                PostgresCommitter(self.settings).abort(txn.handle)
            except Exception:
                log.warning("postgres: could not undo %s; recovery will", txn.gid)

    @contextmanager
    def _taskErrors(self, txn: PostgresTransaction) -> Iterator[None]:
        """psycopg errors of a task, turned into errors that name the batch and the fix; the
        wait for the server's answers bounded by ``socketTimeout`` (``AnswerWatch``)."""
        ctx = txn.ctx
        watch = AnswerWatch(
            self.settings.socketTimeout,
            lambda: txn.conn,
            f"postgres sink {ctx.sinkId}, batch {ctx.batchId}, partition {ctx.partitionId} "
            f"(attempt {ctx.attemptNumber}) at {self.settings.target.describe()}",
        )
        try:
            with watch:
                yield
        except psycopg.Error as exc:
            errorType, message = self._taskError(txn, exc)
            if errorType is RowRejectedError:
                raise errorType(redact(message)) from withoutRowData(exc)
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
            rejection = rejectionOf(exc)
            if txn.chunk is not None:
                types = {name: declared for name, (declared, _) in txn.types.items()}
                rejection = locateInChunk(rejection, *txn.chunk, types)
            return RowRejectedError, (
                f"{where}: PostgreSQL rejected {describe(rejection, ctx.partitionId)}. Nothing "
                f"of batch {ctx.batchId} becomes visible: its transactions are rolled back and "
                f"the query fails. Fix: {fixFor(rejection, s.qualifiedName)}; then restart the "
                "query: the batch is written again."
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
        if exc.sqlstate == "53200" and "prepared transactions" in primary:
            limit = txn.session.maxPreparedTransactions if txn.session is not None else "?"
            return PreparedLimitError, (
                f"{where}: PostgreSQL refused PREPARE TRANSACTION: {primary} "
                f"(max_prepared_transactions = {limit}, held by this and other sinks and "
                "clients; see pg_prepared_xacts). Nothing of this task is visible. Lower "
                "maxPreparedPartitions (commitMode=auto) or set commitMode=staged so fewer "
                "tasks hold a prepared transaction; or raise max_prepared_transactions and "
                "restart the server; or finish the prepared transactions left by others."
            )
        if isinstance(exc, pgerrors.UndefinedTable) and txn.path == "staged":
            names = StagingNames.of(s)
            budget = (
                s.preparedBudget(txn.session.maxPreparedTransactions)
                if txn.session is not None
                else "?"
            )
            return PostgresSinkError, (
                f"{where}: this partition stages its rows (commitMode={s.commitMode}, "
                f"maxPreparedPartitions = {budget}) and the staging table {names.stagingText} "
                f"does not exist ({primary}). Nothing was written. The driver creates it "
                f"before each batch when the sink's user has CREATE on schema "
                f"{quoteIdent(s.schema)} (see the driver's warning for the statements an "
                "administrator can run). Fix one of: grant that privilege or create the "
                "tables; raise maxPreparedPartitions up to the server's "
                "max_prepared_transactions if batches have no more partitions than that; or "
                "write fewer partitions (df.coalesce(n) or spark.sql.shuffle.partitions)."
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
