"""Spark's rows to Protobuf message bytes: the Python values a generated message takes, built
by Arrow kernels where a value per row would cost more than the message (timestamps), and why a
row that cannot be a message fails. The messages themselves: ``protobufs``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa


def messageType(kind: pa.DataType) -> pa.DataType:
    """The Arrow type whose Python values a message constructor takes for values of ``kind``:
    decimals as strings, dates as days, timestamps in microseconds."""
    t = pa.types
    if t.is_struct(kind):
        return pa.struct([f.with_type(messageType(f.type)) for f in kind])
    if t.is_list(kind) or t.is_large_list(kind):
        return pa.list_(kind.value_field.with_type(messageType(kind.value_type)))
    if t.is_map(kind):
        return pa.map_(messageType(kind.key_type), kind.item_field.with_type(
            messageType(kind.item_type)))  # fmt: skip
    if t.is_decimal(kind):
        return pa.string()
    if t.is_date32(kind):
        return pa.int32()
    if t.is_timestamp(kind):
        return pa.timestamp("us", kind.tz)
    return kind


def pythonRows(column: pa.Array) -> list[Any]:
    """The column's values as a message constructor takes them (``messageType``), a record's
    own timestamps as ``{"seconds", "nanos"}`` built by Arrow kernels: a ``datetime`` per value
    costs more than the rest of the row (nested ones stay ``datetime``)."""
    target = messageType(column.type)
    if target != column.type:
        column = column.cast(target, safe=False)
    if pa.types.is_struct(target) and any(pa.types.is_timestamp(f.type) for f in target):
        parts = column.flatten()
        fields = [
            (pa.field(f.name, _TIMESTAMP_PARTS), _timestampParts(part))
            if pa.types.is_timestamp(f.type)
            else (f, part)
            for f, part in zip(target, parts, strict=True)
        ]
        column = pa.StructArray.from_arrays(
            [a for _, a in fields], fields=[f for f, _ in fields], mask=column.is_null()
        )
    elif pa.types.is_timestamp(target):
        column = _timestampParts(column)
    rows = column.to_pylist()
    from twophase.schemaregistry.avro import hasMap, mapsAsDicts

    return mapsAsDicts(rows, column.type) if hasMap(column.type) else rows


_TIMESTAMP_PARTS = pa.struct([("seconds", pa.int64()), ("nanos", pa.int32())])


def _timestampParts(column: pa.Array) -> pa.Array:
    """Microsecond timestamps as ``google.protobuf.Timestamp``'s fields (nanos in 0..999999999,
    seconds rounded down, also before 1970)."""
    import pyarrow.compute as pc

    micros = pc.cast(column, pa.int64())
    below = pc.if_else(pc.less(micros, 0), pa.scalar(999_999, pa.int64()), pa.scalar(0, pa.int64()))
    seconds = pc.divide(pc.subtract(micros, below), pa.scalar(1_000_000, pa.int64()))
    nanos = pc.multiply(pc.subtract(micros, pc.multiply(seconds, 1_000_000)), 1_000)
    return pa.StructArray.from_arrays(
        [seconds, pc.cast(nanos, pa.int32())], fields=list(_TIMESTAMP_PARTS), mask=column.is_null()
    )


def serializer(cls: Any, kind: pa.DataType) -> Callable[[Any], bytes]:
    """One value (as ``messageType(kind)``'s Python value) to the message's bytes, maps in key
    order, so that a replay of a batch writes the same bytes."""
    if pa.types.is_struct(kind):
        return lambda row: cls(**row).SerializeToString(deterministic=True)
    return lambda value: cls(value=value).SerializeToString(deterministic=True)


def whyRefused(cls: Any, row: Any, kind: pa.DataType, exc: Exception) -> str:
    """Why ``row`` cannot be a message: the first field that fails on its own."""
    if pa.types.is_struct(kind) and isinstance(row, dict):
        for name, value in row.items():
            try:
                cls(**{name: value})
            except (TypeError, ValueError) as one:
                return f"field {name}: {type(one).__name__}: {one}"
    return f"{type(exc).__name__}: {exc}"
