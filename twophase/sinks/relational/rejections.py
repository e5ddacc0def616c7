"""A row the database refused, told alike by both relational sinks: where, what and the fix.

Each sink's ``rejections`` reads its server's error into a ``Rejection`` (PostgreSQL's SQLSTATE
and diagnostics, MySQL/MariaDB's error number and text) and places the row in its task; this
module holds what both then say: the message's account of the row (``describe``), the fix for
each kind of refusal (``fixFor``, with the statements that differ per database in ``Fixes``),
and the row as JSON for a dead-letter table (``recordJson``). No message shows a value of the
row (it may be large or sensitive): the column, key, constraint and a length say enough.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

NULL = "null"
TOO_LONG = "tooLong"
DUPLICATE = "duplicate"
CHECK = "check"
FOREIGN_KEY = "foreignKey"
OUT_OF_RANGE = "outOfRange"

SQLSTATE_KINDS = {
    "23502": NULL,
    "22001": TOO_LONG,
    "23505": DUPLICATE,
    "23514": CHECK,
    "23503": FOREIGN_KEY,
    "22003": OUT_OF_RANGE,
}
"""The kind of refusal each SQLSTATE names (PostgreSQL, and any server that reports one)."""


@dataclass(frozen=True)
class Rejection:
    """What is known of one refused row; ``row`` counts from 0 within what its task wrote."""

    code: str
    """The server's code as messages show it: ``SQLSTATE 23505``, ``error 1062``."""
    kind: str
    """What the refusal is (``NULL``, ``TOO_LONG``, ...); ``""`` for any other."""
    problem: str
    column: str | None = None
    constraint: str | None = None
    key: str | None = None
    """The key as messages show it: ``key (id) already exists``, ``key PRIMARY``."""
    row: int | None = None
    rows: str = ""
    """When ``row`` is unknown: which of the task's rows the failed statement held."""
    earlier: int | None = None
    """A staged row's key held by an earlier row of its task too: that row's position."""
    length: str = ""
    """A value too long: its length and the column's type, as far as known."""


@dataclass(frozen=True)
class Fixes:
    """The fixes whose statements differ per database, as ``str.format`` templates of
    ``table`` and ``column`` (the column's name, or ``<column>``)."""

    allowNull: str
    """Let the column take NULL: ``ALTER TABLE {table} ALTER COLUMN {column} DROP NOT NULL``."""
    widen: str
    """Widen the column, from ``widen`` on: ``widen column {column} (ALTER TABLE ...)``."""


def describe(rejection: Rejection, partitionId: int, server: str) -> str:
    """``row 3 of partition 1 (counting from 0), column v: <problem> (<code>; ...)``;
    ``server`` names the database where it does not say which row (``PostgreSQL``)."""
    if rejection.row is not None:
        where = f"row {rejection.row} of partition {partitionId} (counting from 0)"
    else:
        held = f": one of its {rejection.rows}" if rejection.rows else ""
        where = f"a row of partition {partitionId} ({server} does not say which{held})"
    facts = [rejection.code]
    if rejection.constraint:
        facts.append(f"constraint {rejection.constraint}")
    if rejection.key:
        facts.append(rejection.key)
    if rejection.earlier is not None:
        facts.append(f"row {rejection.earlier} of the partition holds the same key")
    if rejection.length:
        facts.append(rejection.length)
    column = f", column {rejection.column}" if rejection.column else ""
    return f"{where}{column}: {rejection.problem} ({'; '.join(facts)})"


def fixFor(rejection: Rejection, table: str, fixes: Fixes) -> str:
    """What to change, in Spark or in the table, for this kind of rejection."""
    name = rejection.column
    column = name or "<column>"
    if rejection.kind == NULL:
        what = f"column {name}" if name else "the column"
        return (
            f"filter or fill the NULLs of {what} upstream (df.na.drop(subset=['{column}']) or "
            f"df.na.fill), or let the column take NULL "
            f"({fixes.allowNull.format(table=table, column=column)})"
        )
    if rejection.kind == TOO_LONG:
        return (
            f"{fixes.widen.format(table=table, column=column)} or truncate the value upstream "
            "(substring in Spark)"
        )
    if rejection.kind == DUPLICATE:
        return (
            "deduplicate the key upstream (df.dropDuplicates on the key's columns), remove or "
            "change the table's rows that hold it, or write with mode=upsert and keyColumns set "
            "to the key to update them"
        )
    if rejection.kind == CHECK:
        return (
            f"filter the rows that break constraint {rejection.constraint} upstream, or change "
            "the constraint"
        )
    if rejection.kind == FOREIGN_KEY:
        return (
            f"write the rows constraint {rejection.constraint} refers to first, or filter the "
            "rows that refer to none upstream"
        )
    if rejection.kind == OUT_OF_RANGE:
        return f"widen the type of {name or 'the column'}, or filter the values upstream"
    return "fix the value upstream (filter or cast it in Spark) or the table's definition"


def recordJson(batch: pa.RecordBatch, index: int) -> str:
    """Row ``index`` of ``batch`` as JSON for a dead-letter table: bytes as hex, values JSON
    lacks as text."""
    row = batch.slice(index, 1).to_pylist()[0]
    return json.dumps(row, default=lambda v: v.hex() if isinstance(v, bytes) else str(v))


__all__ = [
    "CHECK",
    "DUPLICATE",
    "FOREIGN_KEY",
    "NULL",
    "OUT_OF_RANGE",
    "SQLSTATE_KINDS",
    "TOO_LONG",
    "Fixes",
    "Rejection",
    "describe",
    "fixFor",
    "recordJson",
]
