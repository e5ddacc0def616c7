"""``make bench-shapes``: what each sink costs per micro-batch at 8 and 200 partitions.

``make bench`` measures one shape (a Python source, 8 partitions, big batches), which hides what
a sink pays per task. Real pipelines have an aggregation, a join or a ``repartition`` before the
sink, so Spark's default 200 shuffle partitions, and a JVM source. For each shape below, one
Spark session runs the same query into:

- Spark's ``noop`` sink: the engine alone, the ceiling for any sink;
- ``bench.drop``: a Python data source that reads its input and drops it, the ceiling for any
  sink written in Python (PySpark's own cost per task: a worker round trip and Arrow);
- Spark's own path for the target: the Parquet file sink, the Kafka sink, JDBC in
  ``foreachBatch`` (PostgreSQL and MariaDB), the Parquet file sink on ``s3a://``;
- twophase: ``twophase.files`` (Parquet), ``twophase.kafka``, ``twophase.postgres``,
  ``twophase.sql`` (MariaDB XA), ``twophase.files`` on ``s3://`` (multipart uploads).

Each run is ``--batches`` micro-batches; the figure is the median wall time of the batches after
the first (Spark's ``triggerExecution``), so start-up is not counted. Ratios are Spark's own
path's time over twophase's (above 1: twophase is faster) and ``noop``'s over each path's.
A run that fails is reported with the first line of its error (for example PostgreSQL's
``max_prepared_transactions``). Writes ``bench/results/shapes.md`` and prints it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import kafka as kb
from bench import postgres as pb
from bench import s3 as s3b
from bench import sql as sqlb
from bench._common import REPO, bootstrapServers, markdownTable, pgUrl
from bench.bench import benchSession, log


@dataclass(frozen=True)
class Shape:
    """One query shape: the source, the tasks per micro-batch and the rows per micro-batch."""

    source: str
    partitions: int
    rowsPerBatch: int

    @property
    def title(self) -> str:
        kind = "JVM rate-micro-batch" if self.source == "rate" else "Python twophase.sequence"
        return f"{kind}, {self.partitions} partitions, {self.rowsPerBatch:,} rows per batch"


SHAPES = (
    Shape("rate", 8, 125_000),
    Shape("rate", 200, 20_000),
    Shape("sequence", 200, 20_000),
    Shape("rate", 1000, 20_000),
)
DEFAULT_SHAPES = "0,1,2"
"""What ``make bench-shapes`` measures; the 1,000-partition shape (3) is asked for by name."""
TARGETS = ("files", "kafka", "postgres", "sql", "s3")
SPARK_OWN = {
    "files": "Spark Parquet file sink",
    "kafka": "Spark Kafka sink",
    "postgres": "Spark JDBC in foreachBatch",
    "sql": "Spark JDBC (MariaDB) in foreachBatch",
    "s3": "Spark Parquet file sink on s3a",
}


@dataclass
class Run:
    """One query: seconds per micro-batch after the first, or why it failed."""

    secondsPerBatch: float = float("nan")
    error: str = ""

    def shown(self) -> str:
        return f"failed: {self.error}" if self.error else f"{self.secondsPerBatch:.2f} s"


def source(spark: Any, shape: Shape, batches: int, valueBytes: int) -> Any:
    """The shape's rows as ``id`` (long) and ``payload`` (``row-<id>`` padded)."""
    if shape.source == "rate":
        frame = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", shape.rowsPerBatch)
            .option("numPartitions", shape.partitions)
            .option("startTimestamp", 0)
            .load()
            .selectExpr("value AS id")
        )
    else:
        frame = (
            spark.readStream.format("twophase.sequence")
            .option("rowsPerBatch", shape.rowsPerBatch)
            .option("totalRows", shape.rowsPerBatch * batches)
            .option("numPartitions", shape.partitions)
            .load()
            .selectExpr("id")
        )
    return frame.selectExpr("id", f"rpad(concat('row-', id), {valueBytes}, '.') AS payload")


def runQuery(writer: Any, batches: int, timeout: float = 900.0) -> Run:
    """Run until ``batches`` micro-batches finished; the median time of all but the first."""
    query = writer.trigger(processingTime="0 seconds").start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            done = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
            if len(done) >= batches or not query.isActive or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if query.exception() is not None:
            return Run(error=failureLine(str(query.exception())))
        times = [p["durationMs"]["triggerExecution"] / 1000 for p in done[1:batches]]
        if not times:
            return Run(error="no micro-batch finished in time")
        return Run(secondsPerBatch=statistics.median(times))
    finally:
        query.stop()


@dataclass
class Targets:
    """The tables and topics one shape writes into, dropped when it is measured."""

    tables: dict[str, str]
    topics: dict[str, str]
    sqlTables: dict[str, str]
    s3Prefixes: list[str]


def failureLine(text: str) -> str:
    """The line of a query's error that names the cause: the Python error's own, if any."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    causes = [
        line
        for line in lines
        if re.match(r"^[\w.]+(Error|Exception): ", line) and not line.startswith(("org.", "java."))
    ]
    return (causes[-1] if causes else lines[0] if lines else "unknown error")[:200]


def writers(
    spark: Any,
    shape: Shape,
    batches: int,
    work: Path,
    url: str,
    bootstrap: str,
    made: Targets,
    targets: tuple[str, ...] = TARGETS,
) -> dict[tuple[str, str], Callable[[], Any]]:
    """The data stream writer of every (target, path), each with a fresh checkpoint."""
    tag = f"{shape.source}{shape.partitions}"

    def frame(*columns: str) -> Any:
        return source(spark, shape, batches, 100).selectExpr(*columns)

    def ckpt(name: str) -> str:
        return str(work / f"{tag}-{name}-ckpt")

    table = {"twophase": f"bench_shape_tp_{tag}", "spark": f"bench_shape_sp_{tag}"}
    topic = {p: f"shape-{p}-{tag}" for p in table}
    if "kafka" in targets:
        topic = {p: kb.createTopic(bootstrap, shape.partitions, t) for p, t in topic.items()}
        made.topics.update(topic)
    if "postgres" in targets:
        made.tables.update(table)
        for name in table.values():
            pb.resetTable(url, name)
    jdbc, props = pb.jdbcTarget(url)

    def jdbcBatch(df: Any, batchId: int) -> None:
        df.write.jdbc(jdbc, table["spark"], mode="append", properties=props)

    sqlUrl = sqlb.mariadbUrl() if "sql" in targets else ""
    sqlTable = {p: f"{t}_sql" for p, t in table.items()}
    if "sql" in targets:
        made.sqlTables.update(sqlTable)
        engine = sqlb.sa.create_engine(sqlUrl, poolclass=sqlb.sa.pool.NullPool)
        try:
            for name in sqlTable.values():
                sqlb.resetTable(engine, name)
        finally:
            engine.dispose()
    sqlJdbc, sqlProps = sqlb.jdbcTarget(sqlUrl) if sqlUrl else ("", {})

    def sqlBatch(df: Any, batchId: int) -> None:
        df.write.option("batchsize", 1000).jdbc(
            sqlJdbc, sqlTable["spark"], mode="append", properties=sqlProps
        )

    s3 = s3b.s3Service() if "s3" in targets else {}
    s3Base = f"{s3.get('bucket')}/bench-shapes/{work.name}-{tag}"
    if "s3" in targets:
        made.s3Prefixes.append(s3Base)

    files = ("id", "payload")
    kafka = ("CAST(id AS STRING) AS key", "payload AS value")
    pg = ("id", "payload", "CAST(id AS DOUBLE) AS value", "CAST(id AS TIMESTAMP) AS ts")
    fsOptions = s3b.filesOptions(s3) if s3 else {}
    every = {
        ("noop", "noop"): lambda: frame(*files).writeStream.format("noop")
        .option("checkpointLocation", ckpt("noop")),
        ("drop", "drop"): lambda: frame(*files).writeStream.format("bench.drop")
        .option("checkpointLocation", ckpt("drop")),
        ("files", "spark"): lambda: frame(*files).writeStream.format("parquet")
        .option("path", str(work / f"{tag}-f-sp")).option("checkpointLocation", ckpt("f-sp")),
        ("files", "twophase"): lambda: frame(*files).writeStream.format("twophase.files")
        .option("path", str(work / f"{tag}-f-tp")).option("checkpointLocation", ckpt("f-tp")),
        ("kafka", "spark"): lambda: frame(*kafka).writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap).option("topic", topic["spark"])
        .option("checkpointLocation", ckpt("k-sp")),
        ("kafka", "twophase"): lambda: frame(*kafka).writeStream.format("twophase.kafka")
        .option("kafka.bootstrap.servers", bootstrap).option("topic", topic["twophase"])
        .option("checkpointLocation", ckpt("k-tp")),
        ("postgres", "spark"): lambda: frame(*pg).writeStream.foreachBatch(jdbcBatch)
        .option("checkpointLocation", ckpt("p-sp")),
        ("postgres", "twophase"): lambda: frame(*pg).writeStream.format("twophase.postgres")
        .option("url", url).option("table", table["twophase"])
        .option("checkpointLocation", ckpt("p-tp")),
        ("sql", "spark"): lambda: frame(*pg).writeStream.foreachBatch(sqlBatch)
        .option("checkpointLocation", ckpt("q-sp")),
        ("sql", "twophase"): lambda: frame(*pg).writeStream.format("twophase.sql")
        .option("url", sqlUrl).option("dbtable", sqlTable["twophase"])
        .option("checkpointLocation", ckpt("q-tp")),
        ("s3", "spark"): lambda: frame(*files).writeStream.format("parquet")
        .option("path", f"s3a://{s3Base}/spark").option("checkpointLocation", ckpt("s-sp")),
        ("s3", "twophase"): lambda: frame(*files).writeStream.format("twophase.files")
        .option("path", f"s3://{s3Base}/twophase").options(**fsOptions)
        .option("checkpointLocation", ckpt("s-tp")),
    }  # fmt: skip
    return {key: make for key, make in every.items() if key[0] in ("noop", "drop", *targets)}


def measureShape(
    spark: Any,
    shape: Shape,
    batches: int,
    url: str,
    bootstrap: str,
    targets: tuple[str, ...] = TARGETS,
) -> list[list[str]]:
    """One table row per target for ``shape``; ``noop`` measured once for all of them."""
    work = Path(tempfile.mkdtemp(prefix="twophase-shapes-"))
    made = Targets({}, {}, {}, [])
    try:
        paths = writers(spark, shape, batches, work, url, bootstrap, made, targets)
        runs = {key: runQuery(make(), batches) for key, make in paths.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if made.topics:
            kb.deleteTopics(bootstrap, list(made.topics.values()))
        if made.tables:
            pb.dropTables(url, list(made.tables.values()))
        if made.sqlTables:
            engine = sqlb.sa.create_engine(sqlb.mariadbUrl(), poolclass=sqlb.sa.pool.NullPool)
            try:
                with engine.begin() as conn:
                    for name in made.sqlTables.values():
                        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
            finally:
                engine.dispose()
        for base in made.s3Prefixes:
            s3b.removePrefix(s3b.s3Service(), base)
    noop, drop = runs[("noop", "noop")], runs[("drop", "drop")]
    log(f"  {shape.title}: noop {noop.shown()}, bench.drop {drop.shown()}")
    rows = []
    for target in targets:
        own, tp = runs[(target, "spark")], runs[(target, "twophase")]
        log(f"  {target}: {SPARK_OWN[target]} {own.shown()}, twophase {tp.shown()}")
        rows.append(
            [
                shape.title,
                target,
                noop.shown(),
                drop.shown(),
                own.shown(),
                tp.shown(),
                _ratio(own, tp),
                _ratio(noop, tp),
                _ratio(noop, own),
            ]
        )
    return rows


def _ratio(a: Run, b: Run) -> str:
    if a.error or b.error or not b.secondsPerBatch:
        return "-"
    return f"{a.secondsPerBatch / b.secondsPerBatch:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.shapes", description=__doc__)
    p.add_argument("--batches", type=int, default=6, help="micro-batches per run (default 6)")
    p.add_argument("--master", default="local[*]")
    p.add_argument(
        "--shapes",
        default=DEFAULT_SHAPES,
        help=f"comma-separated indexes into the shapes, or all (default {DEFAULT_SHAPES})",
    )
    p.add_argument("--targets", default=",".join(TARGETS), help="comma-separated targets")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")
    chosen = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    targets = tuple(t for t in args.targets.split(",") if t)
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        p.error(f"unknown targets {unknown}; choose among {', '.join(TARGETS)}")
    url, bootstrap = pgUrl(), bootstrapServers()
    began = time.perf_counter()
    packages: tuple[str, ...] = ()
    conf: dict[str, str] = {}
    if "sql" in targets:
        packages += (sqlb.JDBC_DRIVER,)
    if "s3" in targets:
        packages += (s3b.s3aPackage(),)
        conf.update(s3b.s3aConf(s3b.s3Service()))
    spark = benchSession(args.master, 200, packages, conf)
    spark.dataSource.register(kb.DropSink)
    rows: list[list[str]] = []
    try:
        warm = Shape("sequence", 8, 10_000)
        log("warming up every path on a small shape")
        measureShape(spark, warm, 2, url, bootstrap, targets)
        for shape in chosen:
            log(f"measuring {shape.title}, {args.batches} micro-batches per path")
            rows += measureShape(spark, shape, args.batches, url, bootstrap, targets)
    finally:
        spark.stop()
    header = [
        "shape",
        "target",
        "noop s/batch",
        "bench.drop s/batch",
        "Spark's own s/batch",
        "twophase s/batch",
        "Spark's own / twophase",
        "noop / twophase",
        "noop / Spark's own",
    ]
    text = (
        f"# Sinks per micro-batch, by shape\n\nSpark {spark.version}, master {args.master}, "
        f"{os.cpu_count()} cores; median of micro-batches 2..{args.batches} of each run; "
        f"{time.perf_counter() - began:.0f} s in all.\n\n" + markdownTable(header, rows) + "\n"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "shapes.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
