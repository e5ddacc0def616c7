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
from typing import Any

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


def upsertStatement(
    conn: psycopg.Connection[Any], s: PostgresSettings, schema: pa.Schema
) -> sql.Composed:
    """The ``INSERT ... ON CONFLICT`` of one chunk; array types from the table's catalog."""
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


def upsertParameters(s: PostgresSettings, batch: pa.RecordBatch) -> Iterator[list[str]]:
    """The upsert's parameters, one list of array literals per chunk of ``upsertBatchRows``."""
    step = s.upsertBatchRows
    for offset in range(0, batch.num_rows, step):
        chunk = lastPerKey(batch.slice(offset, step), s.keyColumns)
        yield [arrayLiteral(c) for c in chunk.columns]


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
