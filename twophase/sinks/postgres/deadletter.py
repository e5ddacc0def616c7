"""Rows PostgreSQL rejects, set aside in a dead-letter table inside the task's own transaction.

With the option ``badRecords=<table>``, a task sends each record batch under a savepoint; when
PostgreSQL rejects a row (a data error or a constraint, SQLSTATE classes 22 and 23) the
statement is undone alone, the rows before it are sent again, the rejected row goes to the
dead-letter table, and the rows after it are sent on. The dead-letter rows are written in the
task's prepared transaction, so they are committed with their batch exactly once, or never.

The table sits beside the target and is created by the driver when missing::

    gid text, row_position bigint   the task attempt's gid and the row's position in it
    sink_id, batch_id, partition_id where it came from
    error_column, error             the column PostgreSQL named, and why (no value shown)
    record jsonb                    the row (bytes as hex, other values as JSON or text)

``ensureTable`` is the driver's; ``sendSettingAside`` the tasks'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
from psycopg import errors as pgerrors
from psycopg import sql

from twophase.protocol import TransactionContext
from twophase.redaction import getLogger
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.postgres.dialect import quoteIdent
from twophase.sinks.postgres.encoding import arrayLiteral, csvChunk
from twophase.sinks.postgres.rejections import Rejection, describe, locateInChunk, rejectionOf
from twophase.sinks.postgres.settings import PostgresSettings
from twophase.sinks.postgres.statements import copyStatement, upsertChunks
from twophase.sinks.relational.rejections import recordJson

log = getLogger(__name__)

COLUMNS = (
    "gid",
    "row_position",
    "sink_id",
    "batch_id",
    "partition_id",
    "error_column",
    "error",
    "record",
)


def identifier(s: PostgresSettings) -> sql.Identifier:
    assert s.badRecords is not None
    return sql.Identifier(s.schema, s.badRecords)


def qualifiedName(s: PostgresSettings) -> str:
    assert s.badRecords is not None
    return f"{quoteIdent(s.schema)}.{quoteIdent(s.badRecords)}"


def ddl(s: PostgresSettings) -> sql.Composed:
    """The statement that creates the dead-letter table of ``s`` when it is missing."""
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {table} (gid text NOT NULL, row_position bigint NOT NULL, "
        "sink_id text NOT NULL, batch_id bigint NOT NULL, partition_id integer NOT NULL, "
        "error_column text, error text NOT NULL, record jsonb NOT NULL, "
        "PRIMARY KEY (gid, row_position))"
    ).format(table=identifier(s))


def ensureTable(conn: psycopg.Connection[Any], s: PostgresSettings) -> None:
    """Driver: create the dead-letter table when missing, else check it has the columns the
    sink writes. Errors name the table, what is wrong and the fix."""
    name = qualifiedName(s)
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    try:
        if row is None or not row[0]:
            with conn.transaction():
                conn.execute(ddl(s))
    except pgerrors.InsufficientPrivilege:
        raise TwoPhaseConfigError(
            f"postgres sink, option badRecords: cannot create the dead-letter table {name}; "
            f"grant the sink's user CREATE on schema {quoteIdent(s.schema)}, or have an "
            f"administrator run: {ddl(s).as_string(conn)}"
        ) from None
    found = {
        row[0]
        for row in conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s",
            (s.schema, s.badRecords),
        ).fetchall()
    }
    missing = [c for c in COLUMNS if c not in found]
    if missing:
        raise TwoPhaseConfigError(
            f"postgres sink: the badRecords table {name} has no column(s) {missing}; it holds "
            "another table's rows. Name another table in option badRecords and the sink "
            "creates it, or drop this one"
        )


def insertStatement(s: PostgresSettings) -> sql.Composed:
    return sql.SQL(
        "INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb)"
    ).format(
        table=identifier(s),
        columns=sql.SQL(", ").join(sql.Identifier(c) for c in COLUMNS),
    )


def deadLetterRows(
    ctx: TransactionContext,
    gid: str,
    refused: Sequence[tuple[int, Rejection, pa.RecordBatch, int]],
) -> list[tuple[Any, ...]]:
    """The dead-letter table's rows for ``refused``: (the row's position in the task, the
    server's rejection, the batch holding the row, its index there)."""
    return [
        (
            gid,
            position,
            ctx.sinkId,
            ctx.batchId,
            ctx.partitionId,
            rejection.column,
            describe(rejection, ctx.partitionId),
            recordJson(batch, index),
        )
        for position, rejection, batch, index in refused
    ]


Refused = list[tuple[int, Rejection, pa.RecordBatch, int]]
"""Rows set aside: their position in the task, the rejection, the batch holding them, the
index there."""


@dataclass(frozen=True)
class Sent:
    """One record batch of a task: its rows, the task's position of its first row, and for
    upsert mode the statement and the table's column types (``statements.tableTypes``)."""

    batch: pa.RecordBatch
    first: int
    upsertSql: sql.Composed | None = None
    types: dict[str, tuple[str, str]] = field(default_factory=dict)


def sendSettingAside(
    conn: psycopg.Connection[Any],
    s: PostgresSettings,
    ctx: TransactionContext,
    gid: str,
    sent: Sent,
) -> int:
    """Executor: write ``sent`` into the task's open transaction on ``conn``, setting the rows
    PostgreSQL rejects aside in the dead-letter table; how many it set aside."""
    refused: Refused = []
    if s.mode == "append":
        _copyAside(conn, s, sent, refused)
    else:
        _upsertAside(conn, s, sent, refused)
    if not refused:
        return 0
    with conn.cursor() as cur:
        cur.executemany(insertStatement(s), deadLetterRows(ctx, gid, refused))
    log.warning(
        "postgres: batch %d partition %d: %d row(s) rejected by PostgreSQL, set aside in %s "
        "(the first: %s)",
        ctx.batchId,
        ctx.partitionId,
        len(refused),
        qualifiedName(s),
        describe(refused[0][1], ctx.partitionId),
    )
    return len(refused)


Send = Callable[[pa.RecordBatch], None]


def _copyAside(
    conn: psycopg.Connection[Any], s: PostgresSettings, sent: Sent, refused: Refused
) -> None:
    """Append: one COPY for the batch; when PostgreSQL rejects a row, the rows before the line
    it names are sent again, the named row alone (set aside if refused again: a line that
    does not match a row sets nothing good aside), then the rest."""

    def copy(rows: pa.RecordBatch) -> None:
        with conn.cursor() as cur, cur.copy(copyStatement(s, rows.schema.names)) as stream:
            stream.write(memoryview(csvChunk(rows)))

    batch, start = sent.batch, 0
    while start < batch.num_rows:
        rest = batch.slice(start)
        exc = _refusal(conn, rest, copy)
        if exc is None:
            return
        line = rejectionOf(exc).row  # COPY's line N is the statement's row N - 1
        if line is None or not 0 <= line < rest.num_rows:
            _oneByOne(conn, sent, range(start, batch.num_rows), copy, refused)
            return
        if line > 0 and _refusal(conn, rest.slice(0, line), copy) is not None:
            _oneByOne(conn, sent, range(start, start + line), copy, refused)
        _oneByOne(conn, sent, [start + line], copy, refused)
        start += line + 1


def _upsertAside(
    conn: psycopg.Connection[Any], s: PostgresSettings, sent: Sent, refused: Refused
) -> None:
    """Upsert: each chunk's statement under a savepoint; a rejected chunk row by row (the
    server names no row, and for a value too long no column: found as the task's errors do)."""
    statement = sent.upsertSql
    assert statement is not None

    def upsert(rows: pa.RecordBatch) -> None:
        with conn.cursor() as cur:
            cur.execute(statement, [arrayLiteral(c) for c in rows.columns])

    types = {name: declared for name, (declared, _) in sent.types.items()}
    for chunk in upsertChunks(s, sent.batch):
        kept = chunk.batch
        if _refusal(conn, kept, upsert) is None:
            continue
        for index in range(kept.num_rows):
            one = kept.slice(index, 1)
            exc = _refusal(conn, one, upsert)
            if exc is not None:
                position = sent.first + int(chunk.rows[index])
                where = np.array([position], dtype=np.int64)
                rejection = locateInChunk(rejectionOf(exc), one, where, types)
                refused.append((position, replace(rejection, row=position), kept, index))


def _oneByOne(
    conn: psycopg.Connection[Any], sent: Sent, indexes: Iterable[int], send: Send, refused: Refused
) -> None:
    for index in indexes:
        exc = _refusal(conn, sent.batch.slice(index, 1), send)
        if exc is not None:
            position = sent.first + index
            refused.append((position, replace(rejectionOf(exc), row=position), sent.batch, index))


def _refusal(
    conn: psycopg.Connection[Any], rows: pa.RecordBatch, send: Send
) -> psycopg.Error | None:
    """Send ``rows`` under a savepoint: PostgreSQL's rejection of one of them (the statement
    then undone alone), else ``None``; other errors are raised."""
    conn.execute("SAVEPOINT twophase_rows")
    try:
        send(rows)
    except (pgerrors.IntegrityError, pgerrors.DataError) as exc:
        conn.execute("ROLLBACK TO SAVEPOINT twophase_rows")
        return exc
    conn.execute("RELEASE SAVEPOINT twophase_rows")
    return None
