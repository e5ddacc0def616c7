"""The Kafka sink's pipelines: sequence -> twophase.kafka, and Kafka -> Kafka.

Tasks prepare Kafka transactions that the driver ends after the decision. ``kafka`` writes the
sequence (key = id, value = payload) with a short transaction timeout; ``kafka-kafka`` reads a
topic ``read_committed`` whose input holds aborted transactions between the committed ones,
and writes its key and value to another topic; one record in 97 is too large for the producer
(``TOO_LARGE_EVERY``) and goes to a dead-letter topic (option ``badRecords``) in the same
transactions. ``kafka-avro`` is ``kafka-kafka`` with Avro values in the schema registry's
wire format on both sides (the source decodes them, the sink registers its schema and encodes
them), its records compared by key and decoded value; beside that input, Spark's own Kafka
source reads a second one (one partition of plain values, ``read_committed``, aborted
transactions between the committed ones) into the same query and the same sink, so that both
sources are replayed under the same faults. The schedules kill the broker besides the driver
and the executors; records are counted by key and value, the dead letters by key.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from integration_tests.chaos.pipelines.base import Pipeline, need
from integration_tests.chaos.spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

    from integration_tests.chaos.servers import Services

KAFKA_TIMEOUT_MS = 15_000
"""The Kafka pipelines' (and the ``multi`` pipeline's Kafka target's)
``kafka.transaction.timeout.ms``: short, so an outage outlives it."""
BROKER_ABORT_SWEEP_SECONDS = 1
"""How often the test brokers abort the transactions past their timeout: their
``transaction.abort.timed.out.transaction.cleanup.interval.ms`` (services/settings.env and
docker-compose.yml set it to a second; the broker's default is ten)."""
PAST_TIMEOUT_SECONDS = KAFKA_TIMEOUT_MS / 1000 + BROKER_ABORT_SWEEP_SECONDS + 4
"""Past the transaction timeout and the broker's abort sweep, with a margin for a broker that
two busy cores run late: the ``multi`` pipeline's outage, after which the broker has aborted
the decided batch's transactions and the restart must write them again."""


def boundedKafka(prefix: str = "") -> dict[str, str]:
    """Sink options of a Kafka target under chaos (``prefix``: its name in ``multi``): the short
    transaction timeout, and bounds that end a call a partition or a lost reply holds in
    seconds rather than minutes."""
    return {
        f"{prefix}kafka.transaction.timeout.ms": str(KAFKA_TIMEOUT_MS),
        f"{prefix}kafka.socket.timeout.ms": "10000",
        f"{prefix}flushTimeoutSeconds": "30",
        f"{prefix}requestTimeoutSeconds": "10",
    }


TOO_LARGE_EVERY, TOO_LARGE_AT = 97, 13
"""``kafka-kafka``: records whose id is 13 modulo 97 are made too large for the producer."""
PRODUCER_MAX_BYTES = "4000"
"""``kafka-kafka``'s ``kafka.message.max.bytes``: a value repeated 800 times is over it."""

INPUT_TRANSACTION_ROWS = 250
"""Records per transaction when the Kafka -> Kafka input topic is filled."""


def newOutputTopic(spec: PipelineSpec, services: Services) -> None:
    """A fresh two-partition output topic on the broker of ``services``."""
    from integration_tests.test_kafka_helpers import createTopic

    spec.bootstrap = need(services.bootstrap, "Kafka")
    spec.outputTopic = createTopic(spec.bootstrap, partitions=2, prefix="chaos-out")


def fillInput(
    bootstrap: str,
    topic: str,
    rows: int,
    value: Callable[[int], bytes] | None = None,
    first: int = 0,
) -> None:
    """``rows`` committed records (key ``<id>``, value ``row-<id>`` or ``value(id)``, ids from
    ``first``) and, between them, aborted transactions a read_committed source must skip."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"chaos-fill-{uuid.uuid4().hex[:8]}"}
    )
    producer.init_transactions(60)
    for start in range(first, first + rows, INPUT_TRANSACTION_ROWS):
        if ((start - first) // INPUT_TRANSACTION_ROWS) % 4 == 1:
            producer.begin_transaction()
            for i in range(10):
                producer.produce(topic, b"aborted", key=b"aborted-%d" % i)
            producer.flush(30)  # an abort racing its AddPartitionsToTxn is fatal (librdkafka)
            producer.abort_transaction(60)
        producer.begin_transaction()
        for i in range(start, min(first + rows, start + INPUT_TRANSACTION_ROWS)):
            producer.produce(topic, value(i) if value else b"row-%d" % i, key=b"%d" % i)
        producer.commit_transaction(60)


class KafkaPipeline(Pipeline):
    """sequence -> twophase.kafka (key = id, value = payload) into a fresh topic."""

    name = "kafka"
    servers = ("broker",)
    columns = ("key", "value")
    kafkaTimeoutSeconds = KAFKA_TIMEOUT_MS / 1000

    def prepare(self, spec: PipelineSpec, services: Services) -> None:
        spec.sinkOptions.update(boundedKafka())
        newOutputTopic(spec, services)

    def source(self, spark: SparkSession, spec: PipelineSpec) -> DataFrame:
        """The sequence as the Kafka sink's ``key`` and ``value`` columns."""
        sequence = super().source(spark, spec)
        return sequence.selectExpr("cast(id as string) AS key", "payload AS value")

    def sink(self, stream: DataFrame, spec: PipelineSpec) -> DataStreamWriter:
        return (
            stream.writeStream.format("twophase.kafka")
            .option("kafka.bootstrap.servers", spec.bootstrap)
            .option("topic", spec.outputTopic)
        )

    def expected(self, spec: PipelineSpec) -> Any:
        from twophase import verify

        return verify.asKafkaRecords(super().expected(spec))

    def liveTopic(self, spec: PipelineSpec) -> str | None:
        return spec.outputTopic

    def actual(self, spec: PipelineSpec) -> Any:
        from twophase import verify

        return verify.actualFromKafka(
            {"kafka.bootstrap.servers": spec.bootstrap, "subscribe": spec.outputTopic}
        )


class KafkaKafkaPipeline(KafkaPipeline):
    """twophase.kafka source (read_committed) -> twophase.kafka sink, key and value."""

    name = "kafka-kafka"

    def prepare(self, spec: PipelineSpec, services: Services) -> None:
        from integration_tests.test_kafka_helpers import createTopic

        spec.sinkOptions.update(boundedKafka())
        newOutputTopic(spec, services)
        spec.inputTopic = createTopic(spec.bootstrap, partitions=2, prefix="chaos-in")
        self.fillTopic(spec)
        spec.sinkOptions["kafka.message.max.bytes"] = PRODUCER_MAX_BYTES
        spec.sinkOptions["badRecords"] = f"{spec.outputTopic}-dead"  # created by the sink

    def fillTopic(self, spec: PipelineSpec) -> None:
        """The input topic's records."""
        fillInput(spec.bootstrap, spec.inputTopic, spec.rows)

    def source(self, spark: SparkSession, spec: PipelineSpec) -> DataFrame:
        return (
            spark.readStream.format("twophase.kafka")
            .option("kafka.bootstrap.servers", spec.bootstrap)
            .option("subscribe", spec.inputTopic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", spec.rowsPerBatch)
            # a task per topic partition: two transactions a batch, so that the crash windows
            # between commits are reached
            .option("minRecordsPerPartition", "0")
            .options(**self.sourceOptions(spec))
            .load()
            .selectExpr("key", self.outputValue())
        )

    def sourceOptions(self, spec: PipelineSpec) -> dict[str, str]:
        """The source's options besides the topic's."""
        return {}

    def outputValue(self) -> str:
        """The output's value: the input's, one record in 97 made too large."""
        return (
            f"CASE WHEN pmod(CAST(CAST(key AS STRING) AS BIGINT), {TOO_LARGE_EVERY}) = "
            f"{TOO_LARGE_AT} THEN CAST(repeat(CAST(value AS STRING), 800) AS BINARY) "
            "ELSE value END AS value"
        )

    def offered(self, spec: PipelineSpec) -> Any:
        """The input topic's committed records (its aborted transactions are not offered)."""
        from twophase import verify

        return verify.expectedFromKafka(
            {"kafka.bootstrap.servers": spec.bootstrap, "subscribe": spec.inputTopic}
        )

    def tooLarge(self, table: Any) -> Any:
        """Which records of ``table`` (key, value) the query makes too large."""
        import pyarrow.compute as pc

        ids = pc.cast(pc.cast(table.column("key"), "string"), "int64")
        return pc.equal(pc.call_function("remainder", [ids, TOO_LARGE_EVERY]), TOO_LARGE_AT)

    def expected(self, spec: PipelineSpec) -> Any:
        """What the output topic must hold: every offered record but the ones set aside."""
        import pyarrow.compute as pc

        offered = self.offered(spec)
        return offered.filter(pc.invert(self.tooLarge(offered)))

    def verify(self, spec: PipelineSpec) -> Any:
        """The output topic against the offered records that fit, and the dead-letter topic
        against the ones that did not (by key: their values are cut), in one report."""
        from dataclasses import replace

        from twophase import verify

        main = super().verify(spec)
        offered = self.offered(spec)
        dead = verify.actualFromKafka(
            {
                "kafka.bootstrap.servers": spec.bootstrap,
                "subscribe": spec.sinkOptions["badRecords"],
            }
        )
        aside = verify.compare(offered.filter(self.tooLarge(offered)), dead, ("key",))
        assert aside.expectedRows > 0, "no record was made too large: nothing was set aside"
        return replace(
            main,
            sink=(f"{main.sink}; " if main.sink else "")
            + f"dead-letter topic: {aside.expectedRows} set aside, {aside.actualRows} found",
            expectedRows=main.expectedRows + aside.expectedRows,
            actualRows=main.actualRows + aside.actualRows,
            missing=main.missing + aside.missing,
            duplicated=main.duplicated + aside.duplicated,
            unexpected=main.unexpected + aside.unexpected,
            missingExamples=main.missingExamples + aside.missingExamples,
            duplicatedExamples=main.duplicatedExamples + aside.duplicatedExamples,
            unexpectedExamples=main.unexpectedExamples + aside.unexpectedExamples,
        )


INPUT_SCHEMA = {
    "type": "record",
    "name": "Row",
    "namespace": "chaos",
    "fields": [{"name": "id", "type": "long"}, {"name": "payload", "type": "string"}],
}
"""``kafka-avro``'s input records (key ``<id>``, value ``{id, payload: "row-<id>"}``)."""


class KafkaAvroPipeline(KafkaKafkaPipeline):
    """twophase.kafka (Avro values, read_committed) and Spark's Kafka source (read_committed)
    -> twophase.kafka (Avro values)."""

    name = "kafka-avro"

    def prepare(self, spec: PipelineSpec, services: Services) -> None:
        from integration_tests.conftest import service_setting
        from integration_tests.spark_processes import sparkKafkaConf
        from integration_tests.test_kafka_helpers import createTopic

        spec.registryUrl = need(service_setting("TWOPHASE_SCHEMA_REGISTRY_URL") or "", "registry")
        super().prepare(spec, services)
        spec.sinkOptions.update(
            {
                "value.format": "avro",
                "value.record.name": "chaos.Out",
                "schema.registry.url": spec.registryUrl,
            }
        )
        # one partition: with several, a replay after a restart may hand them to other tasks
        # (docs/kafka.md), and a loss of some of them then stops the query, by design
        spec.sparkInputTopic = createTopic(spec.bootstrap, partitions=1, prefix="chaos-spark-in")
        fillInput(spec.bootstrap, spec.sparkInputTopic, spec.rows, first=spec.rows)
        spec.sparkConf.update(sparkKafkaConf())

    def source(self, spark: SparkSession, spec: PipelineSpec) -> DataFrame:
        """twophase's source over the Avro input, and Spark's own over the plain one with its
        values made the same record: one query, both sources' offsets in its checkpoint."""
        plain = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", spec.bootstrap)
            .option("subscribe", spec.sparkInputTopic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", spec.rowsPerBatch)
            .option("kafka.isolation.level", "read_committed")
            .load()
            .selectExpr(
                "key",
                "named_struct('id', CAST(CAST(key AS STRING) AS BIGINT), "
                "'payload', CAST(value AS STRING)) AS value",
            )
            .selectExpr("key", self.outputValue())
        )
        return super().source(spark, spec).unionByName(plain)

    def fillTopic(self, spec: PipelineSpec) -> None:
        value = self.avroValue(spec.registryUrl, spec.inputTopic)
        fillInput(spec.bootstrap, spec.inputTopic, spec.rows, value)

    @staticmethod
    def avroValue(url: str, topic: str) -> Callable[[int], bytes]:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        serializer = AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(INPUT_SCHEMA))
        context = SerializationContext(topic, MessageField.VALUE)
        return lambda i: serializer({"id": i, "payload": f"row-{i}"}, context)

    def sourceOptions(self, spec: PipelineSpec) -> dict[str, str]:
        return {"value.format": "avro", "schema.registry.url": spec.registryUrl}

    def outputValue(self) -> str:
        return (
            "named_struct('id', value.id, 'payload', CASE WHEN pmod(value.id, "
            f"{TOO_LARGE_EVERY}) = {TOO_LARGE_AT} THEN repeat(value.payload, 800) "
            "ELSE value.payload END) AS value"
        )

    def offered(self, spec: PipelineSpec) -> Any:
        """Both inputs' committed records, each value as the JSON of the record it becomes."""
        import pyarrow as pa

        from twophase import verify

        avro = decodedValues(super().offered(spec), spec.registryUrl).select(["key", "value"])
        plain = verify.expectedFromKafka(
            {"kafka.bootstrap.servers": spec.bootstrap, "subscribe": spec.sparkInputTopic}
        )
        records = [
            json.dumps({"id": int(key), "payload": value.decode()}, sort_keys=True).encode()
            for key, value in zip(
                plain.column("key").to_pylist(), plain.column("value").to_pylist(), strict=True
            )
        ]
        return pa.concat_tables(
            [avro, pa.table({"key": plain.column("key"), "value": pa.array(records, pa.binary())})]
        )

    def actual(self, spec: PipelineSpec) -> Any:
        return decodedValues(super().actual(spec), spec.registryUrl)

    def liveSeen(self, spec: PipelineSpec, seen: Any) -> Any:
        return decodedValues(seen, spec.registryUrl)


def decodedValues(table: Any, url: str) -> Any:
    """``table`` (key, value in the registry's wire format) with each value as the sorted JSON
    of its decoded record: the same rows compare equal whatever schema id wrote them."""
    import io

    import fastavro
    import pyarrow as pa
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient({"url": url})
    schemas: dict[int, Any] = {}
    decoded = []
    for raw in table.column("value").to_pylist():
        if raw is None or len(raw) < 5:
            decoded.append(raw)
            continue
        schemaId = int.from_bytes(raw[1:5], "big")
        if schemaId not in schemas:
            text = client.get_schema(schemaId).schema_str
            schemas[schemaId] = fastavro.parse_schema(json.loads(str(text)))
        record = fastavro.schemaless_reader(io.BytesIO(raw[5:]), schemas[schemaId], None)
        decoded.append(json.dumps(record, sort_keys=True).encode())
    return table.set_column(
        table.schema.get_field_index("value"), "value", pa.array(decoded, pa.binary())
    )


KAFKA = KafkaPipeline()
KAFKA_KAFKA = KafkaKafkaPipeline()
KAFKA_AVRO = KafkaAvroPipeline()
