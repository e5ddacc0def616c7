"""Arrow types against PostgreSQL column types: what fits exactly, what ``createTable`` makes.

- ``columnProblem``: whether a stream column can be written to a table column without loss.
- ``unsupportedProblem``: whether the sink can write a column of this type at all.
- ``sqlalchemyType``: the column type ``createTable`` uses.
- ``sparkTypeName``: the Spark SQL name of an Arrow type, for messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from sqlalchemy import types as satypes
from sqlalchemy.dialects import postgresql as pgtypes


def isBinary(t: pa.DataType) -> bool:
    """Any Arrow binary type (plain, large, fixed-size, view)."""
    return (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_binary_view(t)
    )


def isString(t: pa.DataType) -> bool:
    """Any Arrow string type (plain, large, view)."""
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def valueType(t: pa.DataType) -> pa.DataType:
    """The type of the values: dictionary-encoded columns are seen as their value type."""
    return t.value_type if pa.types.is_dictionary(t) else t


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
    if isString(t):
        return "string"
    if isBinary(t):
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
        or isString(t)
        or isBinary(t)
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
    elif isString(t):
        ok = target in _TEXT_TARGETS
    elif isBinary(t):
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
    elif isString(t):
        result = satypes.Text()
    elif isBinary(t):
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
