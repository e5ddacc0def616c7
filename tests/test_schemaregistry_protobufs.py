"""Protobuf for Spark's rows without a registry: the derived proto3 message, rows to message
bytes read back by confluent-kafka's own deserializer, and message bytes back to Arrow."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from twophase.schemaregistry import protobufs
from twophase.schemaregistry.formats import Encoder, FormatSpec
from twophase.settings import TwoPhaseConfigError

ROWS = pa.array(
    [
        {"id": 1, "s": "a", "ts": dt.datetime(2024, 1, 1, tzinfo=dt.UTC), "d": dt.date(2024, 1, 2),
         "dec": decimal.Decimal("1.10"), "arr": [1, 2], "m": [("k", 1)], "st": {"x": "a"},
         "bin": b"\x00\xff"},
        {"id": 2},
        {"id": None, "s": "c", "ts": dt.datetime(1969, 12, 31, 23, tzinfo=dt.UTC),
         "d": dt.date(1970, 1, 1), "dec": decimal.Decimal("-3.00"), "arr": [], "st": {"x": None},
         "bin": b""},
    ],
    pa.struct([
        ("id", pa.int64()), ("s", pa.string()), ("ts", pa.timestamp("us", "UTC")),
        ("d", pa.date32()), ("dec", pa.decimal128(10, 2)), ("arr", pa.list_(pa.int32())),
        ("m", pa.map_(pa.string(), pa.int32())), ("st", pa.struct([("x", pa.string())])),
        ("bin", pa.binary()),
    ]),
)  # fmt: skip


def encoder(text: str, schemaId: int = 7) -> Encoder:
    """The sink's encoder, as a task gets it: the schema the driver registered, by option."""
    registered = json.dumps({"id": schemaId, "version": 1, "text": text})
    return Encoder(FormatSpec("value", "protobuf"), {"twophase.kafka.value.registered": registered})


def derived(kind: pa.DataType, name: str = "it.twophase.Row") -> tuple[str, type]:
    text = protobufs.schemaText(protobufs.fileOf(kind, name))
    cls, index = protobufs.messageOf(protobufs.fileFromText(text, "test"), None)
    assert index == 0
    return text, cls


def test_rows_read_back_by_confluents_deserializer_with_nulls_kept_apart_from_zero() -> None:
    text, cls = derived(ROWS.type)
    out, failed = encoder(text, schemaId=9).encode(ROWS)
    assert failed == {}
    framed = out.to_pylist()
    assert framed[0][:6] == b"\x00\x00\x00\x00\x09\x00"  # magic, id 9, message index [0]
    deserializer = ProtobufDeserializer(cls, {"use.deprecated.format": False})
    context = SerializationContext("t", MessageField.VALUE)
    first = deserializer(framed[0], context)
    assert (first.id, first.s, first.dec, list(first.arr), dict(first.m)) == (
        1, "a", "1.10", [1, 2], {"k": 1},
    )  # fmt: skip
    assert first.ts.ToSeconds() == 1704067200 and first.d == 19724 and first.st.x == "a"
    second = deserializer(framed[1], context)
    assert second.id == 2 and not second.HasField("s") and not second.HasField("ts")
    third = deserializer(framed[2], context)
    assert not third.HasField("id") and third.d == 0 and third.HasField("d")


def test_messages_decode_to_the_rows_arrow_values() -> None:
    text, cls = derived(ROWS.type)
    out, _ = encoder(text).encode(ROWS)
    read = protobufs.pythonOf(cls.DESCRIPTOR)
    values = []
    for framed in out.to_pylist():
        indexes, start = protobufs.readIndexes(framed, 5)
        assert indexes == [0]
        values.append(read(cls.FromString(framed[start:])))
    decoded = pa.array(values, protobufs.arrowTypeOf(cls.DESCRIPTOR))
    assert decoded.field("id").to_pylist() == [1, 2, None]
    assert (
        decoded.field("ts").cast(pa.int64()).to_pylist()
        == ROWS.field("ts").cast(pa.int64()).to_pylist()
    )
    assert decoded.field("dec").to_pylist() == ["1.10", None, "-3.00"]
    assert decoded.field("arr").to_pylist() == [[1, 2], [], []]  # null and empty: both empty
    assert decoded.field("st").to_pylist() == [{"x": "a"}, None, {"x": None}]


def test_a_row_that_cannot_be_a_message_fails_alone_naming_its_field() -> None:
    values = pa.array(
        [{"id": 1, "arr": [1]}, {"id": 2, "arr": [1, None]}],
        pa.struct([("id", pa.int64()), ("arr", pa.list_(pa.int32()))]),
    )
    text, _ = derived(values.type)
    out, failed = encoder(text).encode(values)
    assert list(failed) == [1] and failed[1].startswith("field arr:")
    assert out.to_pylist()[0] is not None and out.to_pylist()[1] is None


def test_a_value_that_is_not_a_struct_is_a_message_of_one_field() -> None:
    text, cls = derived(pa.int64(), "Count")
    out, _ = encoder(text).encode(pa.array([5, None], pa.int64()))
    first, second = out.to_pylist()
    assert cls.FromString(first[6:]).value == 5 and second is None  # null: a tombstone


def test_a_given_schema_is_checked_against_the_columns() -> None:
    _, cls = derived(pa.struct([("id", pa.int64()), ("name", pa.string())]))
    assert protobufs.misfit(cls.DESCRIPTOR, pa.struct([("id", pa.int32())])) is None
    why = protobufs.misfit(cls.DESCRIPTOR, pa.struct([("name", pa.int64())]))
    assert why is not None and "name" in why and "string cannot hold int64" in why
    why = protobufs.misfit(cls.DESCRIPTOR, pa.struct([("gone", pa.int64())]))
    assert why is not None and "no field 'gone'" in why


def test_what_has_no_protobuf_form_is_named_before_anything_runs() -> None:
    with pytest.raises(TwoPhaseConfigError, match="'my col' is not a Protobuf field name"):
        protobufs.fileOf(pa.struct([("my col", pa.int64())]), "R")
    with pytest.raises(TwoPhaseConfigError, match="array of arrays"):
        protobufs.fileOf(pa.struct([("a", pa.list_(pa.list_(pa.int64())))]), "R")
    with pytest.raises(TwoPhaseConfigError, match="not a Protobuf message name"):
        protobufs.fileOf(pa.int64(), "com.x-y.R")
    proto = base64.b64encode(b'syntax = "proto3"; message R { int64 id = 1; }').decode()
    for text in ('syntax = "proto3"; message R { int64 id = 1; }', proto):
        with pytest.raises(TwoPhaseConfigError, match="cannot be read without protoc"):
            protobufs.fileFromText(text, "option value.schema")


def test_message_indexes_of_a_later_message_round_trip() -> None:
    assert protobufs.indexBytes(0) == b"\x00"
    raw = b"\x00\x00\x00\x00\x01" + protobufs.indexBytes(3) + b"rest"
    assert protobufs.readIndexes(raw, 5) == ([3], len(raw) - 4)


def test_maps_are_written_in_key_order_so_a_replay_writes_the_same_bytes() -> None:
    kind = pa.map_(pa.string(), pa.int32())
    text, cls = derived(pa.struct([("m", kind)]))
    one = pa.array([{"m": [("b", 2), ("a", 1), ("c", 3)]}], pa.struct([("m", kind)]))
    other = pa.array([{"m": [("c", 3), ("a", 1), ("b", 2)]}], pa.struct([("m", kind)]))
    first, second = encoder(text).encode(one)[0][0], encoder(text).encode(other)[0][0]
    assert first == second
    assert cls.FromString(first.as_py()[6:]).m == {"a": 1, "b": 2, "c": 3}


def test_maps_and_arrays_of_structs_and_nested_names_that_would_clash() -> None:
    kind = pa.struct([
        ("m", pa.map_(pa.string(), pa.struct([("a", pa.int64())]))),
        ("l", pa.list_(pa.struct([("b", pa.string())]))),
        ("my_field", pa.struct([("x", pa.int32())])), ("My_field", pa.struct([("y", pa.int32())])),
    ])  # fmt: skip
    text, cls = derived(kind)
    row = {"m": [("k", {"a": 1})], "l": [{"b": "z"}], "my_field": {"x": 1}, "My_field": {"y": 2}}
    out, failed = encoder(text).encode(pa.array([row], kind))
    assert failed == {}
    message = cls.FromString(out[0].as_py()[6:])
    assert (message.m["k"].a, message.l[0].b, message.my_field.x, message.My_field.y) == (
        1, "z", 1, 2,
    )  # fmt: skip
    clash = pa.struct([("my_field", pa.int32()), ("myField", pa.int32())])
    with pytest.raises(TwoPhaseConfigError, match=r"duplicate json_name.*Rename the columns"):
        derived(clash)


def test_timestamps_are_the_same_bytes_as_from_datetimes_before_and_after_1970() -> None:
    kind = pa.struct([("at", pa.timestamp("us", "UTC")), ("n", pa.int64())])
    moments = [
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
        dt.datetime(1900, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC),
        dt.datetime(2024, 2, 29, 12, 0, 0, 500000, tzinfo=dt.UTC),
        None,
    ]
    text, cls = derived(kind)
    out, failed = encoder(text).encode(pa.array([{"at": m, "n": 1} for m in moments], kind))
    assert failed == {}
    for framed, moment in zip(out.to_pylist(), moments, strict=True):
        assert framed[6:] == cls(at=moment, n=1).SerializeToString(deterministic=True)
    alone, _ = encoder(derived(kind.field("at").type)[0]).encode(pa.array(moments, kind[0].type))
    assert alone.to_pylist()[3] is None and alone.to_pylist()[0] is not None
