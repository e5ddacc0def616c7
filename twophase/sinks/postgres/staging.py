"""The staged commit path: rows committed into a staging table, moved by the driver at once.

A task that cannot (or should not) hold a prepared transaction ``COPY``s its rows into the
staging table next to the target, tagged with a token naming its attempt (a gid, see ``xid``),
and commits normally: the rows are durable but no reader of the target sees them. The driver's
commit moves the token's rows into the target and writes a marker row, in ONE transaction::

    WITH moved AS (DELETE FROM <staging> WHERE __tp_token = <token> RETURNING <columns>)
    INSERT INTO <target> (<columns>) SELECT <columns> FROM moved [ON CONFLICT ... DO UPDATE]
    INSERT INTO <markers> (token, sink_id, batch_id, rows) VALUES (...)

so a second commit finds no rows but the marker (a no-op), and a handle whose rows are gone
without a marker was aborted or swept (``TransactionLostError``). Names, next to the target in
its schema (63-byte PostgreSQL identifiers; a longer table name is cut and given a hash)::

    <table>_twophase_staging    the target's columns + __tp_token (text), __tp_seq (bigint)
    <table>_twophase_commits    token (primary key), sink_id, batch_id, rows, committed_at

Both are created by the driver (``ensureStagingTables``, which needs CREATE on the schema) or
beforehand by an administrator with ``stagingDdl``'s statements.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql

from twophase.redaction import getLogger
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.postgres.dialect import quoteIdent
from twophase.sinks.postgres.settings import PostgresSettings
from twophase.sinks.postgres.statements import conflictAction
from twophase.sinks.relational.naming import batchPrefix, sinkPrefix

log = getLogger(__name__)

TOKEN_COLUMN = "__tp_token"
"""Staging column naming the task attempt (its gid-formatted token) a row belongs to."""

SEQ_COLUMN = "__tp_seq"
"""Staging column with the row's position in its task (last row per key wins in upsert)."""

STAGING_SUFFIX = "_twophase_staging"
MARKERS_SUFFIX = "_twophase_commits"
MAX_IDENT_BYTES = 63


def _nextTo(table: str, suffix: str) -> str:
    """``<table><suffix>``, cut to 63 bytes with a hash of the full name when too long."""
    name = table + suffix
    if len(name.encode()) <= MAX_IDENT_BYTES:
        return name
    digest = hashlib.sha1(table.encode()).hexdigest()[:8]
    room = MAX_IDENT_BYTES - len(suffix) - len(digest) - 1
    head = table.encode()[:room].decode(errors="ignore")
    return f"{head}_{digest}{suffix}"


@dataclass(frozen=True)
class StagingNames:
    """Schema and names of a target's staging and marker tables."""

    schema: str
    staging: str
    markers: str

    @classmethod
    def of(cls, s: PostgresSettings) -> StagingNames:
        return cls(s.schema, _nextTo(s.table, STAGING_SUFFIX), _nextTo(s.table, MARKERS_SUFFIX))

    @classmethod
    def fromHandle(cls, handle: dict[str, Any]) -> StagingNames:
        staging, markers = handle.get("staging"), handle.get("markers")
        if not (
            isinstance(staging, list)
            and isinstance(markers, list)
            and len(staging) == 2
            and len(markers) == 2
            and staging[0] == markers[0]
            and all(isinstance(x, str) and x for x in staging + markers)
        ):
            raise ValueError(f"staged postgres handle has bad staging names {staging!r}")
        return cls(staging[0], staging[1], markers[1])

    @property
    def stagingId(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.staging)

    @property
    def markersId(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.markers)

    @property
    def stagingText(self) -> str:
        return f"{quoteIdent(self.schema)}.{quoteIdent(self.staging)}"

    @property
    def markersText(self) -> str:
        return f"{quoteIdent(self.schema)}.{quoteIdent(self.markers)}"


def stagingDdl(s: PostgresSettings) -> list[sql.Composed]:
    """The statements that create the staging and marker tables of ``s``'s target.

    The staging table copies the target's columns, defaults, NOT NULL and CHECK constraints
    (``LIKE ... INCLUDING``), so a row the target would refuse for those reasons fails the
    task, before anything is decided; unique keys and foreign keys are checked at the move.
    """
    n = StagingNames.of(s)
    return [
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {staging} (LIKE {target} INCLUDING DEFAULTS "
            "INCLUDING CONSTRAINTS INCLUDING GENERATED INCLUDING IDENTITY, "
            '{token} text COLLATE "C" NOT NULL, {seq} bigint NOT NULL)'
        ).format(
            staging=n.stagingId,
            target=s.tableIdentifier,
            token=sql.Identifier(TOKEN_COLUMN),
            seq=sql.Identifier(SEQ_COLUMN),
        ),
        sql.SQL("CREATE INDEX IF NOT EXISTS {index} ON {staging} ({token})").format(
            index=sql.Identifier(_nextTo(n.staging, "_token")),
            staging=n.stagingId,
            token=sql.Identifier(TOKEN_COLUMN),
        ),
        sql.SQL(
            'CREATE TABLE IF NOT EXISTS {markers} (token text COLLATE "C" PRIMARY KEY, '
            "sink_id text NOT NULL, batch_id bigint NOT NULL, rows bigint NOT NULL, "
            "committed_at timestamptz NOT NULL DEFAULT now())"
        ).format(markers=n.markersId),
        sql.SQL("CREATE INDEX IF NOT EXISTS {index} ON {markers} (sink_id, batch_id)").format(
            index=sql.Identifier(_nextTo(n.markers, "_batch")), markers=n.markersId
        ),
    ]


def ensureStagingTables(
    conn: psycopg.Connection[Any], s: PostgresSettings, streamColumns: list[str]
) -> None:
    """Driver: create the staging and marker tables when missing; add stream columns the
    staging table lacks (the target was altered). Missing privilege: an error with the DDL
    under ``commitMode=staged``; a warning under ``auto``, whose prepared partitions need no
    staging table (a task that would stage then fails before writing, naming the fixes)."""
    n = StagingNames.of(s)
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
        (n.stagingText, n.markersText),
    ).fetchone()
    if row is None or not (row[0] and row[1]):
        try:
            with conn.transaction():
                for statement in stagingDdl(s):
                    conn.execute(statement)
        except pgerrors.InsufficientPrivilege as exc:
            ddl = "; ".join(st.as_string(conn) for st in stagingDdl(s))
            if s.commitMode == "auto":
                # A query that never has more partitions than its prepared budget keeps
                # working as before; a task that would stage fails before writing and
                # names the same fixes (see the writer's error for a missing staging table).
                log.warning(
                    "postgres sink, table %s: cannot create the staging tables %s and %s "
                    "(%s), so partitions at or beyond maxPreparedPartitions will fail; grant "
                    "CREATE on schema %s, or have an administrator run: %s",
                    s.qualifiedName,
                    n.stagingText,
                    n.markersText,
                    exc.diag.message_primary,
                    quoteIdent(s.schema),
                    ddl,
                )
                return
            role = conn.execute("SELECT current_user").fetchone()
            raise TwoPhaseConfigError(
                f"postgres sink, table {s.qualifiedName}: commitMode={s.commitMode} needs the "
                f"staging table {n.stagingText} and the marker table {n.markersText}, and "
                f"creating them failed: {exc.diag.message_primary}. Grant CREATE on schema "
                f"{quoteIdent(s.schema)} (and SELECT on the target, which CREATE TABLE ... "
                f"LIKE reads) to the sink's role {role[0] if role else '?'!r}, or have an "
                "administrator run: "
                f"{ddl}; then grant the sink's user SELECT, INSERT, DELETE on both. Or set "
                "commitMode=prepared (then every partition of a batch needs one of the "
                "server's max_prepared_transactions)."
            ) from None
        log.info("postgres: staging tables %s and %s ready", n.stagingText, n.markersText)
    have = {
        r[0]
        for r in conn.execute(
            "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = to_regclass(%s)"
            " AND a.attnum > 0 AND NOT a.attisdropped",
            (n.stagingText,),
        ).fetchall()
    }
    missing = [c for c in streamColumns if c not in have]
    for column in missing:
        [(typeName,)] = conn.execute(
            "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
            " WHERE a.attrelid = to_regclass(%s) AND a.attname = %s",
            (s.qualifiedName, column),
        ).fetchall()
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                n.stagingId, sql.Identifier(column), sql.SQL(typeName)
            )
        )
        log.info("postgres: added column %s to staging table %s", column, n.stagingText)


def stagingCopyStatement(n: StagingNames, names: list[str]) -> sql.Composed:
    """``COPY <staging> (<names>, __tp_token, __tp_seq) FROM STDIN (FORMAT csv)``."""
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in [*names, TOKEN_COLUMN, SEQ_COLUMN])
    return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(n.stagingId, columns)


def moveStatement(
    n: StagingNames, target: sql.Identifier, columns: list[str], keys: list[str]
) -> sql.Composed:
    """Delete one token's staged rows and insert them into the target; returns the row count.

    Upsert (``keys``): the last staged row per key wins (``__tp_seq``), as in the prepared
    path; rows with a NULL key are all inserted, as ``ON CONFLICT`` does.
    """
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    if keys:
        keyIds = [sql.Identifier(k) for k in keys]
        anyNull = sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(k) for k in keyIds)
        distinct = sql.SQL(", ").join(
            [
                *keyIds,
                sql.SQL("(CASE WHEN {} THEN {} END)").format(anyNull, sql.Identifier(SEQ_COLUMN)),
            ]
        )
        action = conflictAction(columns, keys)
        select = sql.SQL(
            "SELECT DISTINCT ON ({distinct}) {cols} FROM moved "
            "ORDER BY {distinct}, {seq} DESC ON CONFLICT ({keys}) {action}"
        ).format(
            distinct=distinct,
            cols=cols,
            seq=sql.Identifier(SEQ_COLUMN),
            keys=sql.SQL(", ").join(keyIds),
            action=action,
        )
    else:
        select = sql.SQL("SELECT {cols} FROM moved ORDER BY {seq}").format(
            cols=cols, seq=sql.Identifier(SEQ_COLUMN)
        )
    return sql.SQL(
        "WITH moved AS (DELETE FROM {staging} WHERE {token} = %(token)s "
        "RETURNING {cols}, {seq}), "
        "ins AS (INSERT INTO {target} ({cols}) {select}) "
        "SELECT count(*) FROM moved"
    ).format(
        staging=n.stagingId,
        token=sql.Identifier(TOKEN_COLUMN),
        cols=cols,
        seq=sql.Identifier(SEQ_COLUMN),
        target=target,
        select=select,
    )


def markerInsert(n: StagingNames) -> sql.Composed:
    return sql.SQL(
        "INSERT INTO {} (token, sink_id, batch_id, rows) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (token) DO NOTHING"
    ).format(n.markersId)


def markerExists(conn: psycopg.Connection[Any], n: StagingNames, token: str) -> bool:
    row = conn.execute(
        sql.SQL("SELECT 1 FROM {} WHERE token = %s").format(n.markersId), (token,)
    ).fetchone()
    return row is not None


def deleteToken(conn: psycopg.Connection[Any], n: StagingNames, token: str) -> int:
    """Delete one token's staged rows (idempotent); how many were there."""
    cur = conn.execute(
        sql.SQL("DELETE FROM {} WHERE {} = %s").format(n.stagingId, sql.Identifier(TOKEN_COLUMN)),
        (token,),
    )
    return cur.rowcount


def _likePrefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def stagedTokens(
    conn: psycopg.Connection[Any], n: StagingNames, sinkId: str, batchId: int | None
) -> list[tuple[str, int]]:
    """Read-only: this sink's staged tokens (all batches, or one) and their row counts, in
    token order. A missing staging table: none."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (n.stagingText,)).fetchone()
    if row is None or not row[0]:
        return []
    prefix = sinkPrefix(sinkId) if batchId is None else batchPrefix(sinkId, batchId)
    rows = conn.execute(
        sql.SQL(
            "SELECT {token}, count(*) FROM {staging} WHERE {token} LIKE %s "
            "GROUP BY {token} ORDER BY {token}"
        ).format(staging=n.stagingId, token=sql.Identifier(TOKEN_COLUMN)),
        (_likePrefix(prefix),),
    ).fetchall()
    return [(str(t), int(c)) for t, c in rows]


def pruneMarkers(conn: psycopg.Connection[Any], n: StagingNames, sinkId: str, batchId: int) -> int:
    """Delete this sink's markers of batches other than ``batchId`` and the one before it.

    Called with the newest batch (the one just decided or aborted). Batches are committed in
    order: once batch N is decided, every batch before it is marked committed in the decision
    log and never committed again, so only markers of N (and, for margin, N-1) can still be
    asked for; markers of a higher batch id belong to an earlier query that used this sink id.
    """
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (n.markersText,)).fetchone()
    if row is None or not row[0]:
        return 0
    cur = conn.execute(
        sql.SQL("DELETE FROM {} WHERE sink_id = %s AND (batch_id < %s OR batch_id > %s)").format(
            n.markersId
        ),
        (sinkId, batchId - 1, batchId),
    )
    return cur.rowcount
