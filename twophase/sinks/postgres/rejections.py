"""A row PostgreSQL rejected, told as the row's position in its task, its column and the fix.

PostgreSQL names the column (NOT NULL; a value too long, in a ``COPY``'s context), the
constraint (CHECK, unique, foreign key) and, for ``COPY``, the line of the data. A task attempt
sends its rows through one ``COPY`` (append mode, and every staged partition), so line N is the
task's row N-1, counting from 0. An upsert statement says no line: the row is found in the
statement's Arrow chunk when the server named a column (a NULL) or a type's length (a value too
long); the driver's move of staged rows says no line either: a unique key's conflicting row is
found by its ``__tp_seq``, the row's position in its task. Otherwise the message says which rows
the statement held.

What the message then says and the fix for each kind of refusal are shared with the sql sink
(``twophase.sinks.relational.rejections``); the fixes' statements are PostgreSQL's (``FIXES``).
The server's error stays chained to the sink's, without its DETAIL and CONTEXT, which quote
the row (``withoutRowData``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from twophase.sinks.postgres.staging import SEQ_COLUMN, TOKEN_COLUMN, StagingNames
from twophase.sinks.postgres.types import isString
from twophase.sinks.relational import rejections as shared
from twophase.sinks.relational.rejections import (
    DUPLICATE,
    NULL,
    SQLSTATE_KINDS,
    TOO_LONG,
    Fixes,
    Rejection,
)

_COPY_LINE = re.compile(r"\bCOPY .*?, line (\d+)(?:, column ([^:\n]+))?")
_KEY_DETAIL = re.compile(
    r"^Key \((?P<key>.*?)\)=\(.*\) (?P<rest>already exists|is not present in table "
    r"\"[^\"]*\"|is still referenced from table \"[^\"]*\")\.?$",
    re.S,
)
_LIMITED_TYPE = re.compile(r"^(?:character varying|character)\((\d+)\)$")
_QUOTED = re.compile(r'"(?:[^"]|"")*"')

FIXES = Fixes(
    allowNull="ALTER TABLE {table} ALTER COLUMN {column} DROP NOT NULL",
    widen=(
        "widen column {column} (ALTER TABLE {table} ALTER COLUMN {column} TYPE text, or a "
        "longer varchar)"
    ),
)


def rejectionOf(exc: psycopg.Error) -> Rejection:
    """The server's account of a refused row: SQLSTATE, column, constraint, key, COPY line."""
    diag = exc.diag
    state = exc.sqlstate or ""
    problem = " ".join((diag.message_primary or type(exc).__name__).split())
    if state.startswith("22"):  # data errors may quote the value itself
        problem = _QUOTED.sub("(value not shown)", problem)
    column = diag.column_name
    row = None
    found = _COPY_LINE.search(diag.context or "")
    if found is not None:
        row = int(found.group(1)) - 1  # one COPY per task attempt: line N is row N-1
        column = column or found.group(2)
    key = None
    keyed = _KEY_DETAIL.match(" ".join((diag.message_detail or "").split()))
    if keyed is not None:
        key = f"key ({keyed.group('key')}) {keyed.group('rest')}"
    return Rejection(
        code=f"SQLSTATE {state}",
        kind=SQLSTATE_KINDS.get(state, ""),
        problem=problem,
        column=column,
        constraint=diag.constraint_name,
        key=key,
        row=row,
    )


def withoutRowData(exc: psycopg.Error) -> psycopg.Error:
    """A copy of the server's error to chain: its class (so its SQLSTATE) and its message,
    without the DETAIL and CONTEXT that quote the rejected row's values."""
    return type(exc)(rejectionOf(exc).problem)


def locateInChunk(
    rejection: Rejection, chunk: pa.RecordBatch, rows: np.ndarray, types: Mapping[str, str]
) -> Rejection:
    """Place a rejection the server did not place, within the chunk one statement sent.

    ``rows`` gives each chunk row's position in its task, ``types`` the table's column types.
    A NULL refused in a named column is the chunk's first NULL there; a value too long is the
    first one longer than its column's ``varchar(n)``/``char(n)`` (trailing spaces aside, as
    PostgreSQL counts). Anything else: the positions of the chunk's rows.
    """
    if rejection.row is not None or chunk.num_rows == 0:
        return rejection
    found: tuple[int, str] | None = None
    if rejection.kind == NULL and rejection.column in chunk.schema.names:
        index = _first(chunk.column(rejection.column).is_null())
        found = None if index is None else (index, str(rejection.column))
    elif rejection.kind == TOO_LONG:
        names = [rejection.column] if rejection.column else chunk.schema.names
        for name in names:
            limited = _LIMITED_TYPE.match(types.get(str(name), ""))
            if limited is None or name not in chunk.schema.names:
                continue
            index = _firstLongerThan(chunk.column(name), int(limited.group(1)))
            if index is not None and (found is None or index < found[0]):
                found = (index, str(name))
    if found is not None:
        return replace(rejection, row=int(rows[found[0]]), column=found[1])
    return replace(rejection, rows=f"rows {int(rows.min())} to {int(rows.max())}")


def _first(mask: pa.Array) -> int | None:
    hits = np.flatnonzero(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))
    return int(hits[0]) if len(hits) else None


def _firstLongerThan(column: pa.Array, limit: int) -> int | None:
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if not isString(column.type):
        return None
    if pa.types.is_string_view(column.type):
        column = column.cast(pa.large_string())
    trimmed = pc.utf8_rtrim(column, characters=" ")
    return _first(pc.greater(pc.utf8_length(trimmed), limit))


def stagedConflict(
    conn: psycopg.Connection[Any],
    names: StagingNames,
    table: sql.Identifier,
    token: str,
    rejection: Rejection,
    keys: Sequence[str],
) -> Rejection:
    """Place a unique key's refusal of a staged row: the first of the token's rows whose key
    the target holds (another row than the one an upsert updates), or that an earlier row of
    the same task holds too (append mode; ``earlier``). Best effort: unplaced for an index on
    expressions or with a predicate, or when the lookup fails."""
    if rejection.kind != DUPLICATE or not rejection.constraint:
        return rejection
    try:
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT a.attname FROM pg_index i"
                " JOIN pg_class ic ON ic.oid = i.indexrelid"
                " CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)"
                " LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
                " WHERE i.indrelid = %s::regclass AND ic.relname = %s AND i.indisunique"
                " AND i.indpred IS NULL AND k.ord <= i.indnkeyatts ORDER BY k.ord",
                (table.as_string(conn), rejection.constraint),
            ).fetchall()
        ]
        if not columns or any(c is None for c in columns):
            return rejection
        cols = [sql.Identifier(c) for c in columns]
        keyCols = [sql.Identifier(k) for k in keys]
        seq, tok = sql.Identifier(SEQ_COLUMN), sql.Identifier(TOKEN_COLUMN)
        earlier = (
            sql.SQL("NULL::bigint")
            if keys  # upsert: the last row of a key is moved, the others are dropped
            else sql.SQL(
                "(SELECT min(o.{seq}) FROM {staging} o WHERE o.{tok} = s.{tok}"
                " AND o.{seq} < s.{seq} AND {o} = {s})"
            ).format(seq=seq, tok=tok, staging=names.stagingId, o=_of("o", cols), s=_of("s", cols))
        )
        inTarget = sql.SQL("EXISTS (SELECT 1 FROM {target} t WHERE {t} = {s}{other})").format(
            target=table,
            t=_of("t", cols),
            s=_of("s", cols),
            other=sql.SQL(" AND {} IS DISTINCT FROM {}").format(
                _of("t", keyCols), _of("s", keyCols)
            )
            if keys  # upsert: the target's row of the same key is updated, not a conflict
            else sql.SQL(""),
        )
        found = conn.execute(
            sql.SQL(
                "SELECT seq, earlier FROM (SELECT s.{seq} AS seq, {earlier} AS earlier, "
                "{inTarget} AS held FROM {staging} s WHERE s.{tok} = %s) r "
                "WHERE held OR earlier IS NOT NULL ORDER BY seq LIMIT 1"
            ).format(seq=seq, earlier=earlier, inTarget=inTarget, staging=names.stagingId, tok=tok),
            (token,),
        ).fetchone()
    except psycopg.Error:
        return rejection
    if found is None:
        return rejection
    return replace(
        rejection, row=int(found[0]), earlier=None if found[1] is None else int(found[1])
    )


def _of(alias: str, columns: Sequence[sql.Identifier]) -> sql.Composed:
    """``(alias.a, alias.b)``: a row of the columns, to compare keys."""
    return sql.SQL("({})").format(
        sql.SQL(", ").join(sql.SQL("{}.{}").format(sql.Identifier(alias), c) for c in columns)
    )


def fixFor(rejection: Rejection, table: str, *, staged: bool = False) -> str:
    """What to change, in Spark or in the table, for this kind of rejection; ``staged``: of
    rows the driver moves after the decision, which stay as they are and are moved again."""
    if staged:
        return _stagedFix(rejection, table)
    return shared.fixFor(rejection, table, FIXES)


def _stagedFix(rejection: Rejection, table: str) -> str:
    constraint = rejection.constraint or "the constraint"
    later = (
        "; for later batches, deduplicate upstream (df.dropDuplicates on the key's columns) "
        "or write with commitMode=prepared, which checks keys before the decision"
    )
    if rejection.kind == DUPLICATE and rejection.earlier is not None:
        return (
            f"the decided rows hold this key twice, so no move can succeed while {constraint} "
            f"holds: drop it (ALTER TABLE {table} DROP CONSTRAINT {constraint}) and restart the "
            "query, which moves the rows; remove the duplicate and add the constraint again" + later
        )
    if rejection.kind == DUPLICATE:
        return (
            f"delete or change the rows of {table} that already hold the key (or drop "
            f"{constraint}), then restart the query: recovery moves the staged rows" + later
        )
    return (
        f"change {table} (or {constraint}) so that the staged rows fit, then restart the "
        "query: recovery moves them; check the rows upstream for later batches"
    )


def describe(rejection: Rejection, partitionId: int) -> str:
    """``row 3 of partition 1 (counting from 0), column payload: <problem> (SQLSTATE ...)``."""
    return shared.describe(rejection, partitionId, "PostgreSQL")
