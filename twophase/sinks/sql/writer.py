"""The executor half of the sql sink: one two-phase transaction per task attempt.

At its first rows a task attempt takes a connection (``sessions``: a kept PostgreSQL session
or a new one), begins the dialect's two-phase transaction (``XA BEGIN <xid>`` on MySQL/MariaDB,
``BEGIN`` on PostgreSQL), sends its rows as multi-row ``INSERT``s of ``batchsize`` rows (on
MySQL/MariaDB in append mode a large record batch by ``LOAD DATA LOCAL``, ``loaddata``), writes
its commit marker and prepares (``XA END`` + ``XA PREPARE``, ``PREPARE TRANSACTION``). The
prepared transaction stays on the server for the driver to commit from another connection: a
MySQL/MariaDB session is then ended without a rollback (that detaches the xid), a PostgreSQL
session is kept for the next task. A failed attempt rolls back; a killed one leaves at most a
prepared transaction, which ``recoverAndAbort`` removes unless a decision keeps it. With
``badRecords``, rows the database refuses go to a dead-letter table in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from twophase.protocol import Handle, TransactionContext, TransactionWriter
from twophase.redaction import getLogger, redact
from twophase.resources import Resources
from twophase.sinks.relational.rejections import recordJson
from twophase.sinks.sql.committer import SqlCommitter
from twophase.sinks.sql.connections import engineFor
from twophase.sinks.sql.dialect import (
    MAX_XID_BYTES,
    badRecordsTable,
    beginTwoPhase,
    insertParts,
    insertStatement,
    isDriverError,
    markerTable,
    prepareTwoPhase,
    rollbackTwoPhase,
    rowsOf,
    tableText,
    valuesText,
    xidFor,
)
from twophase.sinks.sql.errors import RowRejectedError
from twophase.sinks.sql.handles import KIND, taskHandle
from twophase.sinks.sql.loaddata import enable, loadBatch
from twophase.sinks.sql.rejections import (
    describe,
    isRejection,
    rejectionOf,
    withoutRowData,
)
from twophase.sinks.sql.sessions import TaskSessions, end, serverSession
from twophase.sinks.sql.settings import SqlSettings
from twophase.sinks.sql.taskerrors import taskError
from twophase.sinks.sql.transaction import SentRows, SqlTransaction

log = getLogger(__name__)

MAX_STATEMENT_BYTES = 4 << 20
"""Largest multi-row ``INSERT`` sent at once (MariaDB's ``max_allowed_packet`` is 16 MiB)."""


class SqlWriter(TransactionWriter[SqlTransaction]):
    """Executor, once per task attempt: rows into one prepared two-phase transaction.

    Nothing is visible before the driver commits. Memory per task: one record batch as Python
    tuples.
    """

    kind: ClassVar[str] = KIND

    def __init__(self, settings: SqlSettings, resources: Resources | None = None) -> None:
        self.settings = settings
        self.resources = resources
        """Engines and task sessions: kept in ``resources`` (the process's unless given)."""
        self.sessions = TaskSessions(resources)

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> SqlWriter:
        return cls(SqlSettings.fromOptions(options))

    def __repr__(self) -> str:
        s = self.settings
        return f"SqlWriter(table={s.qualifiedName}, mode={s.mode}, at={s.describe()})"

    def beginTransaction(self, ctx: TransactionContext) -> SqlTransaction:
        """Executor: name this attempt's xid (checked against the server's limit)."""
        xid = str(xidFor(ctx, MAX_XID_BYTES[self.settings.family]))
        return SqlTransaction(ctx=ctx, xid=xid)

    def write(self, txn: SqlTransaction, batch: pa.RecordBatch) -> None:
        """Executor: insert one record batch into the open transaction; nothing visible yet."""
        if txn.state != "open":
            raise RuntimeError(f"sql: write to a {txn.state} transaction {txn.xid}")
        if batch.num_rows == 0:
            return
        s = self.settings
        with self._taskErrors(txn):
            if txn.conn is None:
                self._open(txn, batch.schema)
            elif not batch.schema.equals(txn.schema, check_metadata=False):
                raise ValueError(
                    f"sql: the record batch schema changed within one transaction "
                    f"({txn.schema} -> {batch.schema})"
                )
            assert txn.conn is not None
            txn.batch = batch
            if self._loaded(txn, batch):
                pass
            elif (
                s.family == "mysql"
                and (values := valuesText(batch, txn.backslashEscapes)) is not None
            ):
                self._insertText(txn, values)
            else:
                rows = rowsOf(batch, s.family)
                for start in range(0, len(rows), s.batchsize):
                    chunk = rows[start : start + s.batchsize]
                    self._send(txn, SentRows(txn.rows + start, len(chunk), _resend(txn, chunk)))
            txn.rows += batch.num_rows
            txn.batch = txn.sent = None

    def _loaded(self, txn: SqlTransaction, batch: pa.RecordBatch) -> bool:
        """MySQL/MariaDB append mode: the batch sent by ``LOAD DATA LOCAL`` (``loaddata``);
        ``False`` when it was not (nothing of it sent), for the ``INSERT`` path."""
        s = self.settings
        engine = txn.engine
        if s.family != "mysql" or s.mode != "append" or engine is None:
            return False
        if engine.url.get_driver_name() != "pymysql":
            return False
        return loadBatch(txn, enable(engine, self.resources), s.schema, s.table, batch)

    def _insertText(self, txn: SqlTransaction, values: pa.Array) -> None:
        """MySQL/MariaDB: multi-row ``INSERT``s of at most ``batchsize`` rows and
        ``MAX_STATEMENT_BYTES``, from rows already in SQL text (``dialect.valuesText``)."""
        assert txn.conn is not None
        pending = [
            (start, values.slice(start, self.settings.batchsize))
            for start in range(0, len(values), self.settings.batchsize)
        ]
        while pending:
            start, chunk = pending.pop(0)
            size = pc.sum(pc.binary_length(chunk)).as_py() or 0
            if size > MAX_STATEMENT_BYTES and len(chunk) > 1:
                half = len(chunk) // 2
                pending[:0] = [(start, chunk.slice(0, half)), (start + half, chunk.slice(half))]
                continue
            self._send(txn, SentRows(txn.rows + start, len(chunk), _resendText(txn, chunk)))

    def _send(self, txn: SqlTransaction, sent: SentRows) -> None:
        """Send ``sent``'s rows in one statement. With ``badRecords``, a statement the
        database rejects is sent again row by row, and each row it refuses goes to the
        dead-letter table instead, in the same transaction."""
        txn.sent = sent
        if self.settings.badRecords is None:
            sent.send(0, sent.count)
        elif self._refusal(txn, sent, 0, sent.count) is not None:
            self._setAside(txn, sent)

    def _refusal(
        self, txn: SqlTransaction, sent: SentRows, start: int, stop: int
    ) -> Exception | None:
        """Send ``sent``'s rows ``start:stop``; the database's refusal of them, if it refused
        (the statement is then undone alone), else ``None``. Other errors are raised."""
        try:
            with self._savepoint(txn):
                sent.send(start, stop)
        except Exception as exc:
            if not _rejected(exc):
                raise
            return exc
        return None

    @contextmanager
    def _savepoint(self, txn: SqlTransaction) -> Iterator[None]:
        """PostgreSQL: a rejected statement undone alone (it would abort the transaction);
        MySQL/MariaDB undo a failed statement alone anyway."""
        if self.settings.family != "postgresql":
            yield
            return
        assert txn.conn is not None
        txn.conn.exec_driver_sql("SAVEPOINT twophase_rows")
        try:
            yield
        except Exception as exc:
            if _rejected(exc):
                txn.conn.exec_driver_sql("ROLLBACK TO SAVEPOINT twophase_rows")
            raise
        txn.conn.exec_driver_sql("RELEASE SAVEPOINT twophase_rows")

    def _setAside(self, txn: SqlTransaction, sent: SentRows) -> None:
        """Send ``sent``'s rows one by one; write those refused to the dead-letter table."""
        assert txn.conn is not None and self.settings.badRecords is not None
        ctx, s = txn.ctx, self.settings
        refused: list[dict[str, Any]] = []
        for index in range(sent.count):
            exc = self._refusal(txn, sent, index, index + 1)
            if exc is None:
                continue
            position = sent.first + index
            rejection = replace(rejectionOf(exc, position), row=position)
            refused.append(
                {
                    "xid": txn.xid,
                    "row_position": position,
                    "sink_id": ctx.sinkId,
                    "batch_id": ctx.batchId,
                    "partition_id": ctx.partitionId,
                    "error_column": rejection.column,
                    "error": describe(rejection, ctx.partitionId),
                    "record": _recordJson(txn, position),
                }
            )
        if refused:
            txn.conn.execute(badRecordsTable(s.badRecords, s.schema).insert(), refused)
            log.warning(
                "sql: batch %d partition %d: %d row(s) rejected by the database, set aside in "
                "%s (the first: %s)",
                ctx.batchId,
                ctx.partitionId,
                len(refused),
                s.badRecords,
                refused[0]["error"],
            )

    def _open(self, txn: SqlTransaction, schema: pa.Schema) -> None:
        s = self.settings
        engine = engineFor(
            s.url,
            pooled=False,
            connectTimeout=s.connectTimeout,
            socketTimeout=s.socketTimeout,
            resources=self.resources,
        )
        what = f"batch {txn.ctx.batchId} partition {txn.ctx.partitionId}"
        if s.family == "mysql" and engine.url.get_driver_name() == "pymysql":
            enable(engine, self.resources)  # before the first connection: it logs in with LOCAL
        conn = self.sessions.take(engine, what, s.connectRetrySeconds)
        txn.conn, txn.engine = conn, engine
        beginTwoPhase(conn, s.family, txn.xid)
        txn.begun = True
        txn.schema = schema
        target = tableText(engine.dialect, s.schema, s.table)
        names = list(schema.names)
        txn.statement = insertStatement(
            engine.dialect, s.family, target, names, s.mode, s.keyColumns
        )
        txn.parts = insertParts(engine.dialect, s.family, target, names, s.mode, s.keyColumns)
        if s.family == "mysql":
            from pymysql.constants import SERVER_STATUS

            raw = conn.connection.dbapi_connection
            status = int(getattr(raw, "server_status", 0))
            txn.backslashEscapes = not status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES

    def preCommit(self, txn: SqlTransaction) -> Handle:
        """Executor: write the commit marker, ``prepare()``, drop the connection (the prepared
        transaction stays) and return the handle. Calling it again returns the same handle; a
        task with no rows returns one whose xid is ``None``."""
        if txn.state == "prepared" and txn.handle is not None:
            return txn.handle
        if txn.state != "open":
            raise RuntimeError(f"sql: preCommit of a {txn.state} transaction {txn.xid}")
        ctx = txn.ctx
        s = self.settings
        xid: str | None = None
        session: int | None = None
        if txn.conn is not None and txn.begun:
            with self._taskErrors(txn):
                markers = markerTable(s.markerTable, s.schema)
                txn.conn.execute(
                    markers.insert().values(
                        xid=txn.xid,
                        sink_id=ctx.sinkId,
                        batch_id=ctx.batchId,
                        partition_id=ctx.partitionId,
                        row_count=txn.rows,
                    )
                )
                prepareTwoPhase(txn.conn, s.family, txn.xid)
                txn.begun = False
            xid = txn.xid
            session = serverSession(txn.conn) if s.family == "mysql" else None
            _release(txn, self.sessions)
        txn.state = "prepared"
        txn.handle = taskHandle(ctx, s, xid, txn.rows, session)
        log.debug("sql: prepared %s: %d row(s) as %s", ctx.transactionTag, txn.rows, xid)
        return txn.handle

    def abortTransaction(self, txn: SqlTransaction) -> None:
        """Executor, best effort: roll back; undo a prepared one. Never raises; what is left
        is found by ``recoverAndAbort``."""
        prepared = txn.state == "prepared" and txn.handle is not None
        txn.state = "aborted"
        if txn.conn is not None:
            try:
                if txn.begun:
                    rollbackTwoPhase(txn.conn, self.settings.family, txn.xid)
                    txn.begun = False
            except Exception:
                log.debug("sql: rollback of %s during abort failed", txn.xid, exc_info=True)
            _release(txn, self.sessions)
        if prepared and txn.handle is not None and txn.handle.get("xid"):
            try:
                SqlCommitter(self.settings, self.resources).abort(txn.handle)
            except Exception:
                log.warning("sql: could not undo %s; recovery will", txn.xid)

    @contextmanager
    def _taskErrors(self, txn: SqlTransaction) -> Iterator[None]:
        """Driver errors of a task, turned into errors that name the batch and the fix."""
        try:
            yield
        except Exception as exc:
            if not isDriverError(exc):
                raise
            errorType, message = taskError(self.settings, txn, exc)
            if errorType is RowRejectedError:
                raise errorType(redact(message)) from withoutRowData(exc)
            raise errorType(redact(message)) from None


def _sendText(txn: SqlTransaction, rows: pa.Array) -> None:
    """One multi-row ``INSERT`` of rows already in SQL text, on the DBAPI cursor without
    parameters: the text is final, nothing may treat its '%' as a placeholder."""
    assert txn.conn is not None
    head, tail = txn.parts
    with txn.conn.connection.dbapi_connection.cursor() as cursor:  # type: ignore[union-attr]
        cursor.execute(head + ",".join(rows.to_pylist()) + tail)


def _resendText(txn: SqlTransaction, rows: pa.Array) -> Callable[[int, int], None]:
    return lambda start, stop: _sendText(txn, rows.slice(start, stop - start))


def _resend(txn: SqlTransaction, rows: list[tuple[Any, ...]]) -> Callable[[int, int], None]:
    def send(start: int, stop: int) -> None:
        assert txn.conn is not None
        txn.conn.exec_driver_sql(txn.statement, rows[start:stop])

    return send


def _rejected(exc: BaseException) -> bool:
    """A database error that refuses a row (not the connection, not the transaction)."""
    return isDriverError(exc) and isRejection(exc)


def _recordJson(txn: SqlTransaction, position: int) -> str:
    """The task's row ``position`` as JSON (bytes as hex, other values as text)."""
    batch = txn.batch
    index = position - txn.rows
    if batch is None or not 0 <= index < batch.num_rows:
        return "null"
    return recordJson(batch, index)


def _release(txn: SqlTransaction, sessions: TaskSessions) -> None:
    """Hand the task's connection back once its transaction is prepared or rolled back:
    ``sessions`` keeps a PostgreSQL session for the next task and ends any other without the
    rollback SQLAlchemy would send on close (a prepared XA xid outlives its session, which
    must end to let another connection commit it). A transaction still open (a failed
    rollback) ends with its session: the server rolls it back."""
    conn, engine = txn.conn, txn.engine
    txn.conn = txn.engine = None
    if conn is None or engine is None:
        return
    if txn.begun:
        txn.begun = False
        end(conn)
        return
    sessions.give(engine, conn)


__all__ = ["SqlTransaction", "SqlWriter"]
