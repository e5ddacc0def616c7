"""``make bench-kafka``: the same rows into Kafka three ways, and back out two ways, in one run.

Writes (each into a fresh topic with ``--topic-partitions`` partitions):

(a) the ``twophase.kafka`` sink: exactly-once, one open transaction per task, ended by the
    driver with EndTxn;
(b) Spark's built-in Kafka sink (``format("kafka")``, at-least-once, the Java producer),
    resolved by its Maven coordinates through ``spark.jars.packages``;
(c) a raw confluent-kafka transactional producer outside Spark (one transaction per batch of
    rows, ``produce_batch``): what librdkafka alone does on this machine.

Reads: the ``twophase.kafka`` source against Spark's built-in Kafka source, both reading (a)'s
topic to Spark's ``noop`` sink.

And the floor of any Python sink: (f) the same query into a PySpark Python stream writer that
drops its input. Every micro-batch of a Python data source sink costs Spark a planning worker
and a commit worker on the driver and Arrow transfer to Python workers; (a) cannot be faster
than (f), so compare (a)/(b) with (f)/(b).

(a) and (b) run the same streaming query (``twophase.sequence`` -> ``key``, ``value`` of
``--value-bytes``; same batches and partitions, ``trigger(availableNow=True)``), each warmed up
first on a small run so JVM start-up, jar download and Python worker start are not counted.
Prints rows/s and ratios, then the driver commit time per batch of (a) (p50, p95) as
``twophase status --checkpoint`` reports it from the decision log.

Spark's Kafka connector is resolved by Maven coordinates, never a download URL. The one for the
installed PySpark (4.3.0) is not in Maven Central, nor is the 4.2.0 connector's own dependency
spark-token-provider-kafka-0-10_2.13 4.2.0 as this machine sees Central, so
``spark.jars.packages`` cannot resolve the connector with its dependencies. The bench therefore
asks Maven for the connector alone (``SPARK_KAFKA_CONNECTOR``, into
``$TWOPHASE_CACHE/spark-kafka/``; ``--spark-kafka-connector`` chooses others) and hands it to
Spark as ``spark.jars``, with the dependencies that work with it through ``spark.jars.packages``
(token provider 4.0.0, kafka-clients, commons-pool2; ``--spark-kafka-packages``). The 4.2.0
connector reads and writes on Spark 4.3. The coordinates are printed with the results.

Needs the broker: ``make services`` (TWOPHASE_KAFKA_BOOTSTRAP from the environment or
.services.env).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bench._common import (
    Result,
    bootstrapServers,
    commitLine,
    commitPercentiles,
    sequenceStream,
)
from bench.drop import DropSink

SPARK_KAFKA_CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
"""Spark's Kafka connector for (b), resolved alone by Maven (see the module's docstring)."""

SPARK_KAFKA_PACKAGES = ",".join(
    [
        "org.apache.spark:spark-token-provider-kafka-0-10_2.13:4.0.0",
        "org.apache.kafka:kafka-clients:3.9.2",
        "org.apache.commons:commons-pool2:2.13.1",
    ]
)
"""The connector's dependencies, through ``spark.jars.packages``."""


def sparkKafkaJar(coordinates: str = SPARK_KAFKA_CONNECTOR) -> str:
    """The connector jar of ``coordinates``, copied by Maven into the cache once; its path."""
    group, artifact, version = coordinates.split(":")
    cache = Path(os.environ.get("TWOPHASE_CACHE", Path.home() / ".cache" / "twophase"))
    jar = cache / "spark-kafka" / f"{artifact}-{version}.jar"
    if not jar.exists():
        subprocess.run(
            ["mvn", "-q", "dependency:copy", f"-Dartifact={group}:{artifact}:{version}:jar",
             f"-DoutputDirectory={jar.parent}"],
            check=True,
            cwd=cache,
        )  # fmt: skip
    return str(jar)


@dataclass(frozen=True)
class Shape:
    rows: int
    rowsPerBatch: int
    partitions: int
    valueBytes: int


def createTopic(bootstrap: str, partitions: int, tag: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"bench-kafka-{tag}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=60)
    return name


def deleteTopics(bootstrap: str, topics: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(topics).values():
        try:
            future.result(timeout=60)
        except Exception:  # best effort clean-up
            pass


def committedReader(bootstrap: str, topic: str, partitions: Iterable[int], **conf: Any) -> Any:
    """A ``read_committed`` consumer of its own group, assigned ``partitions`` of ``topic``
    from offset 0; ``conf`` adds consumer settings (dots written as underscores)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            **{key.replace("_", "."): value for key, value in conf.items()},
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    return consumer


def countRecords(bootstrap: str, topic: str) -> int:
    """Records a read_committed consumer sees: committed offsets minus transaction markers.

    Counted by reading, since markers take offsets too.
    """
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient

    partitions = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    parts = sorted(partitions.topics[topic].partitions)
    consumer = committedReader(bootstrap, topic, parts, enable_partition_eof=True)
    try:
        count, eof = 0, set[int]()
        while len(eof) < len(parts):
            for message in consumer.consume(10000, 5.0):
                error = message.error()
                if error is None:
                    count += 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    eof.add(int(message.partition() or 0))
        return count
    finally:
        consumer.close()


def stream(spark: Any, shape: Shape, rows: int | None = None) -> Any:
    return sequenceStream(
        spark,
        shape.rows if rows is None else rows,
        shape.rowsPerBatch if rows is None else rows,
        shape.partitions,
        "cast(id as string) AS key",
        f"rpad(payload, {shape.valueBytes}, '.') AS value",
    )


def runQuery(writer: Any) -> float:
    started = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    return time.perf_counter() - started


def writeKafka(
    spark: Any,
    fmt: str,
    bootstrap: str,
    topic: str,
    ckpt: str,
    shape: Shape,
    rows: int | None = None,
) -> float:
    """The bench query into a Kafka sink of format ``fmt`` (``twophase.kafka`` or ``kafka``)."""
    writer = (
        stream(spark, shape, rows)
        .writeStream.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .option("checkpointLocation", ckpt)
    )
    return runQuery(writer)


def writeDrop(spark: Any, ckpt: str, shape: Shape, rows: int | None = None) -> float:
    writer = stream(spark, shape, rows).writeStream.format(DropSink.name())
    return runQuery(writer.option("checkpointLocation", ckpt))


def readWith(spark: Any, fmt: str, bootstrap: str, topic: str, ckpt: str) -> tuple[int, float]:
    reader = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if fmt == "kafka":
        reader = reader.option("kafka.isolation.level", "read_committed")
    started = time.perf_counter()
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    rows = sum(int(p["numInputRows"]) for p in query.recentProgress)
    return rows, seconds


def writeRaw(bootstrap: str, topic: str, shape: Shape) -> float:
    """One transactional producer, a transaction per batch of rows, ``produce_batch``."""
    from confluent_kafka import Producer

    from twophase.sources.sequence import sequenceRows

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
            "partitioner": "murmur2_random",
        }
    )
    producer.init_transactions(60)
    started = time.perf_counter()
    for start in range(0, shape.rows, shape.rowsPerBatch):
        batch = sequenceRows(start, min(shape.rows, start + shape.rowsPerBatch))
        keys = pc.cast(batch.column("id"), pa.string()).to_pylist()
        values = pc.utf8_rpad(batch.column("payload"), shape.valueBytes, ".").to_pylist()
        producer.begin_transaction()
        messages = [{"key": k, "value": v} for k, v in zip(keys, values, strict=True)]
        for chunk in range(0, len(messages), 5000):
            pending = messages[chunk : chunk + 5000]
            while len(producer) + len(pending) > 100_000:
                producer.poll(0.005)
            producer.produce_batch(topic, pending)
            if any("_error" in m for m in pending):
                raise SystemExit("raw producer: queue full despite the check")
        producer.commit_transaction(120)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.kafka", description=__doc__)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--rows-per-batch", type=int, default=50_000)
    p.add_argument("--partitions", type=int, default=8, help="Spark partitions (tasks)")
    p.add_argument("--topic-partitions", type=int, default=8)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--master", default="local[*]")
    p.add_argument(
        "--spark-kafka-connector",
        default=SPARK_KAFKA_CONNECTOR,
        help="Maven coordinates of Spark's Kafka connector for (b)",
    )
    p.add_argument(
        "--spark-kafka-packages",
        default=SPARK_KAFKA_PACKAGES,
        help="Maven coordinates of the connector's dependencies",
    )
    p.add_argument(
        "--spark-jars-repositories",
        default=None,
        help="Maven repositories to resolve them from, besides Spark's defaults",
    )
    p.add_argument("--keep", action="store_true", help="keep topics and checkpoints")
    args = p.parse_args(argv)
    bootstrap = bootstrapServers()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")
    shape = Shape(args.rows, args.rows_per_batch, args.partitions, args.value_bytes)

    from pyspark.sql import SparkSession

    import twophase

    builder = (
        SparkSession.builder.master(args.master)
        .appName("twophase-bench-kafka")
        .config("spark.ui.enabled", "false")
        .config("spark.jars", sparkKafkaJar(args.spark_kafka_connector))
        .config("spark.jars.packages", args.spark_kafka_packages)
        .config("spark.sql.shuffle.partitions", str(args.partitions))
    )
    if args.spark_jars_repositories:
        builder = builder.config("spark.jars.repositories", args.spark_jars_repositories)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    twophase.register(spark)
    spark.dataSource.register(DropSink)
    work = Path(tempfile.mkdtemp(prefix="twophase-bench-kafka-"))
    topics = {
        key: createTopic(bootstrap, args.topic_partitions, key)
        for key in ("a", "b", "c", "warm-a", "warm-b")
    }
    try:
        warm = max(args.partitions * 1000, 10_000)
        print(f"warming up (twophase.kafka and Spark's kafka, {warm:,} rows each)...", flush=True)
        writeKafka(
            spark, "twophase.kafka", bootstrap, topics["warm-a"], str(work / "warm-a"), shape, warm
        )
        writeKafka(spark, "kafka", bootstrap, topics["warm-b"], str(work / "warm-b"), shape, warm)
        writeDrop(spark, str(work / "warm-f"), shape, warm)
        readWith(spark, "twophase.kafka", bootstrap, topics["warm-a"], str(work / "warm-ra"))
        readWith(spark, "kafka", bootstrap, topics["warm-a"], str(work / "warm-rb"))

        print(
            f"measuring: {args.rows:,} rows of ~{args.value_bytes} bytes, batches of "
            f"{args.rows_per_batch:,}, {args.partitions} Spark partitions, "
            f"{args.topic_partitions} topic partitions, master {args.master}",
            flush=True,
        )
        results: dict[str, Result] = {}
        seconds = writeKafka(spark, "kafka", bootstrap, topics["b"], str(work / "b"), shape)
        results["b"] = Result("(b) Spark kafka sink", args.rows, seconds)
        print(f"  {results['b'].name}: {seconds:.1f} s", flush=True)
        seconds = writeKafka(
            spark, "twophase.kafka", bootstrap, topics["a"], str(work / "a"), shape
        )
        results["a"] = Result("(a) twophase.kafka sink", args.rows, seconds)
        print(f"  {results['a'].name}: {seconds:.1f} s", flush=True)
        seconds = writeDrop(spark, str(work / "f"), shape)
        results["f"] = Result("(f) Python no-op sink (PySpark floor)", args.rows, seconds)
        print(f"  {results['f'].name}: {seconds:.1f} s", flush=True)
        seconds = writeRaw(bootstrap, topics["c"], shape)
        results["c"] = Result("(c) raw confluent-kafka producer", args.rows, seconds)
        print(f"  {results['c'].name}: {seconds:.1f} s", flush=True)
        for key in ("a", "b", "c"):
            written = countRecords(bootstrap, topics[key])
            if written < args.rows or (key != "b" and written != args.rows):
                raise SystemExit(f"{results[key].name} wrote {written:,} records, expected "
                                 f"{args.rows:,}")  # fmt: skip
        rows, seconds = readWith(spark, "twophase.kafka", bootstrap, topics["a"], str(work / "r1"))
        results["ra"] = Result("(d) twophase.kafka source", rows, seconds)
        rows, seconds = readWith(spark, "kafka", bootstrap, topics["a"], str(work / "r2"))
        results["rb"] = Result("(e) Spark kafka source", rows, seconds)
        for key in ("ra", "rb"):
            if results[key].rows != args.rows:
                raise SystemExit(f"{results[key].name} read {results[key].rows:,} rows")

        print()
        print(f"| {'':<38} | {'rows':>10} | {'seconds':>7} | {'rows/s':>10} |")
        print(f"| {'-' * 38} | {'-' * 10} | {'-' * 7} | {'-' * 10} |")
        for key in ("a", "b", "c", "f", "ra", "rb"):
            r = results[key]
            print(f"| {r.name:<38} | {r.rows:>10,} | {r.seconds:>7.1f} | {r.rate:>10,.0f} |")
        a, b, c = results["a"], results["b"], results["c"]
        print()
        print(f"(a) / (b) = {a.rate / b.rate:.2f}  (target >= 0.9)")
        print(f"(a) / (c) = {a.rate / c.rate:.2f}")
        print(f"(b) / (c) = {b.rate / c.rate:.2f}")
        print(f"(f) / (b) = {results['f'].rate / b.rate:.2f}  (no Python sink can beat this)")
        print(f"(a) / (f) = {a.rate / results['f'].rate:.2f}  (the Kafka sink's own cost)")
        print(f"(d) / (e) = {results['ra'].rate / results['rb'].rate:.2f}  (source)")
        print(
            f"Spark's Kafka connector: {args.spark_kafka_connector} with "
            f"{args.spark_kafka_packages} on PySpark {spark.version}"
        )
        p50, p95, batches = commitPercentiles(str(work / "a"))
        print(
            f"(a) driver commit time per batch, {args.partitions} partitions: p50 {p50:.0f} ms, "
            f"p95 {p95:.0f} ms over {batches} batches"
        )
        print(f"    twophase status --checkpoint: {commitLine(str(work / 'a'))}")
        return 0 if a.rate >= 0.9 * b.rate else 1
    finally:
        spark.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            deleteTopics(bootstrap, list(topics.values()))


if __name__ == "__main__":
    raise SystemExit(main())
