"""The statements a postgres task writes its rows with: ``COPY`` (append) and the upsert.

- ``mode=append``: ``COPY <table> (<columns>) FROM STDIN (FORMAT csv)``, each record batch
  encoded by pyarrow's CSV writer and streamed as it arrives (memory stays at one batch).
- ``mode=upsert``: ``INSERT ... SELECT * FROM unnest($1::<type>[], ...) ON CONFLICT (<keys>)
  DO UPDATE``, one statement per chunk of ``upsertBatchRows`` rows, each column passed as one
  array literal (temporary tables cannot be used in a prepared transaction). Within a chunk the
  last row of a key wins (``lastPerKey``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import psycopg
import pyarrow as pa
from psycopg import sql

from twophase.settings import TwoPhaseConfigError
from twophase.sinks.postgres.encoding import arrayLiteral
from twophase.sinks.postgres.settings import PostgresSettings


def copyStatement(s: PostgresSettings, names: list[str]) -> sql.Composed:
    """``COPY <table> (<names>) FROM STDIN (FORMAT csv)``."""
    columns = sql.SQL(", ").join(sql.Identifier(n) for n in names)
    return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(s.tableIdentifier, columns)


def tableTypes(conn: psycopg.Connection[Any], s: PostgresSettings) -> dict[str, tuple[str, str]]:
    """Each column of the target: its type as declared (``character varying(5)``) and without
    the modifier (``character varying``), from the catalog."""
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), format_type(a.atttypid, NULL)"
        " FROM pg_attribute a"
        " JOIN pg_class c ON c.oid = a.attrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0"
        " AND NOT a.attisdropped",
        (s.schema, s.table),
    ).fetchall()
    return {name: (declared, base) for name, declared, base in rows}


def upsertStatement(
    s: PostgresSettings, schema: pa.Schema, types: dict[str, tuple[str, str]]
) -> sql.Composed:
    """The ``INSERT ... ON CONFLICT`` of one chunk (``types`` from ``tableTypes``).

    The arrays are cast to the column types without their modifier, so that the insert
    checks each value against the column as ``COPY`` does: a cast to ``varchar(5)`` would
    cut a longer value where the insert refuses it.
    """
    missing = [n for n in schema.names if n not in types]
    if missing:
        raise TwoPhaseConfigError(
            f"table {s.qualifiedName} has no column(s) {missing}; was it altered while the "
            "query ran?"
        )
    names = schema.names
    arrays = sql.SQL(", ").join(
        sql.SQL("%s::{}[]").format(sql.SQL(types[n][1]))
        for n in names  # type from the catalog
    )
    action = conflictAction(names, s.keyColumns)
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


class UpsertChunk(NamedTuple):
    """One upsert statement's rows: ``rows`` holds each one's position in the record batch."""

    batch: pa.RecordBatch
    rows: np.ndarray
    parameters: list[str]


def upsertChunks(s: PostgresSettings, batch: pa.RecordBatch) -> Iterator[UpsertChunk]:
    """The upsert's chunks of ``upsertBatchRows`` rows, each with its array literals."""
    step = s.upsertBatchRows
    for offset in range(0, batch.num_rows, step):
        chunk = batch.slice(offset, step)
        kept = lastPerKeyRows(chunk, s.keyColumns)
        if kept is None:
            rows = np.arange(offset, offset + chunk.num_rows, dtype=np.int64)
        else:
            chunk, rows = chunk.take(pa.array(kept)), kept + offset
        yield UpsertChunk(chunk, rows, [arrayLiteral(c) for c in chunk.columns])


def lastPerKey(batch: pa.RecordBatch, keys: tuple[str, ...]) -> pa.RecordBatch:
    """``batch`` with only the last row of each key (rows with a NULL key are all kept).

    ``INSERT ... ON CONFLICT DO UPDATE`` refuses to touch one row twice in a statement.
    """
    kept = lastPerKeyRows(batch, keys)
    return batch if kept is None else batch.take(pa.array(kept))


def lastPerKeyRows(batch: pa.RecordBatch, keys: tuple[str, ...]) -> np.ndarray | None:
    """The positions of ``lastPerKey``'s rows in ``batch``, in order; ``None`` when all."""
    if batch.num_rows < 2:
        return None
    table = pa.Table.from_batches([batch]).select(list(keys))
    valid = np.ones(batch.num_rows, dtype=bool)
    for column in table.columns:
        if column.null_count:
            valid &= column.is_valid().to_numpy(zero_copy_only=False)
    index = np.arange(batch.num_rows, dtype=np.int64)
    keyed = table.filter(pa.array(valid)).append_column("__row", pa.array(index[valid]))
    last = keyed.group_by(list(keys), use_threads=False).aggregate([("__row", "max")])
    if last.num_rows == int(valid.sum()):
        return None
    return np.sort(np.concatenate([last.column("__row_max").to_numpy(), index[~valid]]))


def conflictAction(columns: Sequence[str], keys: Sequence[str]) -> sql.Composed | sql.SQL:
    """``DO UPDATE SET`` every non-key column from ``EXCLUDED``, or ``DO NOTHING`` when the
    keys are all the columns: what an upsert does with a row whose key exists."""
    updates = [c for c in columns if c not in keys]
    if not updates:
        return sql.SQL("DO NOTHING")
    return sql.SQL("DO UPDATE SET {}").format(
        sql.SQL(", ").join(
            sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
            for c in updates
        )
    )
