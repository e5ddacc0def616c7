"""Each row of an Arrow batch as one byte string that only that row's values give, for the
record fingerprint of the files sink's S3 path.

A row's bytes are its fields in column order, separated by ``0x1f``: a string or binary field
as ``<length>:<bytes>`` (so a separator inside a value cannot be mistaken for one between
fields), a number, boolean, date, time, timestamp or decimal as Arrow's text of it, a nested
or other field as its JSON (length-prefixed too), and a null field as ``~`` (which no other
field's bytes are). Arrow compute kernels build the whole column at once; only the fingerprint's
checksums run per row.
"""

from __future__ import annotations

import functools

import pyarrow as pa
import pyarrow.compute as pc

from twophase.sinks.files.jsonlines import encodeBatch

SCHEME = "rows1"
"""The fingerprint scheme of rows encoded here (``Fingerprint.scheme``)."""

_BYTES = pa.large_binary()
_SEPARATOR = b"\x1f"
_COLON = b":"
_NULL = b"~"


@functools.cache
def _scalar(octets: bytes) -> pa.Scalar:
    """``octets`` as an Arrow scalar, made at first use: building one at import makes pyarrow
    import pandas, which the sink's driver-side Python workers would pay at every start."""
    return pa.scalar(octets, _BYTES)


def rowBytes(batch: pa.RecordBatch) -> pa.Array:
    """One ``large_binary`` value per row of ``batch`` (never null): its fields' bytes."""
    if batch.num_columns == 0:
        return pa.array([b""] * batch.num_rows, _BYTES)
    fields = [_fieldBytes(batch.schema.field(i), batch.column(i)) for i in range(batch.num_columns)]
    if len(fields) == 1:
        return fields[0]
    return pc.binary_join_element_wise(*fields, _scalar(_SEPARATOR))


def _fieldBytes(field: pa.Field, column: pa.Array) -> pa.Array:
    kind = column.type
    if _isBytes(kind):
        return _filled(_prefixed(column.cast(_BYTES)))
    if _isScalar(kind):
        try:
            return _filled(pc.cast(column, pa.large_string()).cast(_BYTES))
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            pass  # a scalar Arrow cannot print: as JSON below
    lines = bytes(encodeBatch(pa.record_batch([column], schema=pa.schema([field])))).split(b"\n")
    return _filled(_prefixed(pa.array(lines[: len(column)], _BYTES)))


def _prefixed(values: pa.Array) -> pa.Array:
    length = pc.cast(pc.binary_length(values), pa.large_string()).cast(_BYTES)
    return pc.binary_join_element_wise(length, values, _scalar(_COLON))


def _filled(values: pa.Array) -> pa.Array:
    return pc.fill_null(values, _scalar(_NULL)) if values.null_count else values


def _isBytes(kind: pa.DataType) -> bool:
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )


def _isScalar(kind: pa.DataType) -> bool:
    return (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_temporal(kind)
        or pa.types.is_decimal(kind)
    )
