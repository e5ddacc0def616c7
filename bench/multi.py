"""``make bench-multi``: one query into PostgreSQL and Kafka at once, against two separate sinks.

The same rows (``twophase.sequence``: id, payload, an amount; same batches and partitions,
``trigger(availableNow=True)``) go

(a) into ``twophase.multi`` with a PostgreSQL target and a Kafka target: one query, one decision
    per batch, both systems or neither;
(b) into ``twophase.postgres`` and ``twophase.kafka`` as two separate queries, one after the
    other (what a pipeline without atomic dual writes runs): their seconds added;
(n) into Spark's ``noop`` sink: the engine's ceiling for the same query.

Each is warmed up first on a small run. Prints seconds and rows/s, then (a)/(b) (above 1: the
one query is faster than the two) and (a)/(n). Checks that every target holds every row.

Needs PostgreSQL and Kafka: ``make services`` (TWOPHASE_PG_URL and TWOPHASE_KAFKA_BOOTSTRAP from
the environment or .services.env).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench._common import Result, bootstrapServers, pgUrl, sequenceStream
from bench.postgres import countRows, dropTables

ORDERS = ["id AS order_id", "payload AS status", "double(id % 1000) AS amount"]


def orders(spark: Any, rows: int, per: int, parts: int) -> Any:
    return sequenceStream(spark, rows, per, parts, *ORDERS)


def createTopic(bootstrap: str, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"bench-multi-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def countRecords(bootstrap: str, topic: str) -> int:
    from twophase.verify import actualFromKafka

    return int(actualFromKafka({"kafka.bootstrap.servers": bootstrap, "topic": topic}).num_rows)


def timed(query: Any) -> float:
    started = time.perf_counter()
    query.awaitTermination()
    return time.perf_counter() - started


def runMulti(spark: Any, target: dict[str, str], ckpt: str, shape: tuple[int, int, int]) -> float:
    from pyspark.sql import functions as F

    df = orders(spark, *shape)
    out = df.select(
        F.struct("order_id", "status", "amount").alias("orders"),
        F.struct(
            F.col("order_id").cast("string").alias("key"), F.to_json(F.struct("*")).alias("value")
        ).alias("events"),
    )
    writer = (
        out.writeStream.format("twophase.multi")
        .option("targets", "orders=postgres,events=kafka")
        .option("orders.url", target["url"])
        .option("orders.table", target["table"])
        .option("orders.createTable", "true")
        .option("events.kafka.bootstrap.servers", target["bootstrap"])
        .option("events.topic", target["topic"])
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
    )
    started = time.perf_counter()
    writer.start().awaitTermination()
    return time.perf_counter() - started


def runSeparate(
    spark: Any, target: dict[str, str], ckpt: str, shape: tuple[int, int, int]
) -> float:
    from pyspark.sql import functions as F

    started = time.perf_counter()
    (
        orders(spark, *shape)
        .writeStream.format("twophase.postgres")
        .option("url", target["url"])
        .option("table", target["table"])
        .option("createTable", "true")
        .option("checkpointLocation", f"{ckpt}-postgres")
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    events = orders(spark, *shape).select(
        F.col("order_id").cast("string").alias("key"), F.to_json(F.struct("*")).alias("value")
    )
    (
        events.writeStream.format("twophase.kafka")
        .option("kafka.bootstrap.servers", target["bootstrap"])
        .option("topic", target["topic"])
        .option("checkpointLocation", f"{ckpt}-kafka")
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    return time.perf_counter() - started


def runNoop(spark: Any, ckpt: str, shape: tuple[int, int, int]) -> float:
    query = (
        orders(spark, *shape)
        .writeStream.format("noop")
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    return timed(query)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.multi", description=__doc__)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--rows-per-batch", type=int, default=125_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--master", default="local[*]")
    args = p.parse_args(argv)
    url, bootstrap = pgUrl(), bootstrapServers()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")

    from pyspark.sql import SparkSession

    import twophase

    spark = (
        SparkSession.builder.master(args.master)
        .appName("twophase-bench-multi")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    twophase.register(spark)
    work = Path(tempfile.mkdtemp(prefix="twophase-bench-multi-"))
    tables: list[str] = []

    def target(tag: str) -> dict[str, str]:
        table = f"bench_multi_{tag}_{uuid.uuid4().hex[:6]}"
        tables.append(table)
        topic = createTopic(bootstrap, args.partitions)
        return {"url": url, "table": table, "bootstrap": bootstrap, "topic": topic}

    try:
        warm = (max(args.partitions * 1000, 10_000),) * 2 + (args.partitions,)
        print(f"warming up ({warm[0]:,} rows each)...", flush=True)
        runMulti(spark, target("warm_a"), str(work / "warm_a"), warm)
        runSeparate(spark, target("warm_b"), str(work / "warm_b"), warm)
        runNoop(spark, str(work / "warm_n"), warm)

        shape = (args.rows, args.rows_per_batch, args.partitions)
        print(f"measuring: {args.rows:,} rows, batches of {args.rows_per_batch:,}, "
              f"{args.partitions} partitions, master {args.master}", flush=True)  # fmt: skip
        multi, separate = target("multi"), target("separate")
        results = {
            "multi": Result("(a) twophase.multi: PostgreSQL + Kafka", args.rows,
                            runMulti(spark, multi, str(work / "multi"), shape)),
            "separate": Result("(b) twophase.postgres, then twophase.kafka", args.rows,
                               runSeparate(spark, separate, str(work / "separate"), shape)),
            "noop": Result("(n) Spark's noop sink", args.rows,
                           runNoop(spark, str(work / "noop"), shape)),
        }  # fmt: skip
        for where in (multi, separate):
            rows, records = countRows(url, where["table"]), countRecords(bootstrap, where["topic"])
            if rows != args.rows or records != args.rows:
                raise SystemExit(
                    f"{where}: {rows:,} rows and {records:,} records, not {args.rows:,}"
                )
        a, b, n = results["multi"], results["separate"], results["noop"]
        print()
        print(f"| {'writer':<42} | {'rows':>10} | {'seconds':>7} | {'rows/s':>10} |")
        print(f"| {'-' * 42} | {'-' * 10} | {'-' * 7} | {'-' * 10} |")
        for r in (a, b, n):
            print(f"| {r.name:<42} | {r.rows:>10,} | {r.seconds:>7.1f} | {r.rate:>10,.0f} |")
        print()
        print(f"(a) / (b) = {a.rate / b.rate:.2f}  (above 1: one atomic query beats two sinks)")
        print(f"(a) / (n) = {a.rate / n.rate:.2f}")
        return 0
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
        dropTables(url, tables)


if __name__ == "__main__":
    raise SystemExit(main())
