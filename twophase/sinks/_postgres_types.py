"""Arrow columns as PostgreSQL sees them: COPY text, array literals, column types, DDL types.

Vectorised end to end (pyarrow compute, numpy): no Python code runs per row. Used by the
postgres participant for

- ``csvChunk``: a record batch as PostgreSQL ``COPY ... (FORMAT csv)`` input. pyarrow's CSV
  writer quotes every string (so ``""`` is an empty string and an unquoted empty field is
  NULL, as PostgreSQL's CSV mode reads them) and writes numbers, booleans, dates and
  timestamps in forms PostgreSQL's input functions accept (``nan``, ``inf``, ISO dates;
  instants as UTC wall-clock time, read by a session whose time zone is UTC). Binary
  columns become bytea hex text (``\\x0a1b``).
- ``arrayLiteral``: a column as one PostgreSQL array literal (``{"a","b",NULL}``), the
  parameter of ``unnest($1::<type>[], ...)`` in upsert mode.
- ``columnProblem``: whether a stream column can be written to a table column without loss.
- ``sqlalchemyType``: the column type ``createTable`` uses.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from sqlalchemy import types as satypes
from sqlalchemy.dialects import postgresql as pgtypes

_CSV_OPTIONS = pacsv.WriteOptions(include_header=False, quoting_style="needed")


def _isBinary(t: pa.DataType) -> bool:
    return (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_binary_view(t)
    )


def _isString(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def valueType(t: pa.DataType) -> pa.DataType:
    """The type of the values: dictionary-encoded columns are seen as their value type."""
    return t.value_type if pa.types.is_dictionary(t) else t


def byteaHex(column: pa.Array) -> pa.Array:
    """Binary values as bytea hex text (``\\x`` + two hex digits a byte); nulls stay null."""
    arr = column.cast(pa.large_binary())
    n = len(arr)
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    start, end = int(offsets[0]), int(offsets[-1])
    data = buffers[2]
    raw = data.to_pybytes()[start:end] if data is not None and end > start else b""
    hexed = np.frombuffer(binascii.hexlify(raw), dtype=np.uint8)
    newOffsets = 2 * (offsets - start) + 2 * np.arange(n + 1, dtype=np.int64)
    out = np.empty(int(newOffsets[-1]), dtype=np.uint8)
    prefix = newOffsets[:-1]
    isHex = np.ones(len(out), dtype=bool)
    isHex[prefix] = False
    isHex[prefix + 1] = False
    out[prefix] = ord("\\")
    out[prefix + 1] = ord("x")
    out[isHex] = hexed
    text = pa.LargeStringArray.from_buffers(n, pa.py_buffer(newOffsets), pa.py_buffer(out))
    if arr.null_count:
        text = pc.if_else(arr.is_valid(), text, pa.scalar(None, pa.large_string()))
    return text


def _copyReady(column: pa.Array) -> pa.Array:
    """The column in a form pyarrow's CSV writer encodes as PostgreSQL expects."""
    t = column.type
    if pa.types.is_dictionary(t):
        column = column.cast(t.value_type)
        t = column.type
    if _isBinary(t):
        return byteaHex(column)
    if pa.types.is_string_view(t):
        return column.cast(pa.large_string())
    return utcWallClock(column)


def utcWallClock(column: pa.Array) -> pa.Array:
    """Instants (tz-aware timestamps) as their UTC wall-clock time, other columns unchanged.

    Arrow stores instants in UTC, so dropping the zone keeps the values; the text is then
    read in the session time zone, which the participant sets to UTC. pyarrow formats
    zone-less timestamps about twenty times faster than zoned ones.
    """
    t = column.type
    if pa.types.is_timestamp(t) and t.tz:
        return column.cast(pa.timestamp(t.unit))
    return column


def csvChunk(batch: pa.RecordBatch) -> pa.Buffer:
    """``batch`` as the body of ``COPY <table> (<its columns>) FROM STDIN (FORMAT csv)``."""
    columns = [_copyReady(c) for c in batch.columns]
    ready = pa.RecordBatch.from_arrays(columns, names=batch.schema.names)
    out = pa.BufferOutputStream()
    pacsv.write_csv(ready, out, _CSV_OPTIONS)
    return out.getvalue()


def _asText(column: pa.Array) -> pa.Array:
    t = valueType(column.type)
    if pa.types.is_dictionary(column.type):
        column = column.cast(t)
    if _isBinary(t):
        return byteaHex(column)
    if _isString(t):
        return column.cast(pa.large_string())
    return utcWallClock(column).cast(pa.large_string())


def arrayLiteral(column: pa.Array) -> str:
    """The column as a PostgreSQL array literal: every value quoted and escaped, NULL unquoted.

    ``CAST(<literal> AS <type>[])`` parses each element with the type's input function, so
    the same text forms as in ``csvChunk`` apply.
    """
    text = _asText(column)
    escaped = pc.replace_substring(text, "\\", "\\\\")
    escaped = pc.replace_substring(escaped, '"', '\\"')
    quote, empty = pa.scalar('"', pa.large_string()), pa.scalar("", pa.large_string())
    quoted = pc.binary_join_element_wise(quote, escaped, quote, empty)
    elements = pc.fill_null(quoted, pa.scalar("NULL", pa.large_string()))
    one = pa.LargeListArray.from_arrays(pa.array([0, len(elements)], pa.int64()), elements)
    joined = pc.binary_join(one, pa.scalar(",", pa.large_string()))[0].as_py()
    return "{" + (joined or "") + "}"


# -- compatibility with existing columns ----------------------------------------------------


@dataclass(frozen=True)
class ColumnInfo:
    """One column of the target table, from ``information_schema.columns``."""

    name: str
    dataType: str
    """``data_type``: ``bigint``, ``text``, ``timestamp with time zone``, ``USER-DEFINED``..."""
    udtName: str
    nullable: bool
    hasDefault: bool
    generated: bool
    numericPrecision: int | None = None
    numericScale: int | None = None

    @property
    def displayType(self) -> str:
        if self.dataType == "numeric" and self.numericPrecision is not None:
            return f"numeric({self.numericPrecision},{self.numericScale or 0})"
        if self.dataType in ("USER-DEFINED", "ARRAY"):
            return self.udtName
        return self.dataType


_TEXT_TARGETS = frozenset(
    {
        "text",
        "character varying",
        "character",
        "json",
        "jsonb",
        "uuid",
        "xml",
        "inet",
        "cidr",
        "macaddr",
        "name",
        "USER-DEFINED",
    }
)
_INT_TARGETS = {
    8: frozenset({"smallint", "integer", "bigint", "numeric", "real", "double precision"}),
    16: frozenset({"smallint", "integer", "bigint", "numeric", "real", "double precision"}),
    32: frozenset({"integer", "bigint", "numeric", "double precision"}),
    64: frozenset({"bigint", "numeric"}),
}


def sparkTypeName(t: pa.DataType) -> str:
    """The Spark SQL name of an Arrow type as PySpark produces it, for messages."""
    t = valueType(t)
    if pa.types.is_integer(t):
        return {8: "tinyint", 16: "smallint", 32: "int", 64: "bigint"}[t.bit_width]
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if _isString(t):
        return "string"
    if _isBinary(t):
        return "binary"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    return str(t)


def _unsupported(t: pa.DataType) -> bool:
    return not (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_decimal(t)
        or _isString(t)
        or _isBinary(t)
        or pa.types.is_boolean(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_time(t)
    )


def unsupportedProblem(name: str, t: pa.DataType) -> str | None:
    """Why the postgres sink cannot write a column of this type at all, or ``None``."""
    t = valueType(t)
    if pa.types.is_unsigned_integer(t) or pa.types.is_float16(t) or _unsupported(t):
        return (
            f"column {name!r} has type {sparkTypeName(t)}, which the postgres sink cannot "
            "write; cast it in Spark to a primitive type (e.g. to_json(col) for arrays, maps "
            "and structs, or a string)"
        )
    return None


def columnProblem(name: str, t: pa.DataType, column: ColumnInfo) -> str | None:
    """Why stream column ``name`` of Arrow type ``t`` cannot go into ``column``, or ``None``.

    Accepted: the same type or a wider one that holds every value exactly (int -> bigint,
    float -> double precision, decimal(p,s) -> numeric with room), strings into text-like
    types (varchar, json, uuid, enums...), binary into bytea, timestamp into
    ``timestamp with time zone`` and timestamp_ntz into ``timestamp without time zone``.
    """
    t = valueType(t)
    unsupported = unsupportedProblem(name, t)
    if unsupported:
        return unsupported
    target = column.dataType
    if column.generated:
        return (
            f"column {name!r} is a generated column of the table; PostgreSQL computes it, so "
            "drop it from the DataFrame"
        )
    ok: bool
    if pa.types.is_integer(t):
        ok = target in _INT_TARGETS[t.bit_width]
        if target == "numeric" and column.numericPrecision is not None:
            digits = {8: 3, 16: 5, 32: 10, 64: 19}[t.bit_width]
            ok = column.numericPrecision - (column.numericScale or 0) >= digits
    elif pa.types.is_float32(t):
        ok = target in ("real", "double precision")
    elif pa.types.is_float64(t):
        ok = target == "double precision"
    elif pa.types.is_decimal(t):
        ok = target == "numeric"
        if ok and column.numericPrecision is not None:
            scale = column.numericScale or 0
            ok = scale >= t.scale and column.numericPrecision - scale >= t.precision - t.scale
    elif _isString(t):
        ok = target in _TEXT_TARGETS
    elif _isBinary(t):
        ok = target == "bytea"
    elif pa.types.is_boolean(t):
        ok = target == "boolean"
    elif pa.types.is_date(t):
        ok = target == "date"
    elif pa.types.is_timestamp(t):
        ok = target == ("timestamp with time zone" if t.tz else "timestamp without time zone")
        if not ok and target.startswith("timestamp"):
            return (
                f"column {name!r} is a Spark {sparkTypeName(t)} but the table column is "
                f"{target}: Spark's timestamp is an instant (timestamp with time zone) and "
                "timestamp_ntz a wall-clock time (timestamp without time zone); alter the "
                "column, or cast in Spark (to_utc_timestamp/convert_timezone, or "
                "cast(col as timestamp_ntz))"
            )
    else:  # time
        ok = target == "time without time zone"
    if ok:
        return None
    return (
        f"column {name!r} is a Spark {sparkTypeName(t)} but the table column is "
        f"{column.displayType}, which cannot hold every value exactly; alter the column "
        f"(e.g. to {_suggestion(t)}) or cast the column in Spark to match"
    )


def _suggestion(t: pa.DataType) -> str:
    sa = sqlalchemyType(t)
    return str(sa.compile(dialect=pgtypes.dialect()))


def sqlalchemyType(t: pa.DataType) -> satypes.TypeEngine[Any]:
    """The PostgreSQL column type (as SQLAlchemy's) that ``createTable`` uses for ``t``."""
    t = valueType(t)
    result: satypes.TypeEngine[Any]
    if pa.types.is_integer(t):
        result = {
            8: satypes.SmallInteger(),
            16: satypes.SmallInteger(),
            32: satypes.Integer(),
            64: satypes.BigInteger(),
        }[t.bit_width]
    elif pa.types.is_float32(t):
        result = pgtypes.REAL()
    elif pa.types.is_float64(t):
        result = pgtypes.DOUBLE_PRECISION()
    elif pa.types.is_decimal(t):
        result = satypes.Numeric(precision=t.precision, scale=t.scale)
    elif _isString(t):
        result = satypes.Text()
    elif _isBinary(t):
        result = pgtypes.BYTEA()
    elif pa.types.is_boolean(t):
        result = satypes.Boolean()
    elif pa.types.is_date(t):
        result = satypes.Date()
    elif pa.types.is_timestamp(t):
        result = pgtypes.TIMESTAMP(timezone=bool(t.tz))
    elif pa.types.is_time(t):
        result = pgtypes.TIME(timezone=False)
    else:
        raise ValueError(f"no PostgreSQL type for Arrow type {t}")
    return result
