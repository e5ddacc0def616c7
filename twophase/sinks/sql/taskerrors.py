"""What a driver error of a sql sink task means: the error type and a message naming the task,
the batch and the fix; for a refused row, where it is in the task and why."""

from __future__ import annotations

from dataclasses import replace

import sqlalchemy as sa

from twophase.redaction import getLogger
from twophase.sinks.sql.connections import isTimeout, isUnavailable, noAnswer
from twophase.sinks.sql.dialect import errorMessage, mysqlCode, pgState
from twophase.sinks.sql.errors import RowRejectedError, SqlSinkError, SqlUnavailableError
from twophase.sinks.sql.rejections import (
    Rejection,
    describe,
    fixFor,
    isRejection,
    locate,
    rejectionOf,
)
from twophase.sinks.sql.settings import SqlSettings
from twophase.sinks.sql.transaction import SqlTransaction

log = getLogger(__name__)


def taskError(
    settings: SqlSettings, txn: SqlTransaction, exc: Exception
) -> tuple[type[SqlSinkError], str]:
    """The error type a task's driver error becomes, and its message: where (sink, batch,
    partition, attempt, table), what happened, and the fix."""
    s = settings
    ctx = txn.ctx
    where = (
        f"sql sink {ctx.sinkId}, batch {ctx.batchId}, partition {ctx.partitionId} "
        f"(attempt {ctx.attemptNumber}), table {s.qualifiedName} at {s.describe()}"
    )
    text = errorMessage(exc)
    if isTimeout(exc):
        return SqlUnavailableError, (
            f"{where}: {noAnswer(s.socketTimeout)}: {text}. Nothing of this task is visible; "
            "Spark retries the task, and a failed batch is written again when the query "
            "restarts. If statements take that long on a healthy server, raise the option "
            "socketTimeout."
        )
    if isUnavailable(exc):
        return SqlUnavailableError, (
            f"{where}: lost the connection: {text}. Nothing of this task is visible; Spark "
            "retries the task, and a failed batch is written again when the query restarts."
        )
    if pgState(exc) == "53200" or (
        pgState(exc) == "55000" and "prepared transactions are disabled" in text
    ):
        return SqlSinkError, (
            f"{where}: PostgreSQL refused PREPARE TRANSACTION: {text}. Each partition holds "
            "one prepared transaction until the driver commits: set "
            "max_prepared_transactions in postgresql.conf above the number of partitions "
            "(and restart the server), or write fewer partitions (df.coalesce(n))."
        )
    if isinstance(exc, sa.exc.IntegrityError | sa.exc.DataError) or isRejection(exc):
        rejection = _placed(settings, txn, exc)
        return RowRejectedError, (
            f"{where}: the database rejected {describe(rejection, ctx.partitionId)}. "
            f"Nothing of batch {ctx.batchId} becomes visible: the task's transaction is "
            f"rolled back and the query fails. Fix: {fixFor(rejection, s.qualifiedName)}; "
            "then restart the query: the batch is written again."
        )
    return SqlSinkError, f"{where}: {text}"


def _placed(settings: SqlSettings, txn: SqlTransaction, exc: Exception) -> Rejection:
    """The refused row's position in the task: as the server says it, else found by
    sending the statement's rows again in halves (MySQL/MariaDB), else the statement's
    rows; for a value too long, its length and the column's type."""
    sent, txn.sent = txn.sent, None
    rejection = rejectionOf(exc, sent.first if sent is not None else txn.rows)
    code = mysqlCode(exc)
    if rejection.row is None and sent is not None:
        index = None
        if code is not None and settings.family == "mysql":
            index = locate(sent.send, sent.count, code)
        if index is None:
            last = sent.first + sent.count - 1
            rejection = replace(rejection, rows=f"rows {sent.first} to {last}")
        else:
            rejection = replace(rejection, row=sent.first + index)
    if code == 1406 and rejection.row is not None and rejection.column:
        s = settings
        length = _tooLong(txn, rejection.row, rejection.column, s.schema, s.table)
        rejection = replace(rejection, length=length)
    return rejection


def _tooLong(txn: SqlTransaction, row: int, column: str, schema: str | None, table: str) -> str:
    """``the value has 12 characters; the column is varchar(5)``, as far as known."""
    facts = []
    batch = txn.batch
    index = row - txn.rows
    if batch is not None and column in batch.schema.names and 0 <= index < batch.num_rows:
        value = batch.column(column)[index].as_py()
        if isinstance(value, str | bytes):
            unit = "characters" if isinstance(value, str) else "bytes"
            facts.append(f"the value has {len(value)} {unit}")
    try:
        assert txn.conn is not None
        with txn.conn.connection.dbapi_connection.cursor() as cursor:  # type: ignore[union-attr]
            cursor.execute(
                "SELECT COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
                "COALESCE(%s, DATABASE()) AND TABLE_NAME = %s AND COLUMN_NAME = %s",
                (schema, table, column),
            )
            found = cursor.fetchone()
        if found:
            facts.append(f"the column is {found[0]}")
    except Exception:  # best effort: the message stands without it
        log.debug("sql: reading the type of column %s failed", column, exc_info=True)
    return "; ".join(facts)


__all__ = ["taskError"]
