"""twophase.kafka writing Avro and JSON Schema records through the real schema registry of
``make services``, read back with confluent-kafka's own deserializers.

One Spark session for the module (no crash here); each test writes its own topic and subject.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration_tests.conftest import ServiceControl, callsDuringAFreeze
from integration_tests.docs_blocks import runQueryFragment
from integration_tests.spark_processes import sharedSession
from integration_tests.test_kafka_helpers import createTopic, readTopic, unique

pytestmark = pytest.mark.timeout(600)

SECRET = "reg-user:Tw0phase-Registry-S3cret"


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from sharedSession("twophase-kafka-formats")


def rows(spark: Any, tmp: Path, count: int = 50) -> Any:
    """A stream of ``count`` rows of several Spark types, read once (availableNow)."""
    source = tmp / "source"
    spark.range(count).selectExpr(
        "CAST(id AS STRING) AS key",
        "id",
        "concat('payload-', id) AS payload",
        "CAST(id AS DOUBLE) / 4 AS amount",
        "timestamp_micros(1700000000000000 + id) AS at",
        "array(concat('t', id), 'x') AS tags",
        "map('n', CAST(id AS INT)) AS attrs",
    ).coalesce(2).write.parquet(str(source))
    return spark.readStream.schema(spark.read.parquet(str(source)).schema).parquet(str(source))


def runOnce(frame: Any, tmp: Path, options: dict[str, str], name: str = "q") -> None:
    import twophase

    checkpoint = str(tmp / f"checkpoint-{name}")
    query = (
        frame.writeStream.foreachBatch(
            twophase.foreachBatch("twophase.kafka", {**options, "checkpointLocation": checkpoint})
        )
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def expected(count: int) -> list[dict[str, Any]]:
    base = dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)
    return [
        {
            "id": i,
            "payload": f"payload-{i}",
            "amount": i / 4,
            "at": base + dt.timedelta(microseconds=i),
            "tags": [f"t{i}", "x"],
            "attrs": {"n": i},
        }
        for i in range(count)
    ]


def deserialized(bootstrap: str, topic: str, url: str, kind: str) -> list[tuple[str, Any, int]]:
    """Every committed record's key, value (by confluent-kafka's own deserializer) and the
    schema id in its header."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": url})
    if kind == "avro":
        deserializer: Any = AvroDeserializer(client)
    else:
        deserializer = JSONDeserializer(None, schema_registry_client=client)
    out = []
    for record in readTopic(bootstrap, topic):
        context = SerializationContext(topic, MessageField.VALUE)
        value = deserializer(record.value, context)
        out.append((record.key.decode(), value, int.from_bytes(record.value[1:5], "big")))
    return sorted(out, key=lambda r: int(r[0]))


def test_avro_records_of_the_rows_columns_read_back_with_confluents_deserializer(
    spark: Any, kafka_bootstrap: str, schema_registry_url: str, tmp_path: Path
) -> None:
    """No ``value`` column: the row's other columns are the Avro record, its schema derived
    and registered under ``<topic>-value``; a second query reuses the same schema id."""
    topic = createTopic(kafka_bootstrap, partitions=2)
    options = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "topic": topic,
        "value.format": "avro",
        "value.record.name": "it.twophase.Order",
        "schema.registry.url": schema_registry_url,
    }
    runOnce(rows(spark, tmp_path), tmp_path, options)
    got = deserialized(kafka_bootstrap, topic, schema_registry_url, "avro")
    assert [g[0] for g in got] == [str(i) for i in range(50)]
    assert [g[1] for g in got] == expected(50)
    ids = {g[2] for g in got}
    assert len(ids) == 1
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient({"url": schema_registry_url})
    latest = client.get_latest_version(f"{topic}-value")
    assert latest.schema_id in ids and json.loads(latest.schema.schema_str)["name"] == "Order"
    runOnce(rows(spark, tmp_path / "again", 3), tmp_path, options, name="again")
    again = deserialized(kafka_bootstrap, topic, schema_registry_url, "avro")
    assert {g[2] for g in again} == ids
    assert client.get_versions(f"{topic}-value") == [latest.version]


def test_json_schema_records_of_a_value_struct_through_the_data_source_and_back(
    spark: Any, kafka_bootstrap: str, schema_registry_url: str, tmp_path: Path
) -> None:
    topic = createTopic(kafka_bootstrap)
    frame = rows(spark, tmp_path, 10).selectExpr("key", "struct(id, payload, tags) AS value")
    query = (
        frame.writeStream.format("twophase.kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("topic", topic)
        .option("value.format", "jsonschema")
        .option("schema.registry.url", schema_registry_url)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    got = deserialized(kafka_bootstrap, topic, schema_registry_url, "jsonschema")
    want = [{"id": i, "payload": f"payload-{i}", "tags": [f"t{i}", "x"]} for i in range(10)]
    assert [g[1] for g in got] == want
    back = (
        decoded(spark, kafka_bootstrap, schema_registry_url, topic, "jsonschema")
        .selectExpr("value.*")
        .writeStream.format("memory")
        .queryName("json_back")
        .option("checkpointLocation", str(tmp_path / "read"))
        .start()
    )
    try:
        back.processAllAvailable()
    finally:
        back.stop()
    read = spark.sql("SELECT id, payload, tags FROM json_back ORDER BY id").collect()
    assert [r.asDict() for r in read] == want


def test_a_given_schema_the_rows_do_not_fit_fails_before_any_record(
    spark: Any, kafka_bootstrap: str, schema_registry_url: str, tmp_path: Path
) -> None:
    topic = createTopic(kafka_bootstrap)
    schema = {
        "type": "record",
        "name": "Narrow",
        "fields": [{"name": "id", "type": "int"}, {"name": "payload", "type": "string"}],
    }
    frame = rows(spark, tmp_path, 5).selectExpr("key", "struct(id, payload) AS value")
    options = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "topic": topic,
        "value.format": "avro",
        "value.schema": json.dumps(schema),
        "schema.registry.url": schema_registry_url,
    }
    with pytest.raises(Exception, match=r"Avro int cannot hold int64"):
        runOnce(frame, tmp_path, options)
    assert readTopic(kafka_bootstrap, topic, isolation="read_uncommitted") == []


def test_a_given_primitive_avro_schema_is_used_as_given(
    spark: Any, kafka_bootstrap: str, schema_registry_url: str, tmp_path: Path
) -> None:
    """``value.schema='"long"'``: no record, so no record name; the subject is the topic's."""
    topic = createTopic(kafka_bootstrap)
    frame = rows(spark, tmp_path, 4).selectExpr("key", "id AS value")
    options = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "topic": topic,
        "value.format": "avro",
        "value.schema": '"long"',
        "schema.registry.url": schema_registry_url,
    }
    runOnce(frame, tmp_path, options)
    got = deserialized(kafka_bootstrap, topic, schema_registry_url, "avro")
    assert [g[1] for g in got] == [0, 1, 2, 3]


def test_rows_the_schema_refuses_go_to_the_dead_letter_topic_in_the_same_decision(
    spark: Any, kafka_bootstrap: str, schema_registry_url: str, tmp_path: Path
) -> None:
    topic, dead = createTopic(kafka_bootstrap), createTopic(kafka_bootstrap, prefix="it-dead")
    schema = {
        "type": "record",
        "name": "Strict",
        "fields": [{"name": "id", "type": "long"}, {"name": "payload", "type": "string"}],
    }
    frame = rows(spark, tmp_path, 6).selectExpr(
        "key", "struct(id, IF(id % 3 = 0, NULL, payload) AS payload) AS value"
    )
    options = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "topic": topic,
        "value.format": "avro",
        "value.schema": json.dumps(schema),
        "schema.registry.url": schema_registry_url,
    }
    with pytest.raises(Exception, match=r"cannot be serialized: the value as avro"):
        runOnce(frame, tmp_path, options, name="fail")
    assert readTopic(kafka_bootstrap, topic, isolation="read_committed") == []
    runOnce(frame, tmp_path, {**options, "badRecords": dead}, name="aside")
    kept = deserialized(kafka_bootstrap, topic, schema_registry_url, "avro")
    assert [g[0] for g in kept] == ["1", "2", "4", "5"]
    letters = readTopic(kafka_bootstrap, dead)
    assert sorted(r.key.decode() for r in letters) == ["0", "3"]
    for letter in letters:
        headers = dict(letter.headers)
        assert headers["twophase.error.reason"] == b"unserializable"
        assert json.loads(letter.value)["payload"] is None


def test_registry_credentials_never_reach_the_checkpoint_or_the_logs(
    spark: Any,
    kafka_bootstrap: str,
    schema_registry_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = createTopic(kafka_bootstrap)
    options = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "topic": topic,
        "value.format": "avro",
        "schema.registry.url": schema_registry_url,
        "schema.registry.basic.auth.user.info": SECRET,
    }
    caplog.set_level("DEBUG")
    runOnce(rows(spark, tmp_path, 4), tmp_path, options)
    assert len(deserialized(kafka_bootstrap, topic, schema_registry_url, "avro")) == 4
    password = SECRET.split(":", 1)[1]
    for path in (tmp_path / "checkpoint-q").rglob("*"):
        if path.is_file():
            assert password.encode() not in path.read_bytes(), path
    assert password not in caplog.text


def test_a_schema_not_registered_without_auto_register_is_a_clear_error(
    spark: Any, kafka_bootstrap: str, schema_registry_url: str, tmp_path: Path
) -> None:
    topic = unique("it-unregistered")
    options = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "topic": topic,
        "value.format": "avro",
        "auto.register.schemas": "false",
        "schema.registry.url": schema_registry_url,
    }
    with pytest.raises(Exception, match=r"not registered under subject .*auto.register.schemas"):
        runOnce(rows(spark, tmp_path, 2), tmp_path, options)


def test_a_registry_that_does_not_answer_fails_the_query_on_the_driver_in_bounded_time(
    spark: Any,
    kafka_bootstrap: str,
    schema_registry_url: str,
    registry_server: ServiceControl,
    tmp_path: Path,
) -> None:
    """The registry frozen (SIGSTOP: connections accepted, never answered): the client's default
    has no time limit, the sink's does (10 s a request); nothing reaches the topic."""
    topic = createTopic(kafka_bootstrap)
    options = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "topic": topic,
        "value.format": "avro",
        "value.record.name": "it.twophase.Frozen",
        "schema.registry.url": schema_registry_url,
        "schema.registry.max.retries": "0",
    }
    outcomes = callsDuringAFreeze(
        registry_server, {"query": lambda: runOnce(rows(spark, tmp_path, 3), tmp_path, options)}, 90
    )
    assert "query" in outcomes, "the query was still blocked on the frozen registry after 90 s"
    error, seconds = outcomes["query"]
    assert error is not None and "the registry did not answer" in str(error)
    assert seconds < 40
    assert readTopic(kafka_bootstrap, topic, isolation="read_uncommitted") == []


def test_the_documented_pipeline_reads_avro_and_writes_avro_exactly_once(
    spark: Any, kafka_bootstrap: str, schema_registry_url: str, tmp_path: Path
) -> None:
    """docs/kafka.md, "Avro, JSON Schema and Protobuf with a schema registry": its example,
    with this machine's addresses, fed by confluent-kafka's own Avro serializer."""
    import decimal
    import re

    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    text = (Path(__file__).resolve().parents[1] / "docs" / "kafka.md").read_text()
    section = text.split("### Avro, JSON Schema and Protobuf with a schema registry", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]
    source, target = createTopic(kafka_bootstrap, 2, "it-orders"), unique("it-gross")
    replaced = (
        code.replace('"broker:9092"', repr(kafka_bootstrap))
        .replace('"http://registry:8081"', repr(schema_registry_url))
        .replace('"orders"', repr(source))
        .replace('"orders-gross"', repr(target))
        .replace('"/checkpoints/orders-gross"', repr(str(tmp_path / "checkpoint")))
    )
    assert replaced.count(repr(target)) == 1 and source in replaced, "update this test"
    schema = {
        "type": "record",
        "name": "Order",
        "namespace": "com.example",
        "fields": [
            {"name": "order_id", "type": "long"},
            {"name": "customer", "type": "string"},
            {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                        "precision": 10, "scale": 2}},
        ],
    }  # fmt: skip
    client = SchemaRegistryClient({"url": schema_registry_url})
    serializer = AvroSerializer(client, json.dumps(schema))
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(30):
        order = {"order_id": i, "customer": f"c{i % 3}", "amount": decimal.Decimal(f"{i}.50")}
        value = serializer(order, SerializationContext(source, MessageField.VALUE))
        producer.produce(source, key=str(i).encode(), value=value)
    producer.flush(30)
    runQueryFragment(spark, replaced)
    got = deserialized(kafka_bootstrap, target, schema_registry_url, "avro")
    assert [g[1]["order_id"] for g in got] == list(range(30))
    assert got[3][1] == {"order_id": 3, "customer": "c0", "gross": decimal.Decimal("4.20")}


def _produceAvro(
    bootstrap: str, url: str, topic: str, schema: dict[str, Any], rows: list[Any]
) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(schema))
    producer = Producer({"bootstrap.servers": bootstrap})
    for row in rows:
        producer.produce(
            topic, value=serializer(row, SerializationContext(topic, MessageField.VALUE))
        )
    producer.flush(30)


def decoded(spark: Any, bootstrap: str, url: str, topic: str, fmt: str, **extra: str) -> Any:
    """The twophase.kafka source over ``topic`` from its start, values decoded from ``fmt``."""
    reader = (
        spark.readStream.format("twophase.kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("value.format", fmt)
        .option("schema.registry.url", url)
    )
    for key, value in extra.items():
        reader = reader.option(key, value)
    return reader.load()


def test_avro_keys_and_values_written_and_read_back_into_columns(
    spark: Any, kafka_bootstrap: str, schema_registry_url: str, tmp_path: Path
) -> None:
    """key.format and value.format both avro: subjects <topic>-key and <topic>-value on the
    sink; on the source the key column is the key's type and the value a struct."""
    topic = createTopic(kafka_bootstrap)
    frame = rows(spark, tmp_path, 6).selectExpr("id AS key", "struct(id, payload) AS value")
    formats = {"key.format": "avro", "value.format": "avro"}
    runOnce(frame, tmp_path, {"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic,
                              "schema.registry.url": schema_registry_url, **formats})  # fmt: skip
    query = (
        decoded(
            spark, kafka_bootstrap, schema_registry_url, topic, "avro", **{"key.format": "avro"}
        )
        .selectExpr("key", "value.payload")
        .writeStream.format("memory")
        .queryName("avro_keys")
        .option("checkpointLocation", str(tmp_path / "read"))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    read = spark.sql("SELECT key, payload FROM avro_keys ORDER BY key").collect()
    assert [tuple(r) for r in read] == [(i, f"payload-{i}") for i in range(6)]
    assert dict(spark.table("avro_keys").dtypes)["key"] == "bigint"


V1 = {"type": "record", "name": "Event", "fields": [{"name": "id", "type": "long"}]}
V2 = {
    "type": "record",
    "name": "Event",
    "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": "string", "default": "-"}],
}


def test_a_schema_change_mid_stream_is_named_or_read_into_the_given_schema(
    spark: Any, kafka_bootstrap: str, schema_registry_url: str, tmp_path: Path
) -> None:
    topic = createTopic(kafka_bootstrap)
    _produceAvro(kafka_bootstrap, schema_registry_url, topic, V1, [{"id": 1}, {"id": 2}])

    def start(name: str, **extra: str) -> Any:
        reader = decoded(spark, kafka_bootstrap, schema_registry_url, topic, "avro", **extra)
        return (
            reader.selectExpr("value.*")
            .writeStream.format("memory")
            .queryName(name)
            .option("checkpointLocation", str(tmp_path / name))
            .start()
        )

    latest = start("latest_schema")
    given = start("given_schema", **{"value.schema": json.dumps(V2)})
    try:
        latest.processAllAvailable()
        given.processAllAvailable()
        assert spark.sql("SELECT id FROM latest_schema ORDER BY id").collect() == [(1,), (2,)]
        _produceAvro(kafka_bootstrap, schema_registry_url, topic, V2, [{"id": 3, "note": "new"}])
        given.processAllAvailable()
        rows = spark.sql("SELECT id, note FROM given_schema ORDER BY id").collect()
        assert [tuple(r) for r in rows] == [(1, "-"), (2, "-"), (3, "new")]
        with pytest.raises(Exception, match=rf"subject '{topic}-value' with its version 1"):
            latest.processAllAvailable()
    finally:
        latest.stop()
        given.stop()
