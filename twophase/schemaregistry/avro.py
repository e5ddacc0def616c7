"""Avro for Spark's rows: the schema of an Arrow type (as Spark's ``to_avro`` maps types), whether
a given schema fits an Arrow type, and Arrow values as the Python values fastavro writes.

Timestamps and dates go to fastavro as the numbers Avro stores (microseconds, days), cast by
Arrow for the whole column, so no zone is guessed per value and no datetime is built per row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from twophase.settings import TwoPhaseConfigError

KIND = "AVRO"
"""The registry's name of the schema type."""

DEFAULT_RECORD_NAME = "topLevelRecord"
"""The name of a derived record schema, as Spark's ``to_avro`` names it."""


def schemaOf(kind: pa.DataType, recordName: str = DEFAULT_RECORD_NAME) -> dict[str, Any] | str:
    """The Avro schema of non-null values of Arrow type ``kind`` (a struct: a record named
    ``recordName``, which may carry a namespace: ``com.example.Order``)."""
    namespace, _, name = recordName.rpartition(".")
    return _schema(kind, name, namespace)


def schemaText(schema: dict[str, Any] | str) -> str:
    """The schema as the registry stores it: compact JSON with sorted keys, so that the same
    schema always gives the same text (and the registry the same id)."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


def _schema(kind: pa.DataType, name: str, namespace: str) -> dict[str, Any] | str:
    t = pa.types
    if t.is_boolean(kind):
        return "boolean"
    if t.is_int8(kind) or t.is_int16(kind) or t.is_int32(kind):
        return "int"
    if t.is_int64(kind):
        return "long"
    if t.is_float32(kind):
        return "float"
    if t.is_float64(kind):
        return "double"
    if t.is_string(kind) or t.is_large_string(kind):
        return "string"
    if t.is_binary(kind) or t.is_large_binary(kind):
        return "bytes"
    if t.is_date32(kind):
        return {"type": "int", "logicalType": "date"}
    if t.is_timestamp(kind):
        logical = "timestamp-micros" if kind.tz else "local-timestamp-micros"
        return {"type": "long", "logicalType": logical}
    if t.is_decimal(kind):
        return {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": kind.precision,
            "scale": kind.scale,
        }
    if t.is_list(kind) or t.is_large_list(kind):
        item = kind.value_field
        return {"type": "array", "items": _field(item, name, namespace)}
    if t.is_map(kind):
        if not (t.is_string(kind.key_type) or t.is_large_string(kind.key_type)):
            raise TwoPhaseConfigError(
                f"avro: a map's keys must be strings; this one has {kind.key_type} keys (cast "
                "them to string, or make it an array of structs)"
            )
        return {"type": "map", "values": _field(kind.item_field, name, namespace)}
    if t.is_struct(kind):
        inner = f"{namespace}.{name}" if namespace else name
        fields = []
        for f in kind:
            field: dict[str, Any] = {"name": f.name, "type": _field(f, f.name, inner)}
            if f.nullable:
                field["default"] = None
            fields.append(field)
        record: dict[str, Any] = {"type": "record", "name": name, "fields": fields}
        if namespace:
            record["namespace"] = namespace
        return record
    raise TwoPhaseConfigError(
        f"avro: no Avro type for Spark's {kind} (cast the column to a supported type)"
    )


def _field(f: pa.Field, name: str, namespace: str) -> Any:
    inner = _schema(f.type, name, namespace)
    return ["null", inner] if f.nullable else inner


def numericType(kind: pa.DataType) -> pa.DataType:
    """``kind`` with timestamps as int64 microseconds and dates as int32 days (nested too):
    what a column is cast to before its values go to fastavro."""
    t = pa.types
    if t.is_timestamp(kind):
        return pa.int64()
    if t.is_date32(kind):
        return pa.int32()
    if t.is_list(kind):
        return pa.list_(_numericField(kind.value_field))
    if t.is_large_list(kind):
        return pa.large_list(_numericField(kind.value_field))
    if t.is_map(kind):
        return pa.map_(kind.key_field, _numericField(kind.item_field))
    if t.is_struct(kind):
        return pa.struct([_numericField(f) for f in kind])
    return kind


def _numericField(f: pa.Field) -> pa.Field:
    return f.with_type(numericType(f.type))


def pythonValues(column: pa.Array) -> list[Any]:
    """The column's values as fastavro takes them: timestamps in microseconds (UTC for zoned
    ones), dates in days, maps as dicts."""
    kind = column.type
    if pa.types.is_timestamp(kind) and kind.unit != "us":
        column = column.cast(pa.timestamp("us", kind.tz))
    target = numericType(_inMicros(column.type))
    if target != column.type:
        column = column.cast(_inMicros(column.type)).cast(target)
    values = column.to_pylist()
    return mapsAsDicts(values, target) if hasMap(target) else values


def _inMicros(kind: pa.DataType) -> pa.DataType:
    t = pa.types
    if t.is_timestamp(kind):
        return pa.timestamp("us", kind.tz)
    if t.is_list(kind):
        return pa.list_(kind.value_field.with_type(_inMicros(kind.value_type)))
    if t.is_large_list(kind):
        return pa.large_list(kind.value_field.with_type(_inMicros(kind.value_type)))
    if t.is_map(kind):
        return pa.map_(kind.key_field, kind.item_field.with_type(_inMicros(kind.item_type)))
    if t.is_struct(kind):
        return pa.struct([f.with_type(_inMicros(f.type)) for f in kind])
    return kind


def hasMap(kind: pa.DataType) -> bool:
    return any(pa.types.is_map(k) for k in _types(kind))


def _types(kind: pa.DataType) -> Iterator[pa.DataType]:
    yield kind
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        yield from _types(kind.value_type)
    elif pa.types.is_map(kind):
        yield from _types(kind.item_type)
    elif pa.types.is_struct(kind):
        for f in kind:
            yield from _types(f.type)


def mapsAsDicts(values: list[Any], kind: pa.DataType) -> list[Any]:
    """Python values of Arrow type ``kind`` with every map as a dict (Arrow gives pairs)."""
    return [_mapAsDict(v, kind) for v in values]


def _mapAsDict(value: Any, kind: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_map(kind):
        return {k: _mapAsDict(v, kind.item_type) for k, v in value}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return [_mapAsDict(v, kind.value_type) for v in value]
    if pa.types.is_struct(kind):
        return {f.name: _mapAsDict(value[f.name], f.type) for f in kind}
    return value


def misfit(schema: Any, kind: pa.DataType, where: str = "") -> str | None:
    """Why values of Arrow type ``kind`` cannot be written with Avro ``schema`` (a parsed JSON
    schema), or ``None`` when they can. Checks names and types, not values: Spark calls most
    columns nullable, so a null where the schema allows none fails only the row that has it."""
    here = where or "the value"
    if isinstance(schema, list):
        for branch in (b for b in schema if b != "null"):
            if misfit(branch, kind, where) is None:
                return None
        return f"{here}: {_sqlish(kind)} fits no branch of the union {json.dumps(schema)}"
    if isinstance(schema, dict) and not isinstance(schema.get("type"), str | None):
        return misfit(schema["type"], kind, where)
    name = schema if isinstance(schema, str) else schema.get("type")
    logical = schema.get("logicalType") if isinstance(schema, dict) else None
    t = pa.types
    small = t.is_integer(kind) and kind.bit_width <= 32
    binary = t.is_binary(kind) or t.is_large_binary(kind)
    fits = {
        "boolean": t.is_boolean(kind),
        "int": small or (logical == "date" and t.is_date32(kind)),
        "long": t.is_integer(kind) or (logical is not None and t.is_timestamp(kind)),
        "float": t.is_floating(kind) or t.is_integer(kind),
        "double": t.is_floating(kind) or t.is_integer(kind),
        "string": t.is_string(kind) or t.is_large_string(kind),
        "bytes": binary or (logical == "decimal" and t.is_decimal(kind)),
        "enum": t.is_string(kind) or t.is_large_string(kind),
        "fixed": binary,
    }  # fmt: skip
    if name in fits:
        return None if fits[name] else f"{here}: Avro {name} cannot hold {_sqlish(kind)}"
    if name == "array":
        if not (t.is_list(kind) or t.is_large_list(kind)):
            return f"{here}: Avro array cannot hold {_sqlish(kind)}"
        return misfit(schema["items"], kind.value_type, f"{here}[]")
    if name == "map":
        if not t.is_map(kind):
            return f"{here}: Avro map cannot hold {_sqlish(kind)}"
        return misfit(schema["values"], kind.item_type, f"{here}{{}}")
    if name == "record":
        if not t.is_struct(kind):
            return f"{here}: Avro record {schema.get('name')} cannot hold {_sqlish(kind)}"
        fields = {f.name: f for f in kind}
        for avroField in schema.get("fields", []):
            inner = f"{where}.{avroField['name']}" if where else avroField["name"]
            found = fields.pop(avroField["name"], None)
            if found is None:
                if "default" not in avroField:
                    return f"field {inner} of the schema has no column and no default"
                continue
            why = misfit(avroField["type"], found.type, inner)
            if why is not None:
                return why
        if fields:
            extra = ", ".join(sorted(fields))
            return f"{here}: column(s) {extra} are not fields of record {schema.get('name')}"
        return None
    return f"{here}: Avro type {name!r} is not supported here"


def _sqlish(kind: pa.DataType) -> str:
    return str(kind)


def arrowTypeOf(schema: Any, where: str = "the value") -> tuple[pa.DataType, bool]:
    """The Arrow type of values of Avro ``schema`` (parsed JSON) and whether they may be null:
    what a source decodes a record into, the inverse of ``schemaOf``."""
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise TwoPhaseConfigError(
                f"avro: {where} is a union of {json.dumps(schema)}; only a type or null is "
                "supported (Spark's columns have one type)"
            )
        return arrowTypeOf(branches[0], where)[0], True
    if isinstance(schema, dict) and not isinstance(schema.get("type"), str):
        return arrowTypeOf(schema["type"], where)
    name = schema if isinstance(schema, str) else schema["type"]
    logical = schema.get("logicalType") if isinstance(schema, dict) else None
    if logical == "date" and name == "int":
        return pa.date32(), False
    if logical in ("timestamp-micros", "timestamp-millis") and name == "long":
        return pa.timestamp("us", "UTC"), False
    if logical in ("local-timestamp-micros", "local-timestamp-millis") and name == "long":
        return pa.timestamp("us"), False
    if logical == "decimal" and name in ("bytes", "fixed"):
        return pa.decimal128(int(schema["precision"]), int(schema.get("scale", 0))), False
    simple = {
        "boolean": pa.bool_(),
        "int": pa.int32(),
        "long": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "string": pa.string(),
        "bytes": pa.binary(),
        "enum": pa.string(),
        "fixed": pa.binary(),
    }
    if name in simple:
        return simple[name], False
    if name == "array":
        item, nullable = arrowTypeOf(schema["items"], f"{where}[]")
        return pa.list_(pa.field("element", item, nullable)), False
    if name == "map":
        item, nullable = arrowTypeOf(schema["values"], f"{where}{{}}")
        return pa.map_(pa.string(), pa.field("value", item, nullable)), False
    if name == "record":
        fields = []
        for f in schema["fields"]:
            kind, nullable = arrowTypeOf(f["type"], f"{where}.{f['name']}")
            fields.append(pa.field(f["name"], kind, nullable))
        return pa.struct(fields), False
    raise TwoPhaseConfigError(f"avro: {where} has type {name!r}, which has no Spark type here")


def sparkDdlOf(kind: pa.DataType) -> str:
    """Spark's DDL name of Arrow type ``kind`` (``struct<`a`: bigint>``)."""
    t = pa.types
    names = {
        pa.bool_(): "boolean", pa.int8(): "tinyint", pa.int16(): "smallint", pa.int32(): "int",
        pa.int64(): "bigint", pa.float32(): "float", pa.float64(): "double",
        pa.string(): "string", pa.binary(): "binary", pa.date32(): "date",
    }  # fmt: skip
    if kind in names:
        return names[kind]
    if t.is_timestamp(kind):
        return "timestamp" if kind.tz else "timestamp_ntz"
    if t.is_decimal(kind):
        return f"decimal({kind.precision},{kind.scale})"
    if t.is_list(kind):
        return f"array<{sparkDdlOf(kind.value_type)}>"
    if t.is_map(kind):
        return f"map<{sparkDdlOf(kind.key_type)},{sparkDdlOf(kind.item_type)}>"
    if t.is_struct(kind):
        inner = ", ".join(f"`{f.name.replace('`', '``')}`: {sparkDdlOf(f.type)}" for f in kind)
        return f"struct<{inner}>"
    raise TwoPhaseConfigError(f"no Spark type for {kind}")
