"""JSON Schema for Spark's rows: the schema of an Arrow type, and a row as the JSON text a
registry-framed JSON Schema record carries (Spark's JSON writer's forms, built by Arrow kernels).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from twophase.settings import TwoPhaseConfigError

KIND = "JSON"
"""The registry's name of the schema type."""

DRAFT = "http://json-schema.org/draft-07/schema#"


def schemaOf(kind: pa.DataType, title: str) -> dict[str, Any]:
    """The JSON Schema (draft-07) of non-null values of Arrow type ``kind``."""
    return {"$schema": DRAFT, "title": title, **_schema(kind)}


def _schema(kind: pa.DataType) -> dict[str, Any]:
    t = pa.types
    if t.is_boolean(kind):
        return {"type": "boolean"}
    if t.is_integer(kind):
        return {"type": "integer"}
    if t.is_floating(kind) or t.is_decimal(kind):
        return {"type": "number"}
    if t.is_string(kind) or t.is_large_string(kind):
        return {"type": "string"}
    if t.is_binary(kind) or t.is_large_binary(kind):
        return {"type": "string", "contentEncoding": "base64"}
    if t.is_date32(kind):
        return {"type": "string", "format": "date"}
    if t.is_timestamp(kind):
        return {"type": "string", "format": "date-time"} if kind.tz else {"type": "string"}
    if t.is_list(kind) or t.is_large_list(kind):
        return {"type": "array", "items": _field(kind.value_field)}
    if t.is_map(kind):
        if not (t.is_string(kind.key_type) or t.is_large_string(kind.key_type)):
            raise TwoPhaseConfigError(
                f"jsonschema: a map's keys must be strings; this one has {kind.key_type} keys"
            )
        return {"type": "object", "additionalProperties": _field(kind.item_field)}
    if t.is_struct(kind):
        return {
            "type": "object",
            "properties": {f.name: _field(f) for f in kind},
            "required": [f.name for f in kind if not f.nullable],
            "additionalProperties": False,
        }
    raise TwoPhaseConfigError(
        f"jsonschema: no JSON Schema type for Spark's {kind} (cast the column to a supported type)"
    )


def _field(f: pa.Field) -> dict[str, Any]:
    inner = _schema(f.type)
    return {"oneOf": [{"type": "null"}, inner]} if f.nullable else inner


def schemaText(schema: dict[str, Any]) -> str:
    """Compact JSON with sorted keys: the same schema always gives the same text."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


def rowTexts(column: pa.Array) -> pa.Array:
    """The JSON text of every value of ``column`` (a struct: one object per row, its fields in
    column order), as Spark's JSON writer writes each type; nulls stay null."""
    import pyarrow.compute as pc

    from twophase.sinks.files.jsonlines import valueText

    if not pa.types.is_struct(column.type):
        text = valueText(column)
    else:
        parts: list[Any] = [pa.scalar("{", pa.large_string())]
        for i, f in enumerate(column.type):
            key = ("," if i else "") + json.dumps(f.name, ensure_ascii=False) + ":"
            parts.append(pa.scalar(key, pa.large_string()))
            parts.append(valueText(pc.struct_field(column, [i])))
        parts.append(pa.scalar("}", pa.large_string()))
        text = pc.binary_join_element_wise(*parts, pa.scalar("", pa.large_string()))
    if column.null_count:
        text = pc.if_else(column.is_valid(), text, pa.scalar(None, text.type))
    return text
