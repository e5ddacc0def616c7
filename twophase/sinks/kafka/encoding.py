"""Rows to the bytes of Kafka records' values and keys: a column as its bytes, as a string, or
in the schema registry's wire format (``twophase.schemaregistry``), and the rows that cannot be.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from twophase.schemaregistry.formats import BYTES, RESOLVED, STRING, Encoder, FormatSpec
from twophase.schemaregistry.jsonschemas import rowTexts
from twophase.sinks.kafka.columns import ColumnLayout


@dataclass
class Encoded:
    """One Arrow batch's record values and keys (``None``: null), as lists for the producer
    and as binary arrays for their sizes, and the rows that could not be serialized."""

    values: list[Any]
    keys: list[Any] | None
    valueArray: pa.Array
    keyArray: pa.Array | None
    failed: dict[int, str]
    """Row (in the batch) -> why it cannot be serialized, naming the key or the value."""

    def without(self, rows: set[int]) -> Encoded:
        """The same without ``rows`` (set aside)."""
        keep = pa.array([i not in rows for i in range(len(self.values))])
        return Encoded(
            values=[v for i, v in enumerate(self.values) if i not in rows],
            keys=None
            if self.keys is None
            else [k for i, k in enumerate(self.keys) if i not in rows],
            valueArray=self.valueArray.filter(keep),
            keyArray=None if self.keyArray is None else self.keyArray.filter(keep),
            failed={},
        )


class RecordEncoding:
    """A task's way from rows to record bytes, by the ``value.format`` and ``key.format``
    options and the schemas the driver registered (``registered``, by side)."""

    def __init__(
        self, valueFormat: FormatSpec, keyFormat: FormatSpec, registered: Mapping[str, str]
    ) -> None:
        self.formats = {"value": valueFormat, "key": keyFormat}
        self.encoders = {
            side: Encoder(
                spec, {RESOLVED.format(side=side): registered[side]} if side in registered else {}
            )
            for side, spec in self.formats.items()
            if spec.usesRegistry
        }

    @classmethod
    def plain(cls) -> RecordEncoding:
        """Values and keys as their bytes (the default formats)."""
        return cls(FormatSpec("value"), FormatSpec("key"), {})

    def column(self, batch: pa.RecordBatch, layout: ColumnLayout, side: str) -> pa.Array | None:
        """What ``side`` is made of: its column, or (a value without one) the row's other
        columns as a struct; ``None`` for a key without a column."""
        index = layout.value if side == "value" else layout.key
        if index is not None:
            return batch.column(index)
        if side == "key" or not layout.rest:
            return None
        fields = [batch.schema.field(i) for i in layout.rest]
        return pa.StructArray.from_arrays([batch.column(i) for i in layout.rest], fields=fields)

    def encode(self, batch: pa.RecordBatch, layout: ColumnLayout) -> Encoded:
        failed: dict[int, str] = {}
        value = self.column(batch, layout, "value")
        assert value is not None
        values, valueArray = self._side("value", value, failed)
        key = self.column(batch, layout, "key")
        keys, keyArray = (None, None) if key is None else self._side("key", key, failed)
        return Encoded(values, keys, valueArray, keyArray, failed)

    def _side(
        self, side: str, column: pa.Array, failed: dict[int, str]
    ) -> tuple[list[Any], pa.Array]:
        spec = self.formats[side]
        if spec.format == BYTES:
            array = _asBinary(column)
            return array.to_pylist(), array
        if spec.format == STRING:
            array = _asBinary(column if _isText(column.type) else column.cast(pa.string()))
            return array.to_pylist(), array
        encoded, refused = self.encoders[side].encode(column)
        for row, why in refused.items():
            failed.setdefault(row, f"the {side} as {spec.format}: {why}")
        return encoded.to_pylist(), encoded

    def shown(self, batch: pa.RecordBatch, layout: ColumnLayout, row: int) -> tuple[Any, Any]:
        """The value and key of ``row`` as a dead-letter record keeps a row that could not be
        serialized: bytes and strings as they are, anything else as its JSON text."""
        one = batch.slice(row, 1)
        value, key = self.column(one, layout, "value"), self.column(one, layout, "key")
        return _plain(value), _plain(key)


def _isText(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _asBinary(column: pa.Array) -> pa.Array:
    """A string or binary column as binary (strings as their UTF-8 bytes, no copy)."""
    if pa.types.is_string(column.type):
        return column.cast(pa.binary())
    if pa.types.is_large_string(column.type):
        return column.cast(pa.large_binary())
    return column


def _plain(column: pa.Array | None) -> Any:
    if column is None:
        return None
    kind = column.type
    if _isText(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return column[0].as_py()
    return rowTexts(column)[0].as_py()
