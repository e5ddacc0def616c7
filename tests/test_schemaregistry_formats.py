"""Avro and JSON Schema for Spark's rows without a registry: derived schemas, the fit of a given
one, the wire format, and the rows that cannot be serialized."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json

import fastavro
import pyarrow as pa
import pytest

from twophase.schemaregistry import avro, jsonschemas
from twophase.schemaregistry.formats import Encoder, FormatSpec, subjectOf
from twophase.settings import TwoPhaseConfigError

UTC = dt.UTC
ROWS = pa.StructArray.from_arrays(
    [
        pa.array([1, 2, None], pa.int64()),
        pa.array(["a", None, "c"]),
        pa.array(
            [dt.datetime(2024, 1, 1, tzinfo=UTC), None, dt.datetime(1969, 12, 31, 23, tzinfo=UTC)],
            pa.timestamp("us", "UTC"),
        ),
        pa.array([dt.date(2024, 1, 2), None, dt.date(1970, 1, 1)]),
        pa.array([decimal.Decimal("1.10"), None, decimal.Decimal("-3.00")], pa.decimal128(10, 2)),
        pa.array([[1, 2], None, []], pa.list_(pa.int32())),
        pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int32())),
        pa.array([{"x": "a"}, None, {"x": None}], pa.struct([("x", pa.string())])),
        pa.array([b"\x00\xff", None, b""]),
    ],
    names=["id", "s", "ts", "d", "dec", "arr", "m", "st", "bin"],
)


def encoder(fmt: str, schema: object, given: str | None = None, schemaId: int = 7) -> Encoder:
    text = schema if isinstance(schema, str) else json.dumps(schema)
    registered = json.dumps({"id": schemaId, "version": 1, "text": text})
    spec = FormatSpec("value", fmt, schema=given)
    return Encoder(spec, {"twophase.kafka.value.registered": registered})


def encodedBy(result: tuple[pa.Array, dict[int, str]]) -> tuple[list[bytes | None], dict[int, str]]:
    return result[0].to_pylist(), result[1]


def test_avro_rows_read_back_as_written_with_the_registry_header() -> None:
    schema = avro.schemaOf(ROWS.type)
    out, failed = encodedBy(encoder("avro", schema).encode(ROWS))
    assert failed == {}
    parsed = fastavro.parse_schema(schema)
    back = []
    for record in out:
        assert record is not None and record[:5] == b"\x00\x00\x00\x00\x07"
        back.append(fastavro.schemaless_reader(io.BytesIO(record[5:]), parsed))
    expected = ROWS.to_pylist()
    for row in expected:
        row["m"] = None if row["m"] is None else dict(row["m"])
    assert back == expected


def test_the_same_rows_give_the_same_bytes() -> None:
    """A replay must reproduce the decided records byte for byte (the fingerprint)."""
    schema = avro.schemaOf(ROWS.type)
    first = encoder("avro", schema).encode(ROWS)[0].to_pylist()
    again = encoder("avro", schema).encode(ROWS.take([2, 0, 1]))[0].to_pylist()
    assert again == [first[2], first[0], first[1]]
    assert avro.schemaText(schema) == avro.schemaText(avro.schemaOf(ROWS.type))


def test_a_null_value_is_a_tombstone() -> None:
    values = pa.array([{"a": 1}, None], pa.struct([("a", pa.int64())]))
    out, failed = encodedBy(encoder("avro", avro.schemaOf(values.type)).encode(values))
    assert out[1] is None and out[0] is not None and failed == {}


def test_a_null_where_the_given_avro_schema_allows_none_fails_that_row_only() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    values = pa.array([{"a": 1}, {"a": None}, {"a": 3}], pa.struct([("a", pa.int64())]))
    assert avro.misfit(schema, values.type) is None  # Spark calls most columns nullable
    out, failed = encodedBy(encoder("avro", schema).encode(values))
    assert list(failed) == [1] and out[0] is not None and out[2] is not None


def test_a_given_avro_schema_the_columns_do_not_fit_is_named() -> None:
    kind = pa.struct([("a", pa.int64()), ("b", pa.string())])
    intField = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
    assert "column(s) b" in str(
        avro.misfit(intField, pa.struct([("a", pa.int32()), ("b", pa.string())]))
    )
    assert "cannot hold int64" in str(avro.misfit(intField, kind))
    missing = {"type": "record", "name": "R", "fields": [{"name": "c", "type": "string"}]}
    assert "field c" in str(avro.misfit(missing, kind))


def test_json_schema_rows_are_spark_json_with_the_registry_header() -> None:
    schema = jsonschemas.schemaOf(ROWS.type, "t")
    out, failed = encodedBy(encoder("jsonschema", schema, schemaId=258).encode(ROWS))
    assert failed == {}
    assert out[0] is not None and out[0][:5] == b"\x00\x00\x00\x01\x02"
    first = json.loads(out[0][5:])
    assert first["ts"] == "2024-01-01T00:00:00.000000Z" and first["bin"] == "AP8="
    from jsonschema import validators

    validator = validators.validator_for(schema)(schema)
    for record in out:
        assert record is not None
        validator.validate(json.loads(record[5:]))


def test_a_row_a_given_json_schema_refuses_fails_that_row_only() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 2}}}
    values = pa.array([{"a": 1}, {"a": 2}], pa.struct([("a", pa.int64())]))
    out, failed = encodedBy(encoder("jsonschema", schema, given=json.dumps(schema)).encode(values))
    assert list(failed) == [0] and "a:" in failed[0] and out[1] is not None


def test_subjects_follow_the_strategy() -> None:
    assert subjectOf(FormatSpec("value", "avro"), "orders", "com.x.Order") == "orders-value"
    record = FormatSpec("key", "avro", strategy="record")
    assert subjectOf(record, "orders", "com.x.Order") == "com.x.Order"
    both = FormatSpec("value", "avro", strategy="topic-record")
    assert subjectOf(both, "orders", "com.x.Order") == "orders-com.x.Order"
    with pytest.raises(TwoPhaseConfigError, match="named record"):
        subjectOf(record, "orders", None)


def test_options_are_checked_before_anything_runs() -> None:
    base = {"schema.registry.url": "http://registry:8081"}
    assert FormatSpec.fromOptions({}, "value").format == "bytes"
    spec = FormatSpec.fromOptions(
        {**base, "value.format": "AVRO", "value.subject.name.strategy": "io.confluent.kafka."
         "serializers.subject.RecordNameStrategy", "auto.register.schemas": "false"},
        "value",
    )  # fmt: skip
    assert (spec.format, spec.strategy, spec.autoRegister) == ("avro", "record", False)
    with pytest.raises(TwoPhaseConfigError, match="schema.registry.url"):
        FormatSpec.fromOptions({"value.format": "avro"}, "value")
    assert FormatSpec.fromOptions({**base, "key.format": "protobuf"}, "key").usesRegistry
    with pytest.raises(TwoPhaseConfigError, match="must be one of"):
        FormatSpec.fromOptions({**base, "value.format": "xml"}, "value")
    with pytest.raises(TwoPhaseConfigError, match="has no schema"):
        FormatSpec.fromOptions({"value.schema": "{}"}, "value")


def test_json_schema_records_decode_back_into_their_columns() -> None:
    """The source's side: the derived schema read back as Arrow types, each row's JSON into
    them (decimals come back as doubles, as JSON numbers are)."""
    schema = json.loads(jsonschemas.schemaText(jsonschemas.schemaOf(ROWS.type, "Row")))
    kind = jsonschemas.arrowTypeOf(schema)
    read = jsonschemas.pythonOf(kind)
    texts = jsonschemas.rowTexts(ROWS).to_pylist()
    decoded = pa.array([None if t is None else read(json.loads(t)) for t in texts], kind)
    assert sorted(f.name for f in kind) == sorted(ROWS.type.names)
    for f in ROWS.type:
        want = ROWS.field(f.name)
        want = want.cast(pa.float64()) if pa.types.is_decimal(f.type) else want
        assert decoded.field(f.name).to_pylist() == want.to_pylist(), f.name


def test_hand_written_json_schemas_map_to_columns_or_are_named() -> None:
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": ["integer", "null"]},
            "note": {"anyOf": [{"type": "null"}, {"type": "string"}]},
            "any": {},
            "labels": {"type": "object", "additionalProperties": {"type": "number"}},
        },
    }
    kind = jsonschemas.arrowTypeOf(schema)
    assert kind == pa.struct([("id", pa.int64()), ("note", pa.string()), ("any", pa.string()),
                              ("labels", pa.map_(pa.string(), pa.float64()))])  # fmt: skip
    value = jsonschemas.pythonOf(kind)({"id": 3, "any": {"a": [1]}, "labels": {"x": 1.5}})
    assert value == {"id": 3, "note": None, "any": '{"a": [1]}', "labels": [("x", 1.5)]}
    with pytest.raises(TwoPhaseConfigError, match=r"the value.ref uses \$ref"):
        jsonschemas.arrowTypeOf({"type": "object", "properties": {"ref": {"$ref": "#/x"}}})
    with pytest.raises(TwoPhaseConfigError, match="one of several types"):
        jsonschemas.arrowTypeOf({"oneOf": [{"type": "string"}, {"type": "integer"}]})
