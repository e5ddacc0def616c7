"""A row the database rejected, told as its position in its task, its column and the fix.

MySQL/MariaDB name the column (a value too long, a NULL, an out-of-range number), the key
(a duplicate) or the constraint (CHECK, foreign key), and for some errors the row within the
multi-row ``INSERT`` (``at row N``, counting from 1). When the server says no row, the failed
statement's rows are sent again in halves inside the same XA transaction, which a failed
statement leaves open (InnoDB undoes the statement only): the first half that fails holds the
row, a half that succeeds stays inserted and the search goes on in the other; about
log2(batchsize) statements, then the whole transaction is rolled back with the task.
PostgreSQL (``postgresql+psycopg``) aborts the transaction at the first error, so there the
message names the rows the statement held.

No message shows a value of the row (it may be large or sensitive), only its length; the
server's error stays chained without the quoted value (``withoutRowData``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from twophase.sinks.sql.dialect import errorMessage, mysqlCode, pgState

REJECTED_CODES = frozenset({1048, 1062, 1216, 1264, 1265, 1292, 1366, 1406, 1452, 4025})
"""MySQL/MariaDB errors that refuse one row: NULL, duplicate key, foreign key, out of range,
truncated, bad value, too long, CHECK constraint."""

_AT_ROW = re.compile(r" at row (\d+)")
_COLUMN = re.compile(r"column (?:'([^']+)'|`(?:[^`]*`\.`)*([^`]+)`)", re.IGNORECASE)
_KEY = re.compile(r"for key '([^']+)'")
_CONSTRAINT = re.compile(r"CONSTRAINT `([^`]+)`")
_QUOTED_VALUE = re.compile(r"(entry|value:?) '(?:[^'\\]|\\.|'')*'")


@dataclass(frozen=True)
class Rejection:
    """What is known of one refused row; ``row`` counts from 0 within what its task wrote."""

    code: str
    problem: str
    column: str | None = None
    key: str | None = None
    constraint: str | None = None
    row: int | None = None
    rows: str = ""
    """When ``row`` is unknown: which of the task's rows the failed statement held."""
    length: str = ""
    """A value too long: its length and the column's type."""


def isRejection(exc: BaseException) -> bool:
    """A database error that refuses a row (not the connection, not the transaction)."""
    state = pgState(exc)
    if state is not None:
        return state.startswith(("22", "23"))
    return mysqlCode(exc) in REJECTED_CODES


def rejectionOf(exc: BaseException, first: int) -> Rejection:
    """The server's account of a refused row of a statement whose first row is the task's row
    ``first``: the error, column, key or constraint, and the row when the server says it."""
    code = mysqlCode(exc)
    if code is None:
        orig = getattr(exc, "orig", exc)
        diag = getattr(orig, "diag", None)
        problem = str(getattr(diag, "message_primary", "") or errorMessage(exc))
        return Rejection(
            f"SQLSTATE {pgState(exc)}",
            problem.split("\n")[0],
            column=getattr(diag, "column_name", None),
            constraint=getattr(diag, "constraint_name", None),
        )
    text = _serverText(exc)
    row = None
    at = _AT_ROW.search(text)
    if at is not None:
        row = first + int(at.group(1)) - 1
    column = _COLUMN.search(text)
    key = _KEY.search(text)
    constraint = _CONSTRAINT.search(text)
    return Rejection(
        f"error {code}",
        _QUOTED_VALUE.sub(r"\1", _AT_ROW.sub("", text)),
        column=(column.group(1) or column.group(2)) if column else None,
        key=key.group(1) if key else None,
        constraint=constraint.group(1) if constraint else None,
        row=row,
    )


def _serverText(exc: BaseException) -> str:
    orig = getattr(exc, "orig", exc)
    args: tuple[object, ...] = tuple(getattr(orig, "args", ()))
    return str(args[1]) if len(args) >= 2 else str(orig)


def withoutRowData(exc: BaseException) -> BaseException:
    """The driver's error to chain: its class and code, without a quoted value of the row."""
    orig = getattr(exc, "orig", exc)
    code = mysqlCode(exc)
    if code is None:
        try:
            return type(orig)(str(getattr(getattr(orig, "diag", None), "message_primary", "")))
        except Exception:
            return RuntimeError(errorMessage(exc))
    return type(orig)(code, _QUOTED_VALUE.sub(r"\1", _serverText(exc)))


def locate(send: Callable[[int, int], None], count: int, code: int) -> int | None:
    """The index, in a failed statement of ``count`` rows, of the first row whose insert fails
    with MySQL error ``code``, found by ``send(start, stop)`` of halves (rows before it stay
    inserted); ``None`` when a part fails otherwise or none fails."""
    low, high = 0, count
    while high - low > 1:
        middle = (low + high) // 2
        try:
            send(low, middle)
        except Exception as exc:
            if mysqlCode(exc) != code:
                return None
            high = middle
            continue
        low = middle
    try:
        send(low, low + 1)
    except Exception as exc:
        return low if mysqlCode(exc) == code else None
    return None


def fixFor(rejection: Rejection, table: str) -> str:
    """What to change, in Spark or in the table, for this kind of rejection."""
    code = rejection.code
    column = rejection.column or "the column"
    if code in ("error 1406", "SQLSTATE 22001"):
        return (
            f"widen {column} (ALTER TABLE {table} MODIFY {column} with a longer type) or "
            "truncate the value upstream (substring in Spark)"
        )
    if code in ("error 1048", "SQLSTATE 23502"):
        return (
            f"filter or fill the NULLs of {column} upstream (df.na.drop(subset=['{column}']) "
            f"or df.na.fill), or let {column} take NULL"
        )
    if code in ("error 1062", "SQLSTATE 23505"):
        return (
            "deduplicate the key upstream (df.dropDuplicates on the key's columns), remove or "
            "change the table's rows that hold it, or write with mode=upsert and keyColumns "
            "set to the key to update them"
        )
    if code in ("error 4025", "SQLSTATE 23514"):
        return (
            f"filter the rows that break constraint {rejection.constraint} upstream, or change "
            "the constraint"
        )
    if code in ("error 1452", "error 1216", "SQLSTATE 23503"):
        return (
            f"write the rows constraint {rejection.constraint} refers to first, or filter the "
            "rows that refer to none upstream"
        )
    if code in ("error 1264", "SQLSTATE 22003"):
        return f"widen the type of {column}, or filter the values upstream"
    return "fix the value upstream (filter or cast it in Spark) or the table's definition"


def describe(rejection: Rejection, partitionId: int) -> str:
    """``row 3 of partition 1 (counting from 0), column v: <problem> (error 1406; ...)``."""
    if rejection.row is not None:
        where = f"row {rejection.row} of partition {partitionId} (counting from 0)"
    else:
        held = f": one of its {rejection.rows}" if rejection.rows else ""
        where = f"a row of partition {partitionId} (the server does not say which{held})"
    facts = [rejection.code]
    if rejection.key:
        facts.append(f"key {rejection.key}")
    if rejection.constraint:
        facts.append(f"constraint {rejection.constraint}")
    if rejection.length:
        facts.append(rejection.length)
    column = f", column {rejection.column}" if rejection.column else ""
    return f"{where}{column}: {rejection.problem} ({'; '.join(facts)})"
