"""Hive-style partition directories (``col=value/``) as Spark writes them, and splitting by them.

Directory names follow Spark's ``ExternalCatalogUtils.escapePathName`` (``%XX`` for control
characters and ``"#%'*/:=?\\{[]^``, DEL) and its value rendering (``true``/``false``, Java's
``Double.toString``, ``yyyy-MM-dd HH:mm:ss[.fraction]`` for timestamps); null and the empty
string become ``__HIVE_DEFAULT_PARTITION__``. Spark, pyarrow (``partitioning="hive"``, which
URI-decodes segments) and pandas read such directories back as partition columns.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import urllib.parse
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
"""The directory value Spark and Hive use for a null (or empty) partition value."""

_ESCAPED = frozenset([chr(c) for c in range(0x01, 0x20)] + list("\"#%'*/:=?\\\x7f{[]^"))


def escapePathName(text: str) -> str:
    """Escape ``text`` for one path segment exactly as Spark's ``escapePathName`` does."""
    if not any(c in _ESCAPED for c in text):
        return text
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in text)


def _javaFloatText(value: float, single: bool) -> str:
    """``Double.toString`` / ``Float.toString`` of Java, which Spark uses to render floats."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    shortest = str(np.float32(value)) if single else repr(value)
    number = decimal.Decimal(shortest)
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits)).rstrip("0") or "0"
    exponent += len(digits) - len(text)
    magnitude = len(text) + exponent - 1  # decimal exponent of the leading digit
    prefix = "-" if sign else ""
    if -3 <= magnitude < 7:
        plain = format(decimal.Decimal((0, tuple(int(d) for d in text), exponent)), "f")
        return prefix + (plain if "." in plain else plain + ".0")
    return f"{prefix}{text[0]}.{text[1:] or '0'}E{magnitude}"


def _timestampText(value: dt.datetime) -> str:
    text = value.strftime("%Y-%m-%d %H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text


def partitionValueText(value: Any, type_: pa.DataType) -> str:
    """The directory value Spark would write for ``value`` of Arrow type ``type_``.

    Not yet escaped; null and ``""`` give ``__HIVE_DEFAULT_PARTITION__``.
    """
    if value is None:
        return HIVE_DEFAULT_PARTITION
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float):
        text = _javaFloatText(
            value, single=pa.types.is_float32(type_) or pa.types.is_float16(type_)
        )
    elif isinstance(value, decimal.Decimal):
        text = format(value, "f")
    elif isinstance(value, dt.datetime):
        text = _timestampText(value)
    elif isinstance(value, dt.date | dt.time):
        text = value.isoformat()
    else:
        text = str(value)
    return text or HIVE_DEFAULT_PARTITION


def partitionSegment(column: str, value: Any, type_: pa.DataType) -> str:
    """One ``col=value`` path segment, both sides escaped as Spark escapes them."""
    return f"{escapePathName(column)}={escapePathName(partitionValueText(value, type_))}"


def partitionValuesOf(rel: str) -> dict[str, str | None]:
    """The partition values a file's ``col=value/`` directories name (the inverse of
    :func:`partitionSegment`, as text): unescaped, ``__HIVE_DEFAULT_PARTITION__`` as ``None``."""
    values: dict[str, str | None] = {}
    for segment in rel.split("/")[:-1]:
        column, _, text = segment.partition("=")
        value = urllib.parse.unquote(text)
        values[urllib.parse.unquote(column)] = None if value == HIVE_DEFAULT_PARTITION else value
    return values


def _isPartitionable(type_: pa.DataType) -> bool:
    if pa.types.is_dictionary(type_):
        return _isPartitionable(type_.value_type)
    return (
        pa.types.is_integer(type_)
        or pa.types.is_floating(type_)
        or pa.types.is_boolean(type_)
        or pa.types.is_string(type_)
        or pa.types.is_large_string(type_)
        or pa.types.is_string_view(type_)
        or pa.types.is_decimal(type_)
        or pa.types.is_date(type_)
        or pa.types.is_timestamp(type_)
        or pa.types.is_null(type_)
    )


def dataColumnIndices(schema: pa.Schema, partitionBy: Sequence[str]) -> list[int]:
    """Indices of the columns written into files (all but the partition columns).

    Raises ``ValueError`` naming the ``partitionBy`` option when a partition column is missing,
    has a type that cannot name a directory, or when no data column would be left.
    """
    names = schema.names
    for name in partitionBy:
        if names.count(name) != 1:
            found = "missing from" if name not in names else "ambiguous (duplicated) in"
            raise ValueError(
                f"option partitionBy: column {name!r} is {found} the data (columns: "
                f"{', '.join(names)}); fix partitionBy or the query's output columns"
            )
        type_ = schema.field(name).type
        if not _isPartitionable(type_):
            raise ValueError(
                f"option partitionBy: column {name!r} has type {type_}, which cannot name a "
                "directory; partition by an integer, string, boolean, decimal, date or "
                "timestamp column"
            )
    keep = [i for i, name in enumerate(names) if name not in partitionBy]
    if not keep:
        raise ValueError(
            "option partitionBy: it names every column, so no data would be left in the "
            "files; leave at least one column out of partitionBy"
        )
    return keep


def splitByPartition(
    batch: pa.RecordBatch, partitionBy: Sequence[str], dataColumns: Sequence[int]
) -> list[tuple[str, pa.RecordBatch]]:
    """Split ``batch`` into ``(partition directory, rows without partition columns)`` pairs.

    Vectorised (dictionary encoding and one stable sort); keeps the input order of rows within
    each directory and orders directories deterministically (by first appearance of each
    column's value), so the same input always gives the same output. Without ``partitionBy``
    the whole batch goes to directory ``""``. Memory: one copy of the batch at most.
    """
    data = batch.select(list(dataColumns))
    if not partitionBy:
        return [("", data)]
    if batch.num_rows == 0:
        return []
    codes: list[np.ndarray[Any, Any]] = []
    labels: list[list[str]] = []
    for name in partitionBy:
        column = batch.column(name)
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        encoded = pc.dictionary_encode(column, null_encoding="encode")
        labels.append(
            [partitionSegment(name, v, column.type) for v in encoded.dictionary.to_pylist()]
        )
        codes.append(np.asarray(encoded.indices, dtype=np.int64))
    combined = codes[0]
    for more in codes[1:]:
        combined = combined * (int(more.max()) + 1) + more
        combined = np.unique(combined, return_inverse=True)[1].reshape(-1)
    _, first, inverse = np.unique(combined, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    directories = [
        "/".join(lab[c[row]] for lab, c in zip(labels, codes, strict=True)) for row in first
    ]
    if len(directories) == 1:
        return [(directories[0], data)]
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse, minlength=len(directories))
    ordered = data.take(pa.array(order))
    out = []
    start = 0
    for directory, count in zip(directories, counts.tolist(), strict=True):
        out.append((directory, ordered.slice(start, count)))
        start += count
    return out
