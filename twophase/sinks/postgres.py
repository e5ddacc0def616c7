"""The PostgreSQL participant: prepared transactions on executors, COMMIT PREPARED from the driver.

Each task attempt opens one connection, starts a two-phase transaction (psycopg's
``tpc_begin``) under a global id that names the sink, batch, partition, attempt and run (see
``_postgres_xid``), streams its Arrow record batches in, and ``PREPARE TRANSACTION``s it. The
handle it returns holds the gid, the transaction's numeric id, and where to reach the database
(host, port, database, user and non-secret libpq options), never a password. The driver then
runs ``COMMIT PREPARED`` / ``ROLLBACK PREPARED`` on an autocommit connection; a prepared
transaction survives its session, the executor and a server restart, so any process can finish
it.

- ``mode=append``: ``COPY <table> (<columns>) FROM STDIN (FORMAT csv)``, each record batch
  encoded by pyarrow's CSV writer and streamed as it arrives (memory stays at one batch).
- ``mode=upsert``: ``INSERT ... SELECT * FROM unnest($1::<type>[], ...) ON CONFLICT (<keys>)
  DO UPDATE``, one statement per chunk of ``upsertBatchRows`` rows, each column passed as one
  array literal built with pyarrow compute (temporary tables cannot be used in a prepared
  transaction). Within a task, the last row of a key wins.

``commit`` of a gid that is no longer prepared asks the server what became of the transaction
(``pg_xact_status``): committed (or too old to know) is a no-op, logged at INFO, because the
coordinator only commits decided handles; rolled back raises ``TransactionLostError``.
Connection failures on the driver raise ``TransientCommitError`` (the coordinator retries).

Plain Python apart from ``PostgresSink`` at the bottom, the Spark data source
``twophase.postgres``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import psycopg
import pyarrow as pa
from psycopg import errors as pgerrors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from pyspark.sql.types import StructType

from twophase.protocol import (
    Handle,
    RecoveryScope,
    TransactionContext,
    TransactionLostError,
    TransientCommitError,
    TwoPhaseParticipant,
)
from twophase.settings import TwoPhaseConfigError, boolOption, floatOption, intOption, optionOf
from twophase.sink import ParticipantSink
from twophase.sinks._postgres_types import (
    ColumnInfo,
    arrayLiteral,
    columnProblem,
    csvChunk,
    sparkTypeName,
    sqlalchemyType,
    unsupportedProblem,
)
from twophase.sinks._postgres_xid import GlobalXid, batchPrefix, sinkPrefix

log = logging.getLogger(__name__)

KIND = "postgres"
"""The ``kind`` of every handle this participant returns."""

MODES = ("append", "upsert")

_SECRET_PARAMS = frozenset({"password", "sslpassword"})
"""libpq parameters that never leave the process: not in handles, logs or errors."""

_OPTION_PARAMS = {
    "user": "user",
    "password": "password",
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "sslcrl": "sslcrl",
    "sslpassword": "sslpassword",
    "applicationName": "application_name",
    "targetSessionAttrs": "target_session_attrs",
}
"""Sink options passed to libpq under another (or the same) name; ``pg.<keyword>`` passes any."""

_URL_SECRET = re.compile(r"(?i)(://[^:/@\s]*:)[^@\s]*@|(password\s*=\s*)('[^']*'|\S+)")
_PERMANENT_CONNECT = (
    "password authentication failed",
    "no password supplied",
    "does not exist",
    "permission denied",
    "no pg_hba.conf entry",
    "certificate",
    "invalid ",
)


def _scrub(text: str) -> str:
    """``text`` with anything that looks like a password in a URL or conninfo cut out."""
    return _URL_SECRET.sub(
        lambda m: (m.group(1) or m.group(2)) + "***" + ("@" if m.group(1) else ""), text
    )


class PostgresSinkError(Exception):
    """A problem of the postgres sink that retrying the same work will not fix."""


class RowRejectedError(PostgresSinkError):
    """PostgreSQL refused a row (constraint, NOT NULL, bad value); names batch, column, fix."""


class PostgresUnavailableError(PostgresSinkError, ConnectionError):
    """The server could not be reached (or the connection broke) while a task was writing."""


# -- where the database is ------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionTarget:
    """Where to reach the database: libpq connection parameters without any secret.

    Travels in every handle, so a commit from any process reaches the same server and
    database as the task that prepared the transaction. The password comes from the sink's
    options when the process has them, else from libpq's usual places (``PGPASSWORD``,
    ``~/.pgpass``).
    """

    params: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        for key, _ in self.params:
            if key in _SECRET_PARAMS:
                raise ValueError(f"a connection target must not hold {key}")

    def get(self, key: str, default: str = "") -> str:
        for k, v in self.params:
            if k == key:
                return v
        return default

    def describe(self) -> str:
        """``user@host:port/dbname``: for logs and errors (never a password)."""
        host = self.get("host") or self.get("hostaddr") or "localhost"
        port = self.get("port") or "5432"
        user = self.get("user") or "<default user>"
        return f"{user}@{host}:{port}/{self.get('dbname') or '<default database>'}"

    def toJson(self) -> dict[str, str]:
        return dict(self.params)

    @classmethod
    def fromJson(cls, data: Any) -> ConnectionTarget:
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()
        ):
            raise ValueError(f"postgres handle has a bad connection: {data!r}")
        return cls(tuple(sorted((k, v) for k, v in data.items() if k not in _SECRET_PARAMS)))

    def samePlace(self, other: ConnectionTarget) -> bool:
        """Same host, port, database and user: the same credentials apply."""
        return all(
            self.get(k) == other.get(k) for k in ("host", "hostaddr", "port", "dbname", "user")
        )


# -- options ----------------------------------------------------------------------------------

_IDENT_PART = re.compile(r'\s*(?:"((?:[^"]|"")+)"|([^".\s]+))\s*')


def parseTableName(text: str) -> tuple[str, str]:
    """``schema.table`` as PostgreSQL reads it: unquoted parts fold to lower case, ``"Quoted"``
    parts keep their case (``""`` is a quote). An unqualified name means schema ``public``."""
    parts: list[str] = []
    pos = 0
    while True:
        match = _IDENT_PART.match(text, pos)
        if match is None or match.end() == pos:
            raise TwoPhaseConfigError(
                f"option table={text!r} is not a table name; use <schema>.<table> (quote parts "
                'with double quotes to keep upper case or dots: "MySchema"."My Table")'
            )
        quoted, plain = match.group(1), match.group(2)
        parts.append(quoted.replace('""', '"') if quoted is not None else plain.lower())
        pos = match.end()
        if pos == len(text):
            break
        if text[pos] != ".":
            raise TwoPhaseConfigError(f"option table={text!r}: unexpected {text[pos]!r}")
        pos += 1
    if len(parts) == 1:
        return "public", parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise TwoPhaseConfigError(
        f"option table={text!r} has {len(parts)} parts; use <schema>.<table> (the database "
        "comes from the url)"
    )


def _splitColumns(text: str) -> tuple[str, ...]:
    names = tuple(part.strip().strip('"') for part in text.split(","))
    if not all(names) or len(set(names)) != len(names):
        raise TwoPhaseConfigError(
            f"option keyColumns={text!r} must list distinct, non-empty column names separated "
            "by commas"
        )
    return names


@dataclass(frozen=True)
class PostgresSettings:
    """The postgres sink's options, parsed and checked once (``PostgresSettings.fromOptions``).

    - ``url`` (required): ``postgresql://user[:password]@host:port/dbname?sslmode=...`` (a
      ``jdbc:`` prefix is accepted) or a libpq ``key=value`` string. The password may instead
      come from the ``password`` option, ``PGPASSWORD`` or ``~/.pgpass`` (the driver's
      ``twophase recover`` relies on those: secrets are never written to the checkpoint).
    - ``table`` (required): ``schema.table`` (``public`` when unqualified); PostgreSQL's
      identifier rules, so ``"Quoted"`` keeps its case.
    - ``mode``: ``append`` (default, ``COPY``) or ``upsert`` (``INSERT ... ON CONFLICT``).
    - ``keyColumns``: comma-separated conflict columns, required by ``mode=upsert``; the table
      needs a primary key or unique index on exactly them.
    - ``createTable``: ``true`` creates a missing table from the stream's schema (a primary key
      on ``keyColumns`` in upsert mode); default ``false``.
    - ``user``, ``password``, ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``,
      ``sslcrl``, ``sslpassword``, ``applicationName`` (default ``twophase``),
      ``targetSessionAttrs``, and ``pg.<keyword>`` for any other libpq parameter: override the
      URL's.
    - ``connectTimeout``: seconds for one connection attempt (default 10).
    - ``connectRetrySeconds``: how long tasks and the driver's checks keep retrying to connect
      while the server is unreachable (default 30; 0 tries once).
    - ``lockTimeoutSeconds``: a task waiting longer than this for a row lock fails with an
      error naming the prepared transactions it waits for (default 60; 0 waits forever).
    - ``upsertBatchRows``: rows per ``INSERT ... ON CONFLICT`` statement (default 20000).
    """

    target: ConnectionTarget
    schema: str
    table: str
    mode: str = "append"
    keyColumns: tuple[str, ...] = ()
    createTable: bool = False
    connectRetrySeconds: float = 30.0
    lockTimeoutSeconds: float = 60.0
    upsertBatchRows: int = 20000
    secrets: tuple[tuple[str, str], ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise TwoPhaseConfigError(
                f"option mode={self.mode!r} is not supported; use append or upsert"
            )
        if self.mode == "upsert" and not self.keyColumns:
            raise TwoPhaseConfigError(
                "option mode=upsert needs option keyColumns: the comma-separated columns of the "
                "table's primary key or unique index that identify a row"
            )
        if self.mode == "append" and self.keyColumns:
            raise TwoPhaseConfigError(
                "option keyColumns is only used with mode=upsert; remove it, or set "
                "mode=upsert to update rows whose keys exist"
            )

    @property
    def qualifiedName(self) -> str:
        """The table as SQL text (quoted where needed), for messages."""
        return f"{_quoteIdent(self.schema)}.{_quoteIdent(self.table)}"

    @property
    def tableIdentifier(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.table)

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> PostgresSettings:
        """Parse Spark-style string options; errors name the option and the fix."""
        url = (optionOf(options, "url") or "").strip()
        if not url:
            raise TwoPhaseConfigError(
                'the postgres sink needs .option("url", "postgresql://user@host:5432/dbname") '
                "(the password may come from the password option, PGPASSWORD or ~/.pgpass)"
            )
        if url.lower().startswith("jdbc:"):
            url = url[5:]
        try:
            params = {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
        except psycopg.ProgrammingError as exc:
            raise TwoPhaseConfigError(
                "option url is not a PostgreSQL URL (postgresql://user@host:port/dbname) or a "
                f"libpq key=value string: {_scrub(str(exc))}"
            ) from None
        for name, keyword in _OPTION_PARAMS.items():
            value = optionOf(options, name)
            if value is not None:
                params[keyword] = value
        for key, value in options.items():
            if key.lower().startswith("pg.") and len(key) > 3:
                params[key[3:].lower()] = str(value)
        params.setdefault("application_name", "twophase")
        params["connect_timeout"] = str(intOption(options, "connectTimeout", 10, minimum=1))
        if not params.get("dbname"):
            raise TwoPhaseConfigError(
                "option url names no database; add it: postgresql://user@host:5432/<dbname>"
            )
        secrets = tuple(sorted((k, params.pop(k)) for k in _SECRET_PARAMS if k in params))
        target = ConnectionTarget(tuple(sorted(params.items())))

        tableText = (optionOf(options, "table") or optionOf(options, "dbtable") or "").strip()
        if not tableText:
            raise TwoPhaseConfigError(
                'the postgres sink needs .option("table", "<schema>.<table>")'
            )
        schema, table = parseTableName(tableText)
        mode = (optionOf(options, "mode") or "append").strip().lower()
        keysText = (optionOf(options, "keyColumns") or "").strip()
        return cls(
            target=target,
            schema=schema,
            table=table,
            mode=mode,
            keyColumns=_splitColumns(keysText) if keysText else (),
            createTable=boolOption(options, "createTable", False),
            connectRetrySeconds=_nonNegative(options, "connectRetrySeconds", 30.0),
            lockTimeoutSeconds=_nonNegative(options, "lockTimeoutSeconds", 60.0),
            upsertBatchRows=intOption(options, "upsertBatchRows", 20000, minimum=1),
            secrets=secrets,
        )


def _nonNegative(options: Mapping[str, str], name: str, default: float) -> float:
    raw = optionOf(options, name)
    if raw is not None and raw.strip() in ("0", "0.0"):
        return 0.0
    return floatOption(options, name, default)


def _quoteIdent(name: str) -> str:
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


# -- connections ------------------------------------------------------------------------------


def _isPermanentConnectError(exc: psycopg.OperationalError) -> bool:
    text = str(exc).lower()
    return any(marker in text for marker in _PERMANENT_CONNECT)


def connect(
    target: ConnectionTarget,
    secrets: tuple[tuple[str, str], ...],
    *,
    autocommit: bool,
    retrySeconds: float,
    what: str,
) -> psycopg.Connection[Any]:
    """Connect, retrying unreachable-server errors with backoff for up to ``retrySeconds``.

    Authentication and missing-database errors fail at once. Raises
    ``PostgresUnavailableError`` (message without secrets) when the server stays unreachable.
    """
    deadline = time.monotonic() + retrySeconds
    delay = 0.5
    attempt = 0
    while True:
        attempt += 1
        try:
            params: dict[str, Any] = {**dict(target.params), **dict(secrets)}
            return psycopg.connect(autocommit=autocommit, **params)
        except psycopg.OperationalError as exc:
            reason = " ".join(_scrub(str(exc)).split())
            if _isPermanentConnectError(exc):
                raise PostgresSinkError(
                    f"postgres: {what}: cannot connect to {target.describe()}: {reason}"
                ) from None
            if time.monotonic() + delay > deadline:
                raise PostgresUnavailableError(
                    f"postgres: {what}: PostgreSQL at {target.describe()} is unreachable after "
                    f"{attempt} attempt(s) in {retrySeconds:.0f} s: {reason}"
                ) from None
            log.warning(
                "postgres: %s: cannot reach %s (attempt %d): %s; retrying in %.1f s",
                what,
                target.describe(),
                attempt,
                reason,
                delay,
            )
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


class _DriverConnections:
    """Autocommit connections of one process, reused across commits (thread-safe).

    The coordinator commits handles from a thread pool, and recovery commits many: a fresh
    connection (TCP plus SCRAM) per handle would dominate the commit time. Broken connections
    are dropped, so a server restart costs one failed (retried) call.
    """

    maxIdle: ClassVar[int] = 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[object, ...], list[psycopg.Connection[Any]]] = {}

    @contextmanager
    def borrow(
        self,
        target: ConnectionTarget,
        secrets: tuple[tuple[str, str], ...],
        what: str,
        retrySeconds: float = 0.0,
    ) -> Iterator[psycopg.Connection[Any]]:
        key = (target.params, secrets)
        with self._lock:
            idle = self._idle.get(key) or []
            conn = idle.pop() if idle else None
        if conn is None or conn.closed or conn.broken:
            conn = connect(target, secrets, autocommit=True, retrySeconds=retrySeconds, what=what)
        try:
            yield conn
        finally:
            healthy = (
                not conn.closed
                and not conn.broken
                and conn.info.transaction_status == TransactionStatus.IDLE
            )
            kept = False
            with self._lock:
                idle = self._idle.setdefault(key, [])
                if healthy and len(idle) < self.maxIdle:
                    idle.append(conn)
                    kept = True
            if not kept:
                conn.close()


_DRIVER_CONNECTIONS = _DriverConnections()


@contextmanager
def _driverErrors(what: str, target: ConnectionTarget) -> Iterator[None]:
    """Connection trouble inside the block becomes ``TransientCommitError`` (retried)."""
    try:
        yield
    except PostgresUnavailableError as exc:
        raise TransientCommitError(str(exc)) from None
    except psycopg.OperationalError as exc:
        if isinstance(exc, pgerrors.LockNotAvailable | pgerrors.QueryCanceled):
            raise TransientCommitError(f"postgres: {what}: {exc}") from None
        raise TransientCommitError(
            f"postgres: {what}: connection to {target.describe()} failed: "
            f"{' '.join(_scrub(str(exc)).split())}"
        ) from None


# -- the transaction --------------------------------------------------------------------------


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


# -- the participant --------------------------------------------------------------------------


class PostgresParticipant(TwoPhaseParticipant[PostgresTransaction]):
    """Exactly-once into one PostgreSQL table through prepared transactions.

    Guarantees:

    - Nothing a task writes is visible before the driver's ``COMMIT PREPARED``; a failed task
      rolls back (its connection closes), a killed one leaves at most a prepared transaction
      that ``recoverAndAbort`` rolls back unless a decision keeps it.
    - ``commit``, ``abort`` and ``recoverAndCommit`` are idempotent; ``commit`` of a
      transaction that the server rolled back raises ``TransactionLostError``.
    - ``recoverAndAbort`` touches only gids with this sink's prefix, in the sink's database.
    - Memory per task is one record batch and its CSV text (append) or one chunk of
      ``upsertBatchRows`` rows (upsert).

    Executor methods (``beginTransaction``, ``write``, ``preCommit``, ``abortTransaction``)
    run in one task attempt; driver methods (``validateTarget``, ``commit``, ``abort``,
    ``recoverAndAbort``) in any process, with the handle and the same options.
    """

    kind: ClassVar[str] = KIND

    def __init__(self, settings: PostgresSettings) -> None:
        self.settings = settings

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> PostgresParticipant:
        return cls(PostgresSettings.fromOptions(options))

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"PostgresParticipant(table={s.qualifiedName}, mode={s.mode}, at={s.target.describe()})"
        )

    # -- driver: checks before a batch -------------------------------------------------------

    def validateTarget(self, schema: pa.Schema) -> None:
        """Driver, before each batch: check the server, the table and the stream's columns.

        Fails with ``TwoPhaseConfigError`` naming the problem and the fix when
        ``max_prepared_transactions`` is 0, the table is missing (and ``createTable`` is off),
        a stream column is missing from the table or of a type it cannot hold exactly, a
        NOT NULL column without default is not in the stream, or (upsert) no unique index
        matches ``keyColumns``. Creates the table when ``createTable`` is on.
        """
        s = self.settings
        for f in schema:
            problem = unsupportedProblem(f.name, f.type)
            if problem:
                raise TwoPhaseConfigError(f"postgres sink, table {s.qualifiedName}: {problem}")
        missingKeys = [k for k in s.keyColumns if k not in schema.names]
        if missingKeys:
            raise TwoPhaseConfigError(
                f"option keyColumns names {missingKeys}, which the stream does not have (its "
                f"columns: {schema.names}); fix keyColumns or add the columns"
            )
        what = f"checking table {s.qualifiedName}"
        deadline = time.monotonic() + s.connectRetrySeconds
        while True:
            try:
                # The first connection of a batch waits for a restarting server, as tasks do.
                with _DRIVER_CONNECTIONS.borrow(
                    s.target, s.secrets, what, retrySeconds=s.connectRetrySeconds
                ) as conn:
                    self._checkTarget(conn, schema)
                return
            except psycopg.OperationalError as exc:  # a pooled connection the server dropped
                reason = " ".join(_scrub(str(exc)).split())
                if time.monotonic() >= deadline:
                    raise PostgresUnavailableError(
                        f"postgres: {what}: connection to {s.target.describe()} failed: {reason}"
                    ) from None
                log.warning("postgres: %s: %s; retrying on a new connection", what, reason)
                time.sleep(1.0)

    def _checkTarget(self, conn: psycopg.Connection[Any], schema: pa.Schema) -> None:
        s = self.settings
        self._checkPreparedTransactions(conn)
        columns = self._tableColumns(conn)
        if columns is None:
            if not s.createTable:
                raise TwoPhaseConfigError(
                    f"table {s.qualifiedName} does not exist in database "
                    f"{s.target.describe()}; create it, or set option createTable=true to "
                    "create it from the stream's schema"
                )
            self._createTable(conn, schema)
            columns = self._tableColumns(conn)
            if columns is None:
                raise PostgresSinkError(f"table {s.qualifiedName} vanished after CREATE")
        self._checkColumns(schema, columns)
        if s.mode == "upsert":
            self._checkConflictIndex(conn)

    def _checkPreparedTransactions(self, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()
        limit = int(row[0]) if row else 0
        if limit > 0:
            return
        raise TwoPhaseConfigError(
            f"PostgreSQL at {self.settings.target.describe()} has max_prepared_transactions = 0, "
            "so it cannot PREPARE TRANSACTION, which the twophase.postgres sink needs: every "
            "task of a micro-batch holds one prepared transaction until the driver commits. Set "
            "max_prepared_transactions in postgresql.conf (or ALTER SYSTEM SET "
            "max_prepared_transactions = 100) to at least the number of partitions of a batch, "
            "plus what other clients prepare, then restart the server (the setting only "
            "changes at server start)."
        )

    def _tableColumns(self, conn: psycopg.Connection[Any]) -> dict[str, ColumnInfo] | None:
        s = self.settings
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

    def _createTable(self, conn: psycopg.Connection[Any], schema: pa.Schema) -> None:
        from sqlalchemy import Column, MetaData, Table
        from sqlalchemy.dialects import postgresql
        from sqlalchemy.schema import CreateTable

        s = self.settings
        exists = conn.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (s.schema,)
        ).fetchone()
        if exists is None:
            raise TwoPhaseConfigError(
                f"option createTable=true cannot create {s.qualifiedName}: schema "
                f"{_quoteIdent(s.schema)} does not exist; CREATE SCHEMA {_quoteIdent(s.schema)} "
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

    def _checkColumns(self, schema: pa.Schema, columns: Mapping[str, ColumnInfo]) -> None:
        s = self.settings
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

    def _checkConflictIndex(self, conn: psycopg.Connection[Any]) -> None:
        s = self.settings
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
        cols = ", ".join(_quoteIdent(k) for k in s.keyColumns)
        raise TwoPhaseConfigError(
            f"option keyColumns={','.join(s.keyColumns)}: table {s.qualifiedName} has no primary "
            f"key or unique index on exactly ({cols}), which INSERT ... ON CONFLICT needs; "
            f"CREATE UNIQUE INDEX ON {s.qualifiedName} ({cols}), or fix keyColumns"
        )

    # -- executor side -----------------------------------------------------------------------

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
        # Instants travel as UTC wall-clock text (see _postgres_types.utcWallClock).
        conn.execute(
            "SELECT set_config('lock_timeout', %s, false), set_config('TimeZone', 'UTC', false)",
            (f"{int(s.lockTimeoutSeconds * 1000)}ms",),
        )
        conn.autocommit = False
        conn.tpc_begin(txn.gid)
        columns = sql.SQL(", ").join(sql.Identifier(n) for n in schema.names)
        if s.mode == "append":
            statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
                s.tableIdentifier, columns
            )
            txn.copy = txn.stack.enter_context(conn.cursor().copy(statement))
        else:
            txn.upsertSql = self._upsertStatement(conn, schema)

    def _upsertStatement(self, conn: psycopg.Connection[Any], schema: pa.Schema) -> sql.Composed:
        s = self.settings
        types = dict(
            conn.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
                " JOIN pg_class c ON c.oid = a.attrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0"
                " AND NOT a.attisdropped",
                (s.schema, s.table),
            ).fetchall()
        )
        missing = [n for n in schema.names if n not in types]
        if missing:
            raise TwoPhaseConfigError(
                f"table {s.qualifiedName} has no column(s) {missing}; was it altered while the "
                "query ran?"
            )
        names = schema.names
        arrays = sql.SQL(", ").join(
            sql.SQL("%s::{}[]").format(sql.SQL(types[n]))
            for n in names  # type from the catalog
        )
        updates = [n for n in names if n not in s.keyColumns]
        action = (
            sql.SQL("DO UPDATE SET {}").format(
                sql.SQL(", ").join(
                    sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(n), sql.Identifier(n))
                    for n in updates
                )
            )
            if updates
            else sql.SQL("DO NOTHING")
        )
        return sql.SQL(
            "INSERT INTO {table} ({cols}) SELECT * FROM unnest({arrays}) AS u({cols}) "
            "ON CONFLICT ({keys}) {action}"
        ).format(
            table=s.tableIdentifier,
            cols=sql.SQL(", ").join(sql.Identifier(n) for n in names),
            arrays=arrays,
            keys=sql.SQL(", ").join(sql.Identifier(k) for k in s.keyColumns),
            action=action,
        )

    def _upsert(self, txn: PostgresTransaction, batch: pa.RecordBatch) -> None:
        assert txn.conn is not None and txn.upsertSql is not None
        step = self.settings.upsertBatchRows
        with txn.conn.cursor() as cur:
            for offset in range(0, batch.num_rows, step):
                chunk = lastPerKey(batch.slice(offset, step), self.settings.keyColumns)
                cur.execute(txn.upsertSql, [arrayLiteral(c) for c in chunk.columns])

    def preCommit(self, txn: PostgresTransaction) -> Handle:
        """Executor: end the COPY, ``PREPARE TRANSACTION``, close the session; return the handle.

        Nothing is visible yet. Calling it again returns the same handle. Handle format::

            {"kind": "postgres", "gid": <gid or null when the task had no rows>,
             "xid": <the transaction's id, text>, "batchId": N, "partitionId": p,
             "attempt": a, "rows": n, "table": "<schema>.<table>",
             "connection": {"host": ..., "port": ..., "dbname": ..., "user": ..., ...}}
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
                xid = _currentXid(txn.conn)
                txn.conn.tpc_prepare()
                gid = txn.gid
            txn.conn.close()
            txn.conn = None
        handle: Handle = {
            "kind": KIND,
            "gid": gid,
            "xid": xid,
            "batchId": ctx.batchId,
            "partitionId": ctx.partitionId,
            "attempt": ctx.attemptNumber,
            "rows": txn.rows,
            "table": self.settings.qualifiedName,
            "connection": self.settings.target.toJson(),
        }
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
                self.abort(txn.handle)
            except Exception:
                log.warning("postgres: could not roll back prepared %s; recovery will", txn.gid)

    @contextmanager
    def _taskErrors(self, txn: PostgresTransaction) -> Iterator[None]:
        """psycopg errors of a task, turned into errors that name the batch and the fix."""
        try:
            yield
        except psycopg.Error as exc:
            raise self._taskError(txn, exc) from None

    def _taskError(self, txn: PostgresTransaction, exc: psycopg.Error) -> Exception:
        s = self.settings
        ctx = txn.ctx
        where = (
            f"postgres sink {ctx.sinkId}, batch {ctx.batchId}, partition {ctx.partitionId} "
            f"(attempt {ctx.attemptNumber}), table {s.qualifiedName}"
        )
        diag = exc.diag
        primary = diag.message_primary or " ".join(_scrub(str(exc)).split())
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
            return RowRejectedError(
                f"{where}: PostgreSQL rejected a row: {primary} ({'; '.join(facts)}).{detail} "
                f"Nothing of batch {ctx.batchId} becomes visible: its transactions are rolled "
                "back and the query fails. Fix the data in Spark (filter or fill the column) or "
                "the table's constraint, then restart the query: the batch is written again."
            )
        if isinstance(exc, pgerrors.LockNotAvailable):
            blockers = self._preparedOfSink(ctx.sinkId)
            return PostgresSinkError(
                f"{where}: waited more than lockTimeoutSeconds={s.lockTimeoutSeconds:g} for a "
                f"row lock ({primary}). Prepared transactions of this sink: "
                f"{blockers or 'none'}. A prepared transaction keeps its locks until the driver "
                "commits it, so two tasks of one batch must not write the same key (in upsert "
                "mode repartition the DataFrame by keyColumns), and a task attempt that was "
                "killed after PREPARE blocks its retry until the query restarts and recovery "
                "rolls it back."
            )
        if isinstance(exc, psycopg.OperationalError) and (txn.conn is None or txn.conn.broken):
            return PostgresUnavailableError(
                f"{where}: lost the connection to {s.target.describe()}: {primary}. Nothing of "
                "this task is visible; Spark retries the task, and a failed batch is written "
                "again when the query restarts."
            )
        return PostgresSinkError(
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

    # -- driver side: every method idempotent -------------------------------------------------

    def _handleTarget(self, h: Handle) -> tuple[ConnectionTarget, tuple[tuple[str, str], ...]]:
        target = ConnectionTarget.fromJson(h.get("connection"))
        secrets = self.settings.secrets if target.samePlace(self.settings.target) else ()
        return target, secrets

    def commit(self, handle: Handle) -> None:
        """Driver, idempotent: ``COMMIT PREPARED``; a gid no longer prepared is checked.

        The coordinator commits only decided handles, so a gid that is not prepared any more
        was committed by an earlier call: logged at INFO, nothing done. When the server says
        the transaction was rolled back instead, ``TransactionLostError``. Unreachable server:
        ``TransientCommitError``.
        """
        h = _checkHandle(handle)
        if h["gid"] is None:
            return
        target, secrets = self._handleTarget(h)
        what = f"commit of {self.describe(h)}"
        with _driverErrors(what, target), _DRIVER_CONNECTIONS.borrow(target, secrets, what) as conn:
            try:
                conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(h["gid"])))
            except pgerrors.UndefinedObject:
                status = _xactStatus(conn, h.get("xid"))
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
        """Driver, idempotent: ``ROLLBACK PREPARED``; a gid that is gone is a no-op."""
        h = _checkHandle(handle)
        if h["gid"] is None:
            return
        target, secrets = self._handleTarget(h)
        what = f"abort of {self.describe(h)}"
        with _driverErrors(what, target), _DRIVER_CONNECTIONS.borrow(target, secrets, what) as conn:
            try:
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(h["gid"])))
            except pgerrors.UndefinedObject:
                log.debug("postgres: %s: not prepared (already finished)", what)
                return
        log.debug("postgres: rolled back %s", h["gid"])

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle]:
        """Driver, idempotent: roll back this sink's prepared transactions that no kept handle
        names, in the sink's database (all batches, or only ``scope.batchId``).

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
            _driverErrors(what, s.target),
            _DRIVER_CONNECTIONS.borrow(s.target, s.secrets, what) as conn,
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
                aborted.append(_briefHandle(gid, s))
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


def lastPerKey(batch: pa.RecordBatch, keys: tuple[str, ...]) -> pa.RecordBatch:
    """``batch`` with only the last row of each key (rows with a NULL key are all kept).

    ``INSERT ... ON CONFLICT DO UPDATE`` refuses to touch one row twice in a statement.
    """
    if batch.num_rows < 2:
        return batch
    table = pa.Table.from_batches([batch]).select(list(keys))
    valid = np.ones(batch.num_rows, dtype=bool)
    for column in table.columns:
        if column.null_count:
            valid &= column.is_valid().to_numpy(zero_copy_only=False)
    index = np.arange(batch.num_rows, dtype=np.int64)
    keyed = table.filter(pa.array(valid)).append_column("__row", pa.array(index[valid]))
    last = keyed.group_by(list(keys), use_threads=False).aggregate([("__row", "max")])
    if last.num_rows == int(valid.sum()):
        return batch
    keepRows = np.sort(np.concatenate([last.column("__row_max").to_numpy(), index[~valid]]))
    return batch.take(pa.array(keepRows))


def _currentXid(conn: psycopg.Connection[Any]) -> str:
    query = (
        "SELECT pg_current_xact_id()::text"
        if conn.info.server_version >= 130000
        else "SELECT txid_current()::text"
    )
    row = conn.execute(query).fetchone()
    return str(row[0]) if row else ""


def _xactStatus(conn: psycopg.Connection[Any], xid: Any) -> str | None:
    """``committed``, ``aborted``, ``in progress``, or ``None`` when the server cannot tell."""
    if not isinstance(xid, str) or not xid.isdigit():
        return None
    query = (
        "SELECT pg_xact_status(%s::xid8)"
        if conn.info.server_version >= 130000
        else "SELECT txid_status(%s::bigint)"
    )
    try:
        row = conn.execute(query, (xid,)).fetchone()
    except psycopg.DatabaseError:  # too old, or from another server: nothing to learn
        return None
    return str(row[0]) if row and row[0] is not None else None


def _briefHandle(gid: str, settings: PostgresSettings) -> Handle:
    parts = GlobalXid.parse(gid)
    handle: Handle = {
        "kind": KIND,
        "gid": gid,
        "table": settings.qualifiedName,
        "connection": settings.target.toJson(),
    }
    if parts is not None:
        handle.update(batchId=parts.batchId, partitionId=parts.partitionId, attempt=parts.attempt)
    return handle


def _checkHandle(handle: Handle) -> Handle:
    """Refuse anything that is not a well-formed postgres handle before touching the server."""
    if handle.get("kind") != KIND:
        raise ValueError(f"not a postgres handle (kind={handle.get('kind')!r})")
    gid = handle.get("gid")
    if gid is not None and (not isinstance(gid, str) or GlobalXid.parse(gid) is None):
        raise ValueError(f"postgres handle has a bad gid {gid!r}")
    ConnectionTarget.fromJson(handle.get("connection"))
    return handle


def arrowSchemaOf(schema: StructType) -> pa.Schema:
    """The Arrow schema PySpark hands the tasks for a Spark schema; errors name the column."""
    from pyspark.sql.pandas.types import to_arrow_type

    fields = []
    for f in schema.fields:
        try:
            arrowType = to_arrow_type(f.dataType, timezone="UTC")
            fields.append(pa.field(f.name, arrowType, nullable=f.nullable))
        except Exception:
            raise TwoPhaseConfigError(
                f"column {f.name!r} has type {f.dataType.simpleString()}, which the postgres sink "
                "cannot write; cast it to a primitive type (e.g. to_json(col) or a string)"
            ) from None
    return pa.schema(fields)


__all__ = [
    "KIND",
    "MODES",
    "ConnectionTarget",
    "PostgresParticipant",
    "PostgresSettings",
    "PostgresSink",
    "PostgresSinkError",
    "PostgresTransaction",
    "PostgresUnavailableError",
    "RowRejectedError",
    "arrowSchemaOf",
    "lastPerKey",
    "parseTableName",
]


class PostgresSink(ParticipantSink):
    """``twophase.postgres``: the Spark data source over ``PostgresParticipant``.

    ``df.writeStream.format("twophase.postgres").option("url", ...).option("table", ...)
    .option("checkpointLocation", ...).start()`` after ``twophase.register(spark)``.
    """

    @classmethod
    def name(cls) -> str:
        return "twophase.postgres"

    def makeParticipant(self) -> PostgresParticipant:
        return PostgresParticipant.fromOptions(self.options)

    def validate(self, schema: StructType) -> None:
        participant = self.participant
        assert isinstance(participant, PostgresParticipant)
        participant.validateTarget(arrowSchemaOf(schema))
