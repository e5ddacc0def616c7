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

What the message then says and the fix for each kind of refusal are shared with the postgres
sink (``twophase.sinks.relational.rejections``); the fixes' statements are MySQL's (``FIXES``).
No message shows a value of the row, only its length; the server's error stays chained without
the quoted value (``withoutRowData``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from twophase.sinks.relational import rejections as shared
from twophase.sinks.relational.rejections import (
    CHECK,
    DUPLICATE,
    FOREIGN_KEY,
    NULL,
    OUT_OF_RANGE,
    SQLSTATE_KINDS,
    TOO_LONG,
    Fixes,
    Rejection,
)
from twophase.sinks.sql.dialect import errorMessage, mysqlCode, pgState

REJECTED_CODES = frozenset({1048, 1062, 1216, 1264, 1265, 1292, 1366, 1406, 1452, 4025})
"""MySQL/MariaDB errors that refuse one row: NULL, duplicate key, foreign key, out of range,
truncated, bad value, too long, CHECK constraint."""

_AT_ROW = re.compile(r" at row (\d+)")
_COLUMN = re.compile(r"column (?:'([^']+)'|`(?:[^`]*`\.`)*([^`]+)`)", re.IGNORECASE)
_KEY = re.compile(r"for key '([^']+)'")
_CONSTRAINT = re.compile(r"CONSTRAINT `([^`]+)`")
_QUOTED_VALUE = re.compile(r"(entry|value:?) '(?:[^'\\]|\\.|'')*'")


MYSQL_KINDS = {
    1048: NULL,
    1406: TOO_LONG,
    1062: DUPLICATE,
    4025: CHECK,
    1452: FOREIGN_KEY,
    1216: FOREIGN_KEY,
    1264: OUT_OF_RANGE,
}
"""The kind of refusal each MySQL/MariaDB error number names."""

FIXES = Fixes(
    allowNull="ALTER TABLE {table} MODIFY {column} <its type> NULL",
    widen="widen {column} (ALTER TABLE {table} MODIFY {column} with a longer type)",
)


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
        state = pgState(exc) or ""
        return Rejection(
            code=f"SQLSTATE {state}",
            kind=SQLSTATE_KINDS.get(state, ""),
            problem=problem.split("\n")[0],
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
        code=f"error {code}",
        kind=MYSQL_KINDS.get(code, ""),
        problem=_QUOTED_VALUE.sub(r"\1", _AT_ROW.sub("", text)),
        column=(column.group(1) or column.group(2)) if column else None,
        key=f"key {key.group(1)}" if key else None,
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
    return shared.fixFor(rejection, table, FIXES)


def describe(rejection: Rejection, partitionId: int) -> str:
    """``row 3 of partition 1 (counting from 0), column v: <problem> (error 1406; ...)``."""
    return shared.describe(rejection, partitionId, "the server")
