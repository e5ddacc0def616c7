"""What differs between the sql sink's database families: names, statements, xids, errors.

MySQL and MariaDB (``mysql``) run XA transactions (``XA BEGIN/END/PREPARE/COMMIT``, listed by
``XA RECOVER``); PostgreSQL (``postgresql``) runs ``PREPARE TRANSACTION`` / ``COMMIT PREPARED``,
listed by ``pg_prepared_xacts``. SQLAlchemy's dialects issue the two-phase statements (but a
task's ``PREPARE TRANSACTION``: ``prepareTwoPhase``); this module holds the rest: how a table
name is read, a task attempt's xid within the family's limit (the layout is shared,
``twophase.sinks.relational.naming``), the bulk and upsert ``INSERT`` text, the commit-marker
table, which prepared xids belong to a prefix, value conversion from Arrow, and the driver
error codes.
"""

from __future__ import annotations

import functools
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from sqlalchemy.dialects.mysql import LONGTEXT
from sqlalchemy.engine import Connection, Dialect

from twophase.protocol import TransactionContext
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.relational.naming import TransactionName
from twophase.sinks.relational.options import NameRule
from twophase.sinks.sql.errors import XidTooLongError

MAX_XID_BYTES = {"mysql": 64, "postgresql": 199}
"""Longest transaction id each family takes: the XA gtrid (64), PostgreSQL's gid (199)."""

NAMES = NameRule(maxLength=64, folds=False)
"""A plain table name: MySQL/MariaDB's 64 characters, its case kept."""

ROOM_BATCH_DIGITS = 12
"""Digits of batch id that ``checkXidRoom`` keeps room for (a trillion micro-batches)."""
ROOM_PARTITION_DIGITS = 6
ROOM_ATTEMPT_DIGITS = 3

DRIVER_ERRORS: tuple[type[Exception], ...] = (sa.exc.DBAPIError, psycopg.Error)
"""What a database call may raise: SQLAlchemy's wrapped errors, and psycopg's own (the
psycopg dialect's two-phase calls go to the driver's ``tpc_*`` methods unwrapped)."""

MYSQL_XAER_NOTA = 1397
MYSQL_XAER_RMFAIL = 1399
MYSQL_ACCESS_DENIED = (1044, 1045, 1142, 1227, 1370)
MYSQL_NO_TABLE = 1146
PG_UNDEFINED_OBJECT = "42704"


def parseTableName(text: str) -> tuple[str | None, str]:
    """Option ``dbtable``: ``table`` or ``schema.table``, each part a plain name."""
    parts = text.split(".")
    if len(parts) > 2 or any(NAMES.plain(p) is None for p in parts):
        raise TwoPhaseConfigError(
            f"option dbtable={text!r} must be <table> or <schema>.<table>, each part letters, "
            f"digits, _ or $ (at most {NAMES.maxLength} characters)"
        )
    return (parts[0] if len(parts) == 2 else None), parts[-1]


def xidFor(ctx: TransactionContext, maxBytes: int) -> TransactionName:
    """A fresh xid for one task attempt (the shared layout without the run field);
    ``XidTooLongError`` past ``maxBytes``."""
    xid = TransactionName.forContext(ctx, withRun=False)
    if len(str(xid).encode()) > maxBytes:
        raise XidTooLongError(_tooLong(ctx.sinkId, str(xid), maxBytes))
    return xid


def checkXidRoom(sinkId: str, maxBytes: int) -> None:
    """Driver, before a batch: refuse a sink id whose xids could pass ``maxBytes``."""
    widest = TransactionName(
        sinkId,
        10**ROOM_BATCH_DIGITS - 1,
        10**ROOM_PARTITION_DIGITS - 1,
        10**ROOM_ATTEMPT_DIGITS - 1,
        "0" * 8,
    )
    if len(str(widest).encode()) > maxBytes:
        raise XidTooLongError(_tooLong(sinkId, str(widest), maxBytes))


def _tooLong(sinkId: str, xid: str, maxBytes: int) -> str:
    spare = len(xid.encode()) - maxBytes
    return (
        f"sql sink: transaction id {xid!r} is {len(xid.encode())} bytes; the server takes at "
        f"most {maxBytes} (MySQL/MariaDB XA gtrid). Nothing was written. Set option sinkId to "
        f"at most {max(1, len(sinkId) - spare)} characters (it is {len(sinkId)}: "
        f"{sinkId!r}), or leave it unset (the default is 15 characters)."
    )


def quote(dialect: Dialect, name: str) -> str:
    return str(dialect.identifier_preparer.quote(name))


def tableText(dialect: Dialect, schema: str | None, table: str) -> str:
    quoted = quote(dialect, table)
    return f"{quote(dialect, schema)}.{quoted}" if schema else quoted


def insertStatement(
    dialect: Dialect,
    family: str,
    table: str,
    columns: list[str],
    mode: str,
    keys: tuple[str, ...],
) -> str:
    """One row's ``INSERT`` with ``%s`` placeholders (both pymysql and psycopg take them).

    ``executemany`` of it is a multi-row ``INSERT`` on pymysql (it rewrites ``VALUES (...)``,
    ``ON DUPLICATE KEY UPDATE`` included) and a pipelined batch on psycopg.
    """
    head, tail = insertParts(dialect, family, table, columns, mode, keys)
    return f"{head}({', '.join(['%s'] * len(columns))}){tail}"


def insertParts(
    dialect: Dialect,
    family: str,
    table: str,
    columns: list[str],
    mode: str,
    keys: tuple[str, ...],
) -> tuple[str, str]:
    """What goes before the rows of an ``INSERT`` (``INSERT INTO t (a, b) VALUES ``) and
    after them (the upsert clause, or nothing)."""
    cols = [quote(dialect, c) for c in columns]
    head = f"INSERT INTO {table} ({', '.join(cols)}) VALUES "
    if mode != "upsert":
        return head, ""
    others = [quote(dialect, c) for c in columns if c not in keys]
    if family == "mysql":
        if not others:  # every column is a key: a duplicate changes nothing
            first = quote(dialect, keys[0])
            return head, f" ON DUPLICATE KEY UPDATE {first} = {first}"
        sets = ", ".join(f"{c} = VALUES({c})" for c in others)
        return head, f" ON DUPLICATE KEY UPDATE {sets}"
    target = ", ".join(quote(dialect, k) for k in keys)
    if not others:
        return head, f" ON CONFLICT ({target}) DO NOTHING"
    sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in others)
    return head, f" ON CONFLICT ({target}) DO UPDATE SET {sets}"


def valuesText(batch: pa.RecordBatch, backslashEscapes: bool) -> pa.Array | None:
    """MySQL/MariaDB: each row of ``batch`` as the SQL text ``(v1,v2,...)``, built by Arrow's
    compute kernels (no Python per value); ``None`` when a column's type has no text form here
    (binary, nested), and the caller falls back to the driver's ``executemany``.

    Numbers and booleans go bare, strings, dates and timestamps (UTC, no zone) quoted:
    ``'`` doubled, and ``\\`` and NUL escaped unless the session has
    ``NO_BACKSLASH_ESCAPES`` (``backslashEscapes`` false). NULL is the keyword.
    """
    texts = []
    for column in batch.columns:
        t = column.type
        if pa.types.is_timestamp(t):
            column = column.cast(pa.timestamp(t.unit))  # UTC wall time, no zone
        if (
            pa.types.is_integer(t)
            or pa.types.is_floating(t)
            or pa.types.is_decimal(t)
            or pa.types.is_boolean(t)
        ):
            text = column.cast(pa.string())
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            text = column.cast(pa.string())
            if backslashEscapes:
                text = pc.replace_substring(text, "\\", "\\\\")
                text = pc.replace_substring(text, "\x00", "\\0")
            text = pc.replace_substring(text, "'", "''")
            text = pc.binary_join_element_wise("'", text, "'", "")
        elif pa.types.is_date(t) or pa.types.is_timestamp(t):
            text = pc.binary_join_element_wise("'", column.cast(pa.string()), "'", "")
        else:
            return None
        texts.append(pc.fill_null(text, "NULL"))
    joined = pc.binary_join_element_wise(*texts, ",")
    return pc.binary_join_element_wise("(", joined, ")", "")


@functools.cache
def markerTable(name: str, schema: str | None = None) -> sa.Table:
    """The commit markers: one row per prepared xid, written inside its transaction.

    A marker is visible exactly when its transaction committed, so a committer that finds an
    xid no longer prepared tells "committed" (marker) from "lost" (no marker). One ``Table``
    per name and process (every task writes a marker).
    """
    return sa.Table(
        name,
        sa.MetaData(schema=schema),
        sa.Column("xid", sa.String(200), primary_key=True),
        sa.Column("sink_id", sa.String(64), nullable=False, index=True),
        sa.Column("batch_id", sa.BigInteger, nullable=False),
        sa.Column("partition_id", sa.Integer, nullable=False),
        sa.Column("row_count", sa.BigInteger, nullable=False),
        mysql_engine="InnoDB",
    )


@functools.cache
def badRecordsTable(name: str, schema: str | None = None) -> sa.Table:
    """The dead-letter table of option ``badRecords``: one row per rejected row, written in
    the transaction of the task that met it (so committed with its batch, or never): the
    task's xid, the row's position in its task (counting from 0), the column the database
    named, why it refused the row, and the row as JSON."""
    return sa.Table(
        name,
        sa.MetaData(schema=schema),
        sa.Column("xid", sa.String(200), primary_key=True),
        sa.Column("row_position", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("sink_id", sa.String(64), nullable=False, index=True),
        sa.Column("batch_id", sa.BigInteger, nullable=False),
        sa.Column("partition_id", sa.Integer, nullable=False),
        sa.Column("error_column", sa.String(200), nullable=True),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("record", sa.Text().with_variant(LONGTEXT(), "mysql"), nullable=False),
        mysql_engine="InnoDB",
    )


def beginTwoPhase(conn: Connection, family: str, xid: str) -> None:
    """Open a task's two-phase transaction: ``XA BEGIN '<xid>'`` (the MySQL dialect's own
    call); on PostgreSQL nothing yet, psycopg sends ``BEGIN`` before the first statement."""
    if family == "mysql":
        conn.dialect.do_begin_twophase(conn, xid)


def prepareTwoPhase(conn: Connection, family: str, xid: str) -> None:
    """Prepare it: ``XA END`` + ``XA PREPARE`` (the MySQL dialect's call), or ``PREPARE
    TRANSACTION '<xid>'`` sent as SQL. Not psycopg's ``tpc_prepare()`` (what SQLAlchemy's
    psycopg dialect calls): that ties the client connection to the prepared transaction until
    it commits or rolls it back, while the server has already let go of it and the session
    could serve the next task."""
    if family == "mysql":
        conn.dialect.do_prepare_twophase(conn, xid)
        return
    conn.execute(
        sa.text("PREPARE TRANSACTION :xid").bindparams(
            sa.bindparam("xid", xid, literal_execute=True)
        )
    )


def rollbackTwoPhase(conn: Connection, family: str, xid: str) -> None:
    """Roll back a task's transaction that is not prepared: ``XA END`` + ``XA ROLLBACK``, or
    ``ROLLBACK``."""
    if family == "mysql":
        conn.dialect.do_rollback_twophase(conn, xid, is_prepared=False)
    else:
        conn.rollback()


def preparedXids(conn: Connection, family: str, prefix: str) -> list[str]:
    """The prepared transactions whose xid starts with ``prefix`` (this database only on
    PostgreSQL, whose ``COMMIT PREPARED`` must run in the transaction's database)."""
    if family == "mysql":
        found = []
        for row in conn.exec_driver_sql("XA RECOVER").mappings():
            if int(row["formatID"]) != 1 or int(row["bqual_length"]) != 0:
                continue
            data = row["data"]
            raw = data[: int(row["gtrid_length"])]
            xid = raw.decode("utf-8", "replace") if isinstance(raw, bytes | bytearray) else raw
            if xid.startswith(prefix):
                found.append(xid)
        return found
    rows = conn.exec_driver_sql(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
        "AND starts_with(gid, %s) ORDER BY prepared",
        (prefix,),
    )
    return [str(r[0]) for r in rows]


def isDriverError(exc: BaseException) -> bool:
    """A database error: SQLAlchemy's wrapper, or a driver's own (pymysql, psycopg)."""
    if isinstance(exc, DRIVER_ERRORS):
        return True
    return type(exc).__module__.startswith(("pymysql.", "psycopg."))


def mysqlCode(exc: BaseException) -> int | None:
    """The MySQL/MariaDB error number of a (wrapped) pymysql error."""
    orig = getattr(exc, "orig", exc)
    args = getattr(orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def pgState(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", exc)
    state = getattr(orig, "sqlstate", None)
    return str(state) if state else None


def isUnknownXid(exc: BaseException, family: str) -> bool:
    """The server does not know the xid as prepared (finished, or never prepared)."""
    if family == "mysql":
        return mysqlCode(exc) == MYSQL_XAER_NOTA
    return pgState(exc) == PG_UNDEFINED_OBJECT


def errorMessage(exc: BaseException) -> str:
    """The driver's own message, without SQLAlchemy's statement and parameters."""
    orig = getattr(exc, "orig", None)
    if orig is None:
        return str(exc).split("\n")[0]
    args: tuple[object, ...] = tuple(getattr(orig, "args", ()))
    if len(args) >= 2 and isinstance(args[0], int):
        return f"{args[1]} (error {args[0]})"
    return str(orig).split("\n")[0]


def rowsOf(batch: pa.RecordBatch, family: str) -> list[tuple[Any, ...]]:
    """The batch's rows as tuples of Python values the driver sends.

    Timestamps with a time zone go to MySQL/MariaDB as UTC without a zone (pymysql drops the
    zone, and DATETIME has none; the sink's sessions use time_zone '+00:00'); PostgreSQL gets
    them with the zone (``timestamptz``).
    """
    columns = []
    for column in batch.columns:
        t = column.type
        if family == "mysql" and pa.types.is_timestamp(t) and t.tz is not None:
            column = column.cast(pa.timestamp(t.unit))
        columns.append(column.to_pylist())
    return list(zip(*columns, strict=True))


def columnType(t: pa.DataType, family: str, isKey: bool) -> sa.types.TypeEngine[Any]:
    """The column type ``createTable`` gives an Arrow (Spark) type; ``ValueError`` if none."""
    from sqlalchemy.dialects import mysql

    if pa.types.is_boolean(t):
        return sa.Boolean()
    if pa.types.is_int8(t) or pa.types.is_int16(t):
        return sa.SmallInteger()
    if pa.types.is_int32(t):
        return sa.Integer()
    if pa.types.is_int64(t):
        return sa.BigInteger()
    if pa.types.is_float32(t):
        return sa.Float(24) if family == "mysql" else sa.REAL()
    if pa.types.is_float64(t):
        return sa.Double()
    if pa.types.is_decimal(t):
        return sa.Numeric(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        if family == "mysql":
            return sa.String(255) if isKey else mysql.LONGTEXT()
        return sa.Text()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        if family == "mysql":
            return mysql.VARBINARY(255) if isKey else mysql.LONGBLOB()
        return sa.LargeBinary()
    if pa.types.is_date(t):
        return sa.Date()
    if pa.types.is_timestamp(t):
        if family == "mysql":
            return mysql.DATETIME(fsp=6)
        return sa.DateTime(timezone=t.tz is not None)
    raise ValueError(f"no column type for {t}")


__all__ = [
    "MAX_XID_BYTES",
    "NAMES",
    "checkXidRoom",
    "parseTableName",
    "xidFor",
    "beginTwoPhase",
    "prepareTwoPhase",
    "rollbackTwoPhase",
    "columnType",
    "errorMessage",
    "insertParts",
    "insertStatement",
    "valuesText",
    "isUnknownXid",
    "markerTable",
    "preparedXids",
    "rowsOf",
]
