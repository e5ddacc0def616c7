"""Vectorised JSON-lines encoding of Arrow record batches (pyarrow has a JSON reader only).

Each row becomes one JSON object on one line, keys in column order, as Spark's JSON writer
writes it: numbers bare (``NaN``/``Infinity`` as Spark writes them, floats always with a
fraction or exponent so readers infer a float), dates and times as ISO-8601 strings
(timestamps ``YYYY-MM-DDTHH:MM:SS.ffffff`` plus ``Z``/``+HH:MM`` when zoned), binary as
base64. Unlike Spark's default, null fields are written as ``null`` rather than left out, so
every line has every column and a reader's schema does not depend on which file it reads first.

Scalar columns are encoded with Arrow compute kernels (no per-row Python); nested, binary and
other rare types fall back to ``json.dumps`` per value.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_TEXT = pa.large_string()
_CONTROL = "[\\x00-\\x1f]"
_SHORT_ESCAPES = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _lit(text: str) -> pa.Scalar:
    return pa.scalar(text, _TEXT)


def _join(*parts: pa.Array | pa.Scalar) -> pa.Array:
    return pc.binary_join_element_wise(*parts, _lit(""))


def _quote(text: pa.Array) -> pa.Array:
    """JSON string literals for a (large) string array without nulls."""
    text = pc.replace_substring(text, "\\", "\\\\")
    text = pc.replace_substring(text, '"', '\\"')
    if pc.any(pc.match_substring_regex(text, _CONTROL)).as_py():
        for code in range(0x20):
            char = chr(code)
            escaped = _SHORT_ESCAPES.get(char, f"\\u{code:04x}")
            text = pc.replace_substring(text, char, escaped)
    return _join(_lit('"'), text, _lit('"'))


def _floatText(column: pa.Array) -> pa.Array:
    text = pc.cast(column, _TEXT)
    text = pc.replace_substring_regex(text, "^nan$", "NaN")
    text = pc.replace_substring_regex(text, "^inf$", "Infinity")
    text = pc.replace_substring_regex(text, "^-inf$", "-Infinity")
    return pc.replace_substring_regex(text, "^(-?[0-9]+)$", "\\1.0")


def _timestampText(column: pa.Array) -> pa.Array:
    text = pc.cast(column, _TEXT)
    text = pc.replace_substring(text, " ", "T", max_replacements=1)
    # Arrow renders offsets as +HHMM; ISO-8601 extended form (and Spark) use +HH:MM.
    return pc.replace_substring_regex(text, "([+-][0-9]{2})([0-9]{2})$", "\\1:\\2")


def _default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _pythonText(column: pa.Array) -> pa.Array:
    """Per-value fallback for nested and rare types (maps come out as objects)."""
    values = column.to_pylist()
    if pa.types.is_map(column.type):
        values = [None if v is None else dict(v) for v in values]
    texts = [json.dumps(v, default=_default, allow_nan=True, ensure_ascii=False) for v in values]
    return pa.array(texts, _TEXT)


def valueText(column: pa.Array) -> pa.Array:
    """JSON text of every value of ``column`` (``null`` for nulls); a large_string array."""
    type_ = column.type
    if pa.types.is_dictionary(type_):
        return valueText(column.dictionary_decode())
    if pa.types.is_null(type_):
        return pa.array(["null"] * len(column), _TEXT)
    if pa.types.is_boolean(type_) or pa.types.is_integer(type_) or pa.types.is_decimal(type_):
        text = pc.cast(column, _TEXT)
    elif pa.types.is_floating(type_):
        text = _floatText(column)
    elif (
        pa.types.is_string(type_)
        or pa.types.is_large_string(type_)
        or pa.types.is_string_view(type_)
    ):
        text = _quote(pc.fill_null(pc.cast(column, _TEXT), ""))
    elif pa.types.is_timestamp(type_):
        text = _quote(_timestampText(column))
    elif pa.types.is_date(type_) or pa.types.is_time(type_):
        text = _quote(pc.cast(column, _TEXT))
    else:
        return _pythonText(column)
    if column.null_count:
        text = pc.if_else(pc.is_null(column), _lit("null"), text)
    return text


def encodeBatch(batch: pa.RecordBatch) -> memoryview:
    """The JSON-lines bytes of ``batch``: one ``{...}\\n`` line per row, ready to write.

    Builds one Arrow string array whose value buffer already holds the lines back to back and
    returns a view of that buffer (no copy). Memory: a small multiple of the batch.
    """
    if batch.num_rows == 0:
        return memoryview(b"")
    if batch.num_columns == 0:
        return memoryview(b"{}\n" * batch.num_rows)
    parts: list[pa.Array | pa.Scalar] = [_lit("{")]
    for i, name in enumerate(batch.schema.names):
        key = json.dumps(name, ensure_ascii=False) + ":"
        parts.append(_lit(("," if i else "") + key))
        parts.append(valueText(batch.column(i)))
    parts.append(_lit("}\n"))
    lines = _join(*parts)
    if isinstance(lines, pa.ChunkedArray):  # defensive: compute returns arrays for arrays
        lines = pa.concat_arrays(lines.chunks)
    _, offsetsBuffer, dataBuffer = lines.buffers()
    offsets = np.frombuffer(offsetsBuffer, dtype=np.int64)
    start = int(offsets[lines.offset])
    end = int(offsets[lines.offset + len(lines)])
    return memoryview(dataBuffer)[start:end]
