"""``make bench-kafka-avro``: Avro records into Kafka, twophase.kafka against a pandas UDF that
serializes by hand before Spark's own Kafka sink, in alternated rounds of one run.

For each shape (a JVM ``rate-micro-batch`` source at 8 and 200 partitions by default; the
Python ``twophase.sequence`` source on request) the same event rows (a key, a long id, a
timestamp, two short strings, a double and a ``--detail-bytes`` string) go three ways, with one
write task per input partition, each run into a fresh topic:

(a) ``format("twophase.kafka")`` with ``value.format=avro``: the schema derived from the
    columns and registered once on the driver, the values encoded a column at a time
    (``twophase.schemaregistry.avrobulk``), exactly once;
(b) a pandas UDF that serializes each row with confluent-kafka's ``AvroSerializer`` (one per
    Python worker; the schema written by hand, equal to (a)'s) into a binary ``value`` column,
    then ``format("kafka")``, Spark's own sink (at least once);
(c) Spark's ``noop`` sink on the same query: the engine alone, the ceiling.

Rounds run (a), (b), (c), then (c), (b), (a), and so on, so warm-up and a busy moment of the
machine are not charged to one side. A run's rows/s is its rows over its micro-batches' times
(``triggerExecution``), the first batch left out. Printed per shape: rows/s of each path and
the ratios a/b and a/c per round and their medians, each path's batch time p50/p95/max. Then,
outside Spark on the same rows, µs per row of the UDF's ``to_dict("records")``,
``AvroSerializer``, fastavro's ``schemaless_writer`` and ``avrobulk.encode`` (the same bytes,
checked), of fastavro per field, and of twophase's JSON Schema and Protobuf encoders. Topics and
subjects are deleted at the end.

Needs the broker and the registry of ``make services`` (TWOPHASE_KAFKA_BOOTSTRAP and
TWOPHASE_SCHEMA_REGISTRY_URL); Spark's Kafka connector is resolved as ``bench.kafka`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from bench._common import fmtNumber, markdownTable, percentiles, serviceValue

RECORD_NAME = "bench.Event"
COLUMNS = (
    "CAST(id AS STRING) AS key",
    "id",
    "timestamp_micros(1700000000000000 + id * 1000) AS at",
    "concat('user-', id % 100000) AS user",
    "element_at(array('page_view', 'click', 'add_to_cart', 'purchase'), CAST(id % 4 AS INT) + 1)"
    " AS event",
    "CAST(id % 100000 AS DOUBLE) / 100 AS amount",
    "payload AS detail",
)
"""The event rows over the shape's ``id`` and ``payload`` (``row-<id>`` padded)."""


def _field(name: str, kind: Any) -> dict[str, Any]:
    return {"name": name, "type": ["null", kind], "default": None}


HAND_SCHEMA = {"type": "record", "name": "Event", "namespace": "bench", "fields": [
    _field("id", "long"), _field("at", {"type": "long", "logicalType": "timestamp-micros"}),
    _field("user", "string"), {"name": "event", "type": "string"}, _field("amount", "double"),
    _field("detail", "string"),
]}  # fmt: skip
"""(b)'s schema as a user writes it (Spark's streaming columns are nullable but ``event``)."""

PATHS = {"a": "(a) twophase.kafka avro", "b": "(b) pandas UDF + Spark kafka", "c": "(c) noop"}


@cache
def serializerFor(url: str, schema: str) -> Any:
    """One registry client and ``AvroSerializer`` per Python worker (this module is imported by
    reference in the workers, so the cache outlives a task)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer

    return AvroSerializer(SchemaRegistryClient({"url": url}), schema)


def avroUdf(url: str, schema: str, topic: str) -> Any:
    """(b)'s pandas UDF: a struct of the event's columns to one Avro value per row."""
    from pyspark.sql.functions import pandas_udf

    def toAvro(rows: pd.DataFrame) -> pd.Series:
        from confluent_kafka.serialization import MessageField, SerializationContext

        serialize = serializerFor(url, schema)
        ctx = SerializationContext(topic, MessageField.VALUE)
        return pd.Series([serialize(row, ctx) for row in rows.to_dict("records")])

    return pandas_udf(toAvro, "binary")


@dataclass
class PathRuns:
    """One path in one shape: rows/s per round and every batch time (the first left out)."""

    rates: list[float] = field(default_factory=list)
    batchSeconds: list[float] = field(default_factory=list)


def timed(writer: Any, batches: int, timeout: float = 600.0) -> tuple[int, list[float]]:
    """Run until ``batches`` micro-batches finished: rows and seconds of all but the first."""
    from bench.shapes import failureLine

    query = writer.trigger(processingTime="0 seconds").start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            done = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
            if len(done) >= batches or not query.isActive or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if query.exception() is not None:
            raise SystemExit(f"query failed: {failureLine(str(query.exception()))}")
        if len(done) < batches:
            raise SystemExit(f"only {len(done)} of {batches} micro-batches in {timeout:.0f} s")
    finally:
        query.stop()
    kept = done[1:batches]
    rows = sum(int(p["numInputRows"]) for p in kept)
    return rows, [p["durationMs"]["triggerExecution"] / 1000 for p in kept]


class Bench:
    """The session, the servers and what the run created (topics, subjects, checkpoints)."""

    def __init__(self, spark: Any, args: Any) -> None:
        self.spark, self.args = spark, args
        self.bootstrap = serviceValue("TWOPHASE_KAFKA_BOOTSTRAP")
        self.registry = serviceValue("TWOPHASE_SCHEMA_REGISTRY_URL")
        self.work = Path(tempfile.mkdtemp(prefix="twophase-bench-kafka-avro-"))
        self.topics: list[str] = []
        self.schema = json.dumps(HAND_SCHEMA)

    def frame(self, shape: Any) -> Any:
        from bench.shapes import source

        frame = source(self.spark, shape, self.args.batches, self.args.detail_bytes)
        return frame.selectExpr(*COLUMNS)

    def topic(self, tag: str) -> str:
        from bench.kafka import createTopic

        self.topics.append(createTopic(self.bootstrap, self.args.topic_partitions, tag))
        return self.topics[-1]

    def writer(self, path: str, frame: Any, label: str) -> tuple[Any, str | None]:
        """The path's ``writeStream`` with a checkpoint of its own, and its topic."""
        if path == "c":
            w, topic = frame.writeStream.format("noop"), None
        elif path == "a":
            topic = self.topic(f"avro-a-{label}")
            w = (
                frame.writeStream.format("twophase.kafka")
                .option("kafka.bootstrap.servers", self.bootstrap)
                .option("topic", topic)
                .option("value.format", "avro")
                .option("value.record.name", RECORD_NAME)
                .option("schema.registry.url", self.registry)
            )
        else:
            from pyspark.sql.functions import struct

            topic = self.topic(f"avro-b-{label}")
            values = [c for c in frame.columns if c != "key"]
            toAvro = avroUdf(self.registry, self.schema, topic)
            w = (
                frame.select("key", toAvro(struct(*values)).alias("value"))
                .writeStream.format("kafka")
                .option("kafka.bootstrap.servers", self.bootstrap)
                .option("topic", topic)
            )
        return w.option("checkpointLocation", str(self.work / f"{path}-{label}")), topic

    def round(self, shape: Any, r: int, runs: dict[str, PathRuns], batches: int) -> list[str]:
        """One round of the shape, the paths reversed in odd rounds; the last topics by path."""
        order = list(PATHS) if r % 2 == 0 else list(reversed(PATHS))
        label = f"{shape.source}{shape.partitions}-r{r}-{uuid.uuid4().hex[:4]}"
        topics = {}
        for path in order:
            writer, topics[path] = self.writer(path, self.frame(shape), label)
            rows, seconds = timed(writer, batches)
            runs[path].rates.append(rows / sum(seconds))
            runs[path].batchSeconds += seconds
        rates = ", ".join(f"{p} {runs[p].rates[-1]:,.0f} rows/s" for p in PATHS)
        print(f"  round {r + 1} ({''.join(order)}): {rates}", flush=True)
        return [topics["a"] or "", topics["b"] or ""]

    def agree(self, topicA: str, topicB: str) -> str:
        """Check that (a) and (b) wrote the same records: partition 0 of each, the same Avro
        bytes by key, and a sample decoded by confluent-kafka's AvroDeserializer."""
        from confluent_kafka import KafkaError
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        from bench.kafka import committedReader

        seen: list[dict[int, bytes]] = []
        for topic in (topicA, topicB):
            reader, got = committedReader(self.bootstrap, topic, [0], enable_partition_eof=True), {}
            try:
                while (m := reader.poll(10.0)) is not None:
                    if m.error() is None:
                        got[int(m.key())] = m.value()
                    elif m.error().code() == KafkaError._PARTITION_EOF:
                        break
            finally:
                reader.close()
            seen.append(got)
        common = sorted(seen[0].keys() & seen[1].keys())
        bad = [i for i in common if seen[0][i][5:] != seen[1][i][5:]]
        decode = AvroDeserializer(SchemaRegistryClient({"url": self.registry}))
        bad += [i for i in common[:200] for v in seen if decode(v[i], None)["id"] != i]
        if not common or bad:
            raise SystemExit(f"(a) and (b) differ: {len(common)} ids in both, {len(bad)} bad")
        return (
            f"(a) and (b) wrote the same records (the {len(common):,} ids both have in partition 0)"
        )

    def cleanup(self) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        from bench.kafka import deleteTopics

        shutil.rmtree(self.work, ignore_errors=True)
        if self.topics:
            deleteTopics(self.bootstrap, self.topics)
        client = SchemaRegistryClient({"url": self.registry})
        for topic in self.topics:
            for permanent in (False, True):
                try:
                    client.delete_subject(f"{topic}-value", permanent=permanent)
                except Exception:  # best effort: (c) registers nothing, Apicurio may refuse
                    pass


def measureShape(bench: Bench, shape: Any) -> dict[str, PathRuns]:
    args = bench.args
    print(f"\nmeasuring {shape.title}: {args.rounds} rounds of {args.batches} batches", flush=True)
    runs = {p: PathRuns() for p in PATHS}
    last: list[str] = []
    for r in range(args.rounds):
        last = bench.round(shape, r, runs, args.batches)
    print(f"  check: {bench.agree(*last)}", flush=True)
    header = ["round", *(f"{PATHS[p]} rows/s" for p in PATHS), "a/b", "a/c"]
    rows = []
    for r, (a, b, c) in enumerate(zip(*(runs[p].rates for p in PATHS), strict=True)):
        rows.append([str(r + 1), *map(fmtNumber, (a, b, c)), f"{a / b:.2f}", f"{a / c:.2f}"])
    medians = [fmtNumber(statistics.median(runs[p].rates)) for p in PATHS]
    rows.append(
        ["median", *medians, f"{median(runs, 'a', 'b'):.2f}", f"{median(runs, 'a', 'c'):.2f}"]
    )
    print("\n" + markdownTable(header, rows))
    header = ["path", "rows/s (median)", "batch p50 ms", "p95 ms", "max ms", "batches"]
    rows = []
    for (p, name), rate in zip(PATHS.items(), medians, strict=True):
        times = runs[p].batchSeconds
        rows.append([name, rate, *(f"{t * 1000:.0f}" for t in percentiles(times)), str(len(times))])
    print("\n" + markdownTable(header, rows), flush=True)
    return runs


def median(runs: dict[str, PathRuns], x: str, y: str) -> float:
    """The median of the per-round ratios of path ``x``'s rows/s over path ``y``'s."""
    return statistics.median(a / b for a, b in zip(runs[x].rates, runs[y].rates, strict=True))


def stopJvm(spark: Any) -> None:
    """Stop Spark and end its JVM, whose cached Kafka producers would create (b)'s topics
    again after they are deleted (the brokers of ``make services`` create topics on demand)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    proc = getattr(gateway, "proc", None)
    if gateway is not None and proc is not None:
        gateway.shutdown()
        proc.stdin.close()  # PySpark's JVM exits when its stdin ends
        proc.wait(60)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.kafka_avro", description=__doc__)
    p.add_argument("--rounds", type=int, default=4, help="rounds per shape (default 4)")
    p.add_argument("--batches", type=int, default=4, help="micro-batches per run (default 4)")
    p.add_argument(
        "--shapes",
        default="rate:8:100000,rate:200:20000",
        help="source:partitions:rows-per-batch, comma-separated (source rate or sequence)",
    )
    p.add_argument("--detail-bytes", type=int, default=200, help="the detail string's length")
    p.add_argument("--topic-partitions", type=int, default=8)
    p.add_argument("--micro-rows", type=int, default=50_000, help="rows of the serializer test")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--quick", action="store_true", help="2 rounds of 2 small batches")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.batches, args.micro_rows = 2, 2, 10_000
        args.shapes = "rate:8:20000,rate:200:4000"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")
    from bench.kafka import SPARK_KAFKA_CONNECTOR
    from bench.session import benchSession
    from bench.shapes import Shape

    shapes = []
    for spec in args.shapes.split(","):
        kind, partitions, rows = spec.split(":")
        shapes.append(Shape(kind, int(partitions), int(rows)))
    began, load = time.perf_counter(), os.getloadavg()
    spark = benchSession(args.master, 200)
    # Stopping a query cuts its running batch short: Spark logs the aborts, and the driver's
    # accumulator server a traceback per killed Python task. Neither is the bench's business.
    spark.sparkContext.setLogLevel("FATAL")
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = lambda request, address: None
    bench = Bench(spark, args)
    summary: list[tuple[str, dict[str, PathRuns]]] = []
    try:
        print(
            f"PySpark {spark.version}, master {args.master}, {os.cpu_count()} cores, "
            f"Spark's Kafka connector {SPARK_KAFKA_CONNECTOR}, {args.topic_partitions} topic "
            f"partitions; load average at the start {load[0]:.1f}, {load[1]:.1f}, "
            f"{load[2]:.1f}",
            flush=True,
        )
        print("warming up every path on a small shape", flush=True)
        warm = {p: PathRuns() for p in PATHS}
        bench.round(Shape("rate", 8, 5_000), 0, warm, 2)
        summary = [(shape.title, measureShape(bench, shape)) for shape in shapes]
        from bench.avro_costs import serializerCosts

        byHand = serializerCosts(bench, shapes[0], args.micro_rows)
        slots = spark.sparkContext.defaultParallelism
    finally:
        stopJvm(spark)
        bench.cleanup()
    load, rows = os.getloadavg(), []
    for title, runs in summary:
        coreUs = slots * 1e6 / statistics.median(runs["b"].rates)  # (b)'s task slots' µs per row
        rows.append([title, f"{median(runs, 'a', 'b'):.2f}", f"{median(runs, 'a', 'c'):.2f}",
                     f"{coreUs:.0f}", f"{byHand / coreUs:.0%}"])  # fmt: skip
    header = ["shape", "a/b (median of rounds)", "a/c", f"(b) µs/row of {slots} slots",
              "of which serializing by hand (outside-Spark µs/row)"]  # fmt: skip
    print("\n" + markdownTable(header, rows))
    print(
        f"\n{time.perf_counter() - began:.0f} s in all; load average at the end {load[0]:.1f}, "
        f"{load[1]:.1f}, {load[2]:.1f}"
    )
    return 0


if __name__ == "__main__":
    # Run as bench.kafka_avro rather than __main__, so that Spark's workers import (b)'s
    # serializer cache by reference and keep one serializer per worker.
    from bench.kafka_avro import main as _main

    raise SystemExit(_main())
