"""The target table, checked on the driver before each batch: server, table, columns, keys.

``validateTarget`` fails with ``TwoPhaseConfigError`` naming the problem and the fix before any
task runs, and creates a missing table when ``createTable`` is on. Spark-free: the binding
hands it the Arrow schema its tasks will see.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import psycopg
import pyarrow as pa

from twophase.clients.postgres import PostgresUnavailableError, errorText
from twophase.clients.postgres_driver import DRIVER_CONNECTIONS
from twophase.redaction import getLogger
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.postgres import deadletter
from twophase.sinks.postgres.dialect import quoteIdent
from twophase.sinks.postgres.errors import PostgresSinkError
from twophase.sinks.postgres.privileges import checkPrivileges
from twophase.sinks.postgres.settings import PostgresSettings
from twophase.sinks.postgres.staging import ensureStagingTables
from twophase.sinks.postgres.types import (
    ColumnInfo,
    columnProblem,
    sparkTypeName,
    sqlalchemyType,
    unsupportedProblem,
)
from twophase.sinks.relational.options import checkKeysInStream

log = getLogger(__name__)


def validateTarget(settings: PostgresSettings, schema: pa.Schema, sinkId: str = "") -> None:
    """Driver, before each batch: check the server, the table and the stream's columns.

    ``sinkId`` is taken as every sink's check takes it (``twophase.sinks.registry``); a gid
    holds any sink id, so PostgreSQL has nothing to check of it.

    Fails with ``PostgresSinkError`` (reason ``CREDENTIALS``) naming each grant the sink's role
    lacks and the ``GRANT`` that fixes it (``privileges``), and with ``TwoPhaseConfigError``
    naming the problem and the fix when
    ``max_prepared_transactions`` is 0 under ``commitMode=prepared``, the table is missing (and
    ``createTable`` is off), a stream column is missing from the table or of a type it cannot
    hold exactly, a NOT NULL column without default is not in the stream, or (upsert) no unique
    index matches ``keyColumns``. Creates the table when ``createTable`` is on, the dead-letter
    table of ``badRecords`` (``deadletter``), and the staging and marker tables (``staging``)
    unless every partition is prepared (``commitMode=prepared``, or ``badRecords``).
    """
    s = settings
    for f in schema:
        problem = unsupportedProblem(f.name, f.type)
        if problem:
            raise TwoPhaseConfigError(f"postgres sink, table {s.qualifiedName}: {problem}")
    checkKeysInStream(s.keyColumns, schema.names)
    what = f"checking table {s.qualifiedName}"
    deadline = time.monotonic() + s.connectRetrySeconds
    while True:
        try:
            # The first connection of a batch waits for a restarting server, as tasks do.
            with DRIVER_CONNECTIONS.borrow(
                s.target,
                s.secrets,
                what,
                retrySeconds=s.connectRetrySeconds,
                socketTimeout=s.socketTimeout,
            ) as conn:
                _checkTarget(conn, s, schema)
            return
        except psycopg.OperationalError as exc:  # a pooled connection the server dropped
            reason = errorText(exc)
            if time.monotonic() >= deadline:
                raise PostgresUnavailableError(
                    f"postgres: {what}: connection to {s.target.describe()} failed: {reason}"
                ) from None
            log.warning("postgres: %s: %s; retrying on a new connection", what, reason)
            time.sleep(1.0)


def _checkTarget(conn: psycopg.Connection[Any], s: PostgresSettings, schema: pa.Schema) -> None:
    checkPreparedTransactions(conn, s)
    checkPrivileges(conn, s)
    columns = tableColumns(conn, s)
    if columns is None:
        if not s.createTable:
            raise TwoPhaseConfigError(
                f"table {s.qualifiedName} does not exist in database "
                f"{s.target.describe()}; create it, or set option createTable=true to "
                "create it from the stream's schema"
            )
        createTable(conn, s, schema)
        columns = tableColumns(conn, s)
        if columns is None:
            raise PostgresSinkError(f"table {s.qualifiedName} vanished after CREATE")
    _checkColumns(s, schema, columns)
    if s.mode == "upsert":
        _checkConflictIndex(conn, s)
    if s.badRecords is not None:
        deadletter.ensureTable(conn, s)
    elif s.commitMode != "prepared":
        ensureStagingTables(conn, s, schema.names)


def checkPreparedTransactions(conn: psycopg.Connection[Any], s: PostgresSettings) -> None:
    """With ``commitMode=prepared``, refuse a server with ``max_prepared_transactions = 0``,
    saying how to change it (``auto`` and ``staged`` then stage every partition)."""
    row = conn.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()
    limit = int(row[0]) if row else 0
    if limit > 0 or (s.commitMode != "prepared" and s.badRecords is None):
        return
    if s.badRecords is not None:
        raise TwoPhaseConfigError(
            f"PostgreSQL at {s.target.describe()} has max_prepared_transactions = 0, so it "
            "cannot PREPARE TRANSACTION, which option badRecords needs: rejected rows are set "
            "aside in each task's prepared transaction. Set badRecords=fail (the default), or "
            "set max_prepared_transactions in postgresql.conf to at least the number of "
            "partitions of a batch and restart the server."
        )
    raise TwoPhaseConfigError(
        f"PostgreSQL at {s.target.describe()} has max_prepared_transactions = 0, "
        "so it cannot PREPARE TRANSACTION, which commitMode=prepared needs: every "
        "task of a micro-batch holds one prepared transaction until the driver commits. Set "
        "commitMode=auto (the default) or staged, which stage the rows instead; or set "
        "max_prepared_transactions in postgresql.conf (or ALTER SYSTEM SET "
        "max_prepared_transactions = 100) to at least the number of partitions of a batch, "
        "plus what other clients prepare, then restart the server (the setting only "
        "changes at server start)."
    )


def tableColumns(
    conn: psycopg.Connection[Any], s: PostgresSettings
) -> dict[str, ColumnInfo] | None:
    """The table's columns by name, from ``information_schema``; ``None`` if it is missing."""
    rows = conn.execute(
        "SELECT column_name, data_type, udt_name, is_nullable = 'YES',"
        " column_default IS NOT NULL OR is_identity = 'YES',"
        " is_generated = 'ALWAYS', numeric_precision, numeric_scale"
        " FROM information_schema.columns"
        " WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (s.schema, s.table),
    ).fetchall()
    if not rows:
        return None
    return {
        r[0]: ColumnInfo(
            name=r[0],
            dataType=r[1],
            udtName=r[2],
            nullable=bool(r[3]),
            hasDefault=bool(r[4]),
            generated=bool(r[5]),
            numericPrecision=r[6] if r[1] == "numeric" else None,
            numericScale=r[7] if r[1] == "numeric" else None,
        )
        for r in rows
    }


def createTable(conn: psycopg.Connection[Any], s: PostgresSettings, schema: pa.Schema) -> None:
    """``CREATE TABLE IF NOT EXISTS`` from the stream's schema (primary key on keyColumns)."""
    from sqlalchemy import Column, MetaData, Table
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateTable

    exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (s.schema,)).fetchone()
    if exists is None:
        raise TwoPhaseConfigError(
            f"option createTable=true cannot create {s.qualifiedName}: schema "
            f"{quoteIdent(s.schema)} does not exist; CREATE SCHEMA {quoteIdent(s.schema)} "
            "first (or name an existing schema in option table)"
        )
    keys = set(s.keyColumns)
    table = Table(
        s.table,
        MetaData(),
        *[
            Column(
                f.name,
                sqlalchemyType(f.type),
                nullable=f.nullable and f.name not in keys,
                primary_key=f.name in keys,
                autoincrement=False,
            )
            for f in schema
        ],
        schema=s.schema,
    )
    ddl = str(CreateTable(table, if_not_exists=True).compile(dialect=postgresql.dialect()))
    conn.execute(ddl)
    log.info("postgres: created table %s: %s", s.qualifiedName, " ".join(ddl.split()))


def _checkColumns(
    s: PostgresSettings, schema: pa.Schema, columns: Mapping[str, ColumnInfo]
) -> None:
    problems: list[str] = []
    for f in schema:
        info = columns.get(f.name)
        if info is None:
            near = [c for c in columns if c.lower() == f.name.lower()]
            hint = (
                f" (the table has {near[0]!r}: rename the DataFrame column to match, "
                "PostgreSQL names are case-sensitive)"
                if near
                else " (add it with ALTER TABLE ... ADD COLUMN, or drop it from the DataFrame)"
            )
            problems.append(f"column {f.name!r} is not in the table{hint}")
            continue
        problem = columnProblem(f.name, f.type, info)
        if problem:
            problems.append(problem)
    for info in columns.values():
        if (
            info.name not in schema.names
            and not info.nullable
            and not info.hasDefault
            and not info.generated
        ):
            problems.append(
                f"table column {info.name!r} is NOT NULL without a default, and the stream "
                "has no such column (add it to the DataFrame, or give the column a default)"
            )
    if problems:
        raise TwoPhaseConfigError(
            f"the stream cannot be written to table {s.qualifiedName}: "
            + "; ".join(problems)
            + ". Stream columns: "
            + ", ".join(f"{f.name} {sparkTypeName(f.type)}" for f in schema)
        )


def _checkConflictIndex(conn: psycopg.Connection[Any], s: PostgresSettings) -> None:
    rows = conn.execute(
        "SELECT array_agg(a.attname::text ORDER BY a.attname)"
        " FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(i.indkey)"
        " WHERE n.nspname = %s AND c.relname = %s AND i.indisunique AND i.indpred IS NULL"
        "   AND i.indexprs IS NULL"
        " GROUP BY i.indexrelid",
        (s.schema, s.table),
    ).fetchall()
    wanted = sorted(s.keyColumns)
    if any(list(r[0]) == wanted for r in rows):
        return
    cols = ", ".join(quoteIdent(k) for k in s.keyColumns)
    raise TwoPhaseConfigError(
        f"option keyColumns={','.join(s.keyColumns)}: table {s.qualifiedName} has no primary "
        f"key or unique index on exactly ({cols}), which INSERT ... ON CONFLICT needs; "
        f"CREATE UNIQUE INDEX ON {s.qualifiedName} ({cols}), or fix keyColumns"
    )
