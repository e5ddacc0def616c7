"""JSON Schema for Spark's rows: the schema of an Arrow type, and a row as the JSON text a
registry-framed JSON Schema record carries (Spark's JSON writer's forms, built by Arrow kernels).
"""

from __future__ import annotations

import base64
import datetime as dt
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


def arrowTypeOf(schema: Any, where: str = "the value") -> pa.DataType:
    """The Arrow type that holds values of a JSON Schema (the forms ``schemaOf`` writes and the
    usual hand-written ones): objects with ``properties`` as structs in the schema's order,
    ``additionalProperties`` alone as maps with string keys, ``date-time`` strings as UTC
    timestamps, ``date`` ones as dates, ``integer`` as bigint, ``number`` as double; a null
    branch (``oneOf``/``anyOf``, or a type list) makes it nullable, which every field is."""
    inner = _nonNull(schema, where)
    if inner is None:  # {} or true: any JSON value, kept as its text
        return pa.string()
    kind = inner.get("type")
    if kind == "object":
        properties = inner.get("properties")
        extra = inner.get("additionalProperties")
        if not properties and isinstance(extra, dict):
            return pa.map_(pa.string(), arrowTypeOf(extra, f"{where}'s values"))
        if not properties:
            return pa.string()
        return pa.struct(
            [
                pa.field(name, arrowTypeOf(part, f"{where}.{name}"))
                for name, part in properties.items()
            ]
        )
    if kind == "array":
        return pa.list_(arrowTypeOf(inner.get("items", {}), f"{where}'s items"))
    simple = {"boolean": pa.bool_(), "integer": pa.int64(), "number": pa.float64()}
    if kind in simple:
        return simple[kind]
    if kind == "string":
        if inner.get("contentEncoding") == "base64":
            return pa.binary()
        formats = {"date-time": pa.timestamp("us", "UTC"), "date": pa.date32()}
        return formats.get(str(inner.get("format")), pa.string())
    raise TwoPhaseConfigError(
        f"jsonschema: {where} has a schema the source cannot map to a column "
        f"({json.dumps(schema)[:200]}): read the value as bytes and use from_json"
    )


def _nonNull(schema: Any, where: str) -> dict[str, Any] | None:
    """The schema without its null branch (``None``: any value)."""
    if schema is True or schema == {}:
        return None
    if not isinstance(schema, dict):
        raise TwoPhaseConfigError(f"jsonschema: {where} has no schema the source can read")
    if "$ref" in schema:
        raise TwoPhaseConfigError(
            f"jsonschema: {where} uses $ref, which the source does not follow: read the value "
            "as bytes and use from_json"
        )
    for key in ("oneOf", "anyOf"):
        branches = [b for b in schema.get(key, []) if b != {"type": "null"}]
        if key in schema:
            if len(branches) != 1:
                raise TwoPhaseConfigError(
                    f"jsonschema: {where} is one of several types, which no column holds"
                )
            return _nonNull(branches[0], where)
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise TwoPhaseConfigError(
                f"jsonschema: {where} is one of {kinds}, which no column holds"
            )
        return {**schema, "type": kinds[0]}
    return schema


def pythonOf(kind: pa.DataType) -> Any:
    """A parsed JSON value to the Python value of Arrow type ``kind`` (``arrowTypeOf``'s)."""
    t = pa.types
    if t.is_struct(kind):
        parts = [(f.name, pythonOf(f.type)) for f in kind]
        return lambda v: None if v is None else {n: p(v.get(n)) for n, p in parts}
    if t.is_map(kind):
        item = pythonOf(kind.item_type)
        return lambda v: None if v is None else [(k, item(x)) for k, x in v.items()]
    if t.is_list(kind):
        element = pythonOf(kind.value_type)
        return lambda v: None if v is None else [element(x) for x in v]
    if t.is_timestamp(kind):
        return lambda v: None if v is None else dt.datetime.fromisoformat(v)
    if t.is_date32(kind):
        return lambda v: None if v is None else dt.date.fromisoformat(v)
    if t.is_binary(kind):
        return lambda v: None if v is None else base64.b64decode(v)
    if t.is_string(kind):
        return lambda v: v if v is None or isinstance(v, str) else json.dumps(v)
    return lambda v: v
