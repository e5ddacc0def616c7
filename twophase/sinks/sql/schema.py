"""Driver checks before a batch: the server can run the sink, the table can take the stream.

Run once per micro-batch before any task, so every problem here is reported before data is
written: a server without two-phase commit (PostgreSQL's ``max_prepared_transactions = 0``,
MariaDB older than 10.5), a user who may not list prepared XA transactions, a table on an
engine without transactions (MyISAM, Aria), a missing table without ``createTable``, missing
columns, an xid that would not fit. ``createTable`` creates the table from the stream's schema,
and the marker table (and the dead-letter table of ``badRecords``) is created when missing.
"""

from __future__ import annotations

import re

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from twophase.sinks.relational.options import checkKeysInStream
from twophase.sinks.sql.connections import connection, engineFor, isAccessDenied
from twophase.sinks.sql.dialect import (
    MAX_XID_BYTES,
    badRecordsTable,
    checkXidRoom,
    columnType,
    errorMessage,
    markerTable,
)
from twophase.sinks.sql.errors import SqlSinkError
from twophase.sinks.sql.privileges import checkPrivileges
from twophase.sinks.sql.settings import SqlSettings


def validateTarget(s: SqlSettings, schema: pa.Schema, sinkId: str) -> None:
    """Driver: raise ``SqlSinkError`` naming the fix, or ``SqlUnavailableError`` (retryable)."""
    checkXidRoom(sinkId, MAX_XID_BYTES[s.family])
    checkKeysInStream(s.keyColumns, schema.names)
    engine = engineFor(
        s.url, pooled=True, connectTimeout=s.connectTimeout, socketTimeout=s.socketTimeout
    )
    what = f"checking table {s.qualifiedName}"
    with connection(engine, what, autocommit=True, retrySeconds=s.connectRetrySeconds) as conn:
        if s.family == "mysql":
            _checkMysqlServer(s, conn)
            checkPrivileges(conn, s)
        else:
            _checkPostgresServer(s, conn)
        inspector = sa.inspect(conn)
        if not inspector.has_table(s.table, schema=s.schema):
            if not s.createTable:
                raise SqlSinkError(
                    f"sql sink: table {s.qualifiedName} does not exist at {s.describe()} "
                    f"(or user {s.url.username!r} holds no privilege on it, which hides it); "
                    "create it (or grant the user INSERT on it), or set option "
                    "createTable=true to create it from the stream's schema"
                )
            tableOf(s, schema).create(conn, checkfirst=True)
        _checkEngine(s, conn, s.table)
        columns = {c["name"] for c in inspector.get_columns(s.table, schema=s.schema)}
        missing = [n for n in schema.names if n not in columns]
        if missing:
            raise SqlSinkError(
                f"sql sink: table {s.qualifiedName} has no column(s) {missing} of the stream "
                f"(table columns: {sorted(columns)}); add them or select fewer columns"
            )
        markerTable(s.markerTable, s.schema).create(conn, checkfirst=True)
        _checkEngine(s, conn, s.markerTable)
        if s.badRecords is not None:
            _checkBadRecordsTable(s, conn, s.badRecords)


def _checkBadRecordsTable(s: SqlSettings, conn: Connection, name: str) -> None:
    """The dead-letter table of ``badRecords``: created when missing, else it must have the
    columns the sink writes."""
    table = badRecordsTable(name, s.schema)
    table.create(conn, checkfirst=True)
    _checkEngine(s, conn, name)
    columns = {c["name"] for c in sa.inspect(conn).get_columns(name, schema=s.schema)}
    missing = [c.name for c in table.columns if c.name not in columns]
    if missing:
        qualified = f"{s.schema}.{name}" if s.schema else name
        raise SqlSinkError(
            f"sql sink: the badRecords table {qualified} has no column(s) {missing}; it holds "
            f"rows the database rejected ({', '.join(c.name for c in table.columns)}): name "
            "another table in option badRecords and the sink creates it, or drop this one"
        )


def tableOf(s: SqlSettings, schema: pa.Schema) -> sa.Table:
    """The table ``createTable`` makes: the stream's columns, the keys as primary key."""
    columns = []
    for f in schema:
        isKey = f.name in s.keyColumns
        try:
            kind = columnType(f.type, s.family, isKey)
        except ValueError:
            raise SqlSinkError(
                f"sql sink: createTable has no column type for {f.name} ({f.type}); create "
                f"table {s.qualifiedName} yourself or cast the column in Spark"
            ) from None
        columns.append(
            sa.Column(f.name, kind, primary_key=isKey, nullable=not isKey, autoincrement=False)
        )
    return sa.Table(s.table, sa.MetaData(schema=s.schema), *columns, mysql_engine="InnoDB")


def _checkMysqlServer(s: SqlSettings, conn: Connection) -> None:
    version = str(conn.exec_driver_sql("SELECT VERSION()").scalar())
    m = re.match(r"(\d+)\.(\d+)", version)
    if "mariadb" in version.lower() and m and (int(m[1]), int(m[2])) < (10, 5):
        raise SqlSinkError(
            f"sql sink: MariaDB {version} at {s.describe()} rolls back a prepared XA "
            "transaction when the session that prepared it ends, so the driver could not "
            "commit it; use MariaDB 10.5 or newer"
        )
    try:
        conn.exec_driver_sql("XA RECOVER").fetchall()
    except sa.exc.DBAPIError as exc:
        if not isAccessDenied(exc):
            raise
        raise SqlSinkError(
            f"sql sink: user {s.url.username!r} may not run XA RECOVER at {s.describe()} "
            f"({errorMessage(exc)}); the driver lists prepared transactions to recover. Run "
            f"GRANT XA_RECOVER_ADMIN ON *.* TO '{s.url.username}'@'<host>' (MySQL 8) or "
            f"GRANT SUPER ON *.* TO '{s.url.username}'@'<host>' (MariaDB)"
        ) from None


def _checkPostgresServer(s: SqlSettings, conn: Connection) -> None:
    limit = int(conn.exec_driver_sql("SHOW max_prepared_transactions").scalar() or 0)
    if limit == 0:
        raise SqlSinkError(
            f"sql sink: PostgreSQL at {s.describe()} has max_prepared_transactions = 0, so "
            "it cannot prepare transactions; set it in postgresql.conf above the number of "
            "partitions a batch writes (plus other clients' needs) and restart the server"
        )


def _checkEngine(s: SqlSettings, conn: Connection, table: str) -> None:
    """MySQL/MariaDB: the table must be on a transactional engine with XA (InnoDB)."""
    if s.family != "mysql":
        return
    engine = conn.execute(
        sa.text(
            "SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
            "COALESCE(:schema, DATABASE()) AND TABLE_NAME = :name"
        ),
        {"schema": s.schema, "name": table},
    ).scalar()
    if engine is not None and str(engine).lower() != "innodb":
        name = f"{s.schema}.{table}" if s.schema else table
        raise SqlSinkError(
            f"sql sink: table {name} uses ENGINE={engine}, which ignores XA transactions "
            "(rows would be visible before the commit and survive a rollback); run ALTER "
            f"TABLE {name} ENGINE=InnoDB"
        )


__all__ = ["tableOf", "validateTarget"]
