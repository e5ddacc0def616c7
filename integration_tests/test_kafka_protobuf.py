"""twophase.kafka with Protobuf records through the real schema registry of ``make services``:
the sink's records read back by confluent-kafka's own ProtobufDeserializer, and records of
confluent-kafka's own ProtobufSerializer read by the source.

One Spark session for the module (no crash here); each test writes its own topic and subject.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from integration_tests.spark_processes import sharedSession
from integration_tests.test_kafka_formats import decoded, expected, rows, runOnce
from integration_tests.test_kafka_helpers import createTopic, readTopic

pytestmark = pytest.mark.timeout(600)
F = descriptor_pb2.FieldDescriptorProto


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from sharedSession("twophase-kafka-protobuf")


def messageClass(text: str, name: str) -> Any:
    """What a Python consumer does with the registry's schema: the class of message ``name``."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text)))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def readSource(
    spark: Any, bootstrap: str, url: str, topic: str, tmp: Path, name: str, **extra: str
) -> Any:
    query = (
        decoded(spark, bootstrap, url, topic, "protobuf", **extra)
        .selectExpr("key", "value.*")
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp / f"read-{name}"))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return spark.sql(f"SELECT * FROM {name}")


def test_protobuf_records_of_the_rows_columns_through_confluents_deserializer_and_back(
    spark: Any, kafka_bootstrap: str, schema_registry_url: str, tmp_path: Path
) -> None:
    """No ``value`` column: the row's other columns are one message, derived and registered
    under ``<topic>-value``; confluent-kafka reads the records with the registry's schema,
    and the source reads them back into the same columns."""
    topic = createTopic(kafka_bootstrap, partitions=2)
    options = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "topic": topic,
        "value.format": "protobuf",
        "value.record.name": "it.twophase.Order",
        "schema.registry.url": schema_registry_url,
    }
    runOnce(rows(spark, tmp_path, 20), tmp_path, options)
    client = SchemaRegistryClient({"url": schema_registry_url})
    latest = client.get_latest_version(f"{topic}-value")
    assert latest.schema.schema_type == "PROTOBUF"
    cls = messageClass(latest.schema.schema_str, "it.twophase.Order")
    deserializer = ProtobufDeserializer(cls, {"use.deprecated.format": False})
    context = SerializationContext(topic, MessageField.VALUE)
    records = sorted(readTopic(kafka_bootstrap, topic), key=lambda r: int(r.key))
    assert {int.from_bytes(r.value[1:5], "big") for r in records} == {latest.schema_id}
    got = [deserializer(r.value, context) for r in records]
    want = expected(20)
    assert [(m.id, m.payload, m.amount, list(m.tags), dict(m.attrs)) for m in got] == [
        (w["id"], w["payload"], w["amount"], w["tags"], w["attrs"]) for w in want
    ]
    assert [m.at.ToDatetime(tzinfo=dt.UTC) for m in got] == [w["at"] for w in want]

    back = readSource(spark, kafka_bootstrap, schema_registry_url, topic, tmp_path, "orders")
    assert back.columns == ["key", "id", "payload", "amount", "at", "tags", "attrs"]
    read = sorted((r.asDict() for r in back.collect()), key=lambda r: r["id"])
    assert [(r["id"], r["payload"], r["tags"], r["attrs"]) for r in read] == [
        (w["id"], w["payload"], w["tags"], w["attrs"]) for w in want
    ]


def test_the_source_reads_what_confluents_protobuf_serializer_wrote(
    spark: Any, kafka_bootstrap: str, schema_registry_url: str, tmp_path: Path
) -> None:
    """A producer's own message (an enum, another message, a Timestamp, a repeated message):
    the source's columns follow the registered schema; unset optional fields are null. With
    several messages in the file, ``value.record.name`` names the records' one."""
    file = descriptor_pb2.FileDescriptorProto(
        name="it/shop.proto", package="it.shop", syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )  # fmt: skip
    status = file.enum_type.add(name="Status")
    for number, name in enumerate(["NEW", "PAID", "SHIPPED"]):
        status.value.add(name=name, number=number)
    line = file.message_type.add(name="Line")
    line.field.add(name="sku", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    line.field.add(name="qty", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    order = file.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    order.field.add(name="status", number=2, type=F.TYPE_ENUM, type_name=".it.shop.Status",
                    label=F.LABEL_OPTIONAL)  # fmt: skip
    order.field.add(name="placed", number=3, type=F.TYPE_MESSAGE,
                    type_name=".google.protobuf.Timestamp", label=F.LABEL_OPTIONAL)  # fmt: skip
    order.field.add(name="lines", number=4, type=F.TYPE_MESSAGE, type_name=".it.shop.Line",
                    label=F.LABEL_REPEATED)  # fmt: skip
    order.field.add(name="note", number=5, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL,
                    proto3_optional=True, oneof_index=0)  # fmt: skip
    order.oneof_decl.add(name="_note")
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("it.shop.Order"))
    topic = createTopic(kafka_bootstrap)
    client = SchemaRegistryClient({"url": schema_registry_url})
    serializer = ProtobufSerializer(cls, client, {"use.deprecated.format": False})
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    placed = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    for i in range(3):
        message = cls(id=i, status=i, placed=placed, lines=[{"sku": f"s{i}", "qty": i + 1}])
        if i == 1:
            message.note = "gift"
        value = serializer(message, SerializationContext(topic, MessageField.VALUE))
        producer.produce(topic, key=str(i).encode(), value=value)
    assert producer.flush(30) == 0

    with pytest.raises(Exception, match=r"several messages \(it.shop.Line, it.shop.Order\).*"
                       r"value.record.name"):  # fmt: skip
        readSource(spark, kafka_bootstrap, schema_registry_url, topic, tmp_path, "unnamed")
    name = {"value.record.name": "it.shop.Order"}
    frame = readSource(spark, kafka_bootstrap, schema_registry_url, topic, tmp_path, "shop", **name)
    assert frame.columns == ["key", "id", "status", "placed", "lines", "note"]
    got = sorted((r.asDict(recursive=True) for r in frame.collect()), key=lambda r: r["id"])
    assert [(r["id"], r["status"], r["note"]) for r in got] == [
        (0, "NEW", None), (1, "PAID", "gift"), (2, "SHIPPED", None),
    ]  # fmt: skip
    assert got[2]["lines"] == [{"sku": "s2", "qty": 3}]
    assert got[0]["placed"].astimezone(dt.UTC) == placed
