"""Avro binary for a whole Arrow column of flat records at once, byte for byte what fastavro
writes record by record, without a Python object per field.

Flat means a record (or a single value) whose fields are booleans, integers, floats, doubles,
strings, bytes, dates or timestamps, each nullable or not, with the schema ``avro.schemaOf``
derives (a nullable field is the union ``["null", T]``). Each field becomes one binary array
(varints by numpy, text and bytes by Arrow kernels) and the fields are joined row by row.
Anything else (nested records, arrays, maps, decimals, a schema given in another shape) goes
through fastavro.
"""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from twophase.schemaregistry import avro

_EMPTY = b""
_NULL_BRANCH = b"\x00"
_VALUE_BRANCH = b"\x02"  # union branch 1, zigzag-encoded


@functools.cache
def _binary(octets: bytes) -> pa.Scalar:
    """``octets`` as an Arrow binary scalar, made at first use: building one at import makes
    pyarrow import pandas, which every Spark Python worker that imports a sink would pay."""
    return pa.scalar(octets, pa.binary())


def supports(kind: pa.DataType, schema: object) -> bool:
    """Whether ``encode`` writes ``kind`` with ``schema`` (the parsed JSON of the schema)."""
    if not _flat(kind, top=True):
        return False
    return avro.schemaText(schema) == avro.schemaText(_derived(kind, schema))  # type: ignore[arg-type]


def _derived(kind: pa.DataType, schema: object) -> object:
    if isinstance(schema, dict) and schema.get("type") == "record":
        name = schema.get("name", avro.DEFAULT_RECORD_NAME)
        namespace = schema.get("namespace")
        return avro.schemaOf(kind, f"{namespace}.{name}" if namespace else name)
    return avro.schemaOf(kind)


def _flat(kind: pa.DataType, top: bool = False) -> bool:
    t = pa.types
    if top and t.is_struct(kind):
        return all(_flat(f.type) for f in kind)
    return (
        t.is_boolean(kind)
        or t.is_integer(kind)
        or t.is_floating(kind)
        or t.is_string(kind)
        or t.is_large_string(kind)
        or t.is_binary(kind)
        or t.is_large_binary(kind)
        or t.is_date32(kind)
        or t.is_timestamp(kind)
    )


def encode(column: pa.Array, header: bytes) -> pa.Array | None:
    """Every non-null value of ``column`` as ``header`` + its Avro binary; nulls stay null.
    ``None`` when a field the schema does not let be null has a null (fastavro then says
    which rows cannot be written)."""
    if pa.types.is_struct(column.type):
        fields = [pc.struct_field(column, [i]) for i in range(column.type.num_fields)]
        for f, values in zip(column.type, fields, strict=True):
            if not f.nullable and values.null_count > column.null_count:
                return None
        parts = [_field(values, f.nullable) for f, values in zip(column.type, fields, strict=True)]
    else:
        parts = [_value(column.fill_null(_zero(column.type)) if column.null_count else column)]
    joined = pc.binary_join_element_wise(pa.scalar(header, pa.binary()), *parts, _binary(_EMPTY))
    if column.null_count:
        joined = pc.if_else(column.is_valid(), joined, pa.scalar(None, pa.binary()))
    return joined


def _field(values: pa.Array, nullable: bool) -> pa.Array:
    filled = values.fill_null(_zero(values.type)) if values.null_count else values
    if not nullable:  # its nulls are rows whose record is null: masked by the caller
        return _value(filled)
    present = values.is_valid()
    encoded = pc.binary_join_element_wise(_binary(_VALUE_BRANCH), _value(filled), _binary(_EMPTY))
    return pc.if_else(present, encoded, _binary(_NULL_BRANCH)) if values.null_count else encoded


def _zero(kind: pa.DataType) -> pa.Scalar:
    t = pa.types
    if t.is_string(kind) or t.is_large_string(kind):
        return pa.scalar("", kind)
    if t.is_binary(kind) or t.is_large_binary(kind):
        return pa.scalar(b"", kind)
    if t.is_boolean(kind):
        return pa.scalar(False)
    return pa.array([0], pa.int32() if t.is_date32(kind) else pa.int64()).cast(kind)[0]


def _value(values: pa.Array) -> pa.Array:
    """Non-null values as their Avro binary, one binary value per row."""
    t, kind = pa.types, values.type
    if t.is_boolean(kind):
        raw = values.cast(pa.uint8()).to_numpy(zero_copy_only=False)
        return _fixed(raw.astype(np.uint8), 1)
    if t.is_integer(kind):
        return _varints(values.cast(pa.int64()).to_numpy(zero_copy_only=False))
    if t.is_date32(kind):
        return _varints(values.cast(pa.int32()).cast(pa.int64()).to_numpy(zero_copy_only=False))
    if t.is_timestamp(kind):
        micros = values.cast(pa.timestamp("us", kind.tz)).cast(pa.int64())
        return _varints(micros.to_numpy(zero_copy_only=False))
    if t.is_float32(kind):
        return _fixed(values.to_numpy(zero_copy_only=False).astype("<f4").view(np.uint8), 4)
    if t.is_floating(kind):
        return _fixed(
            values.cast(pa.float64()).to_numpy(zero_copy_only=False).astype("<f8").view(np.uint8), 8
        )
    data = values.cast(pa.large_binary())
    lengths = pc.binary_length(data).to_numpy(zero_copy_only=False).astype(np.int64)
    return pc.binary_join_element_wise(_varints(lengths), data.cast(pa.binary()), _binary(_EMPTY))


def _fixed(octets: np.ndarray, width: int) -> pa.Array:
    """``width`` bytes per row, from a flat uint8 array."""
    rows = len(octets) // width
    offsets = np.arange(0, (rows + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(octets.tobytes())]
    )


def _varints(numbers: np.ndarray) -> pa.Array:
    """Avro's zigzag varint of each int64, one binary value per row."""
    n = numbers.astype(np.int64)
    z = ((n << 1) ^ (n >> 63)).astype(np.uint64)
    rows = len(z)
    width = np.ones(rows, dtype=np.int32)
    for k in range(1, 10):
        width += (z >> np.uint64(7 * k)) > 0
    shifts = (np.arange(10, dtype=np.uint64) * np.uint64(7))[None, :]
    groups = ((z[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    position = np.arange(10, dtype=np.int32)[None, :]
    groups |= np.where(position < (width[:, None] - 1), np.uint8(0x80), np.uint8(0))
    octets = groups[position < width[:, None]]
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(width, out=offsets[1:])
    return pa.Array.from_buffers(
        pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(octets.tobytes())]
    )
