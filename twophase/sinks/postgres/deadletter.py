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
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import errors as pgerrors
from psycopg import sql

from twophase.protocol import TransactionContext
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.postgres.rejections import Rejection, describe
from twophase.sinks.postgres.settings import PostgresSettings, quoteIdent

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


def rowJson(batch: pa.RecordBatch, index: int) -> str:
    """Row ``index`` of ``batch`` as JSON: bytes as hex, values JSON lacks as text."""
    row = batch.slice(index, 1).to_pylist()[0]
    return json.dumps(row, default=lambda v: v.hex() if isinstance(v, bytes) else str(v))


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
            rowJson(batch, index),
        )
        for position, rejection, batch, index in refused
    ]
