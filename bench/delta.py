"""``make bench-delta``: twophase.delta against ``write_deltalake`` in foreachBatch, Spark's
Parquet sink and Spark's noop sink, plus how the Delta log grows under one commit per batch.

The same rows (``id`` and a padded ``payload``), batches and write tasks go, in one Spark
session (``local[*]``), to

(t) ``twophase.delta`` (option ``path``): exactly once, one Delta commit per micro-batch;
(f) the same sink through ``twophase.foreachBatch("twophase.delta", ...)``, which writes with
    one task per task slot whatever the batch's partitions;
(w) what users write today: ``foreachBatch`` calling ``deltalake.write_deltalake(path,
    batch_df.toArrow(), mode="append")``, at least once (a driver that dies between the write
    and Spark's commit log appends the batch again on restart);
(p) Spark's ``parquet`` file sink: the engine's own file path, no table;
(n) Spark's ``noop`` sink: the engine's ceiling for the same query.

Shapes: a JVM source (``rate-micro-batch``) at 8 and at 200 partitions, run with a
``processingTime`` trigger until ``rows / rowsPerBatch`` micro-batches finished (it has no
``availableNow``; its rows are filtered to ``id < rows``, so the micro-batches a stop cuts
short are empty and every table holds exactly ``rows``), and the Python ``twophase.sequence``
source at 200 partitions with ``trigger(availableNow=True)``. Every path is warmed up once on a
small run first. For each shape and path: seconds per micro-batch (Spark's
``triggerExecution`` of every micro-batch with rows) p50, p95 and max, and rows/s over their
sum; then (t)/(w), (f)/(w), (t)/(p) and (t)/(n) as rates (above 1: twophase is faster).
After each run the Delta tables must hold exactly ``rows`` rows and (t), (f) exactly one commit
per micro-batch with rows (``WRONG COUNT`` otherwise).

``--log-growth N`` (Spark-free): ``DeltaCommitter.completeBatch`` driven directly for N
micro-batches of one tiny Parquet file each; the size of ``_delta_log`` after them (JSON
commits and the checkpoints delta-rs writes on its own), the commit time of the last 100
against the first 100, and how long opening the table takes at the end.

Writes ``bench/results/delta.md`` and prints it. Local disk only: no service is needed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._common import REPO, fmtNumber, markdownTable, percentiles, ratio
from bench.session import log
from bench.shapes import Shape, failureLine, source

PATHS = {
    "t": "twophase.delta",
    "f": "twophase.foreachBatch('twophase.delta')",
    "w": "write_deltalake in foreachBatch (at least once)",
    "p": "Spark parquet sink",
    "n": "Spark noop sink",
}
"""Every path by its letter, in the order each shape runs them."""

TABLE_PATHS = ("t", "f", "w")
TWOPHASE_PATHS = ("t", "f")
"""The paths that create the table empty, then commit once per micro-batch."""
"""The paths that write a Delta table."""

GROWTH_SINK = "bench-delta-growth"
GROWTH_WINDOW = 100
"""Commits compared at the start and at the end of ``--log-growth``."""


@dataclass
class Run:
    """One query: the seconds of each micro-batch with rows, what its output holds, or why it
    failed."""

    path: str
    rows: int
    batches: int
    seconds: list[float] = field(default_factory=list)
    held: int | None = None
    """Rows in the output (the table's latest version, or the Parquet files), if it has one."""
    commits: int | None = None
    """Delta commits after the table's creation (``t``) or in all (``w``)."""
    error: str = ""

    @property
    def rate(self) -> float:
        """Rows per second over the micro-batches' summed time; NaN unless all finished."""
        if self.error or len(self.seconds) != self.batches:
            return float("nan")
        return self.rows / sum(self.seconds)

    def check(self) -> str:
        """``ok`` when the output holds exactly ``rows`` (and ``t`` one commit per batch);
        ``WRONG COUNT`` and what differs otherwise."""
        if self.error:
            return f"failed: {self.error}"
        if self.held is None:
            return "-"
        wrong = []
        if self.held != self.rows:
            wrong.append(f"{self.held:,} rows, not {self.rows:,}")
        if self.path in TWOPHASE_PATHS and self.commits != self.batches:
            wrong.append(f"{self.commits} commits for {self.batches} batches")
        if wrong:
            return "WRONG COUNT: " + "; ".join(wrong)
        if self.commits is None:
            return f"ok ({self.held:,} rows)"
        return f"ok ({self.held:,} rows, {self.commits} commits)"

    def cells(self) -> list[str]:
        p50, p95, most = percentiles(self.seconds)
        return [
            f"{len(self.seconds)}/{self.batches}",
            fmtNumber(p50, 2),
            fmtNumber(p95, 2),
            fmtNumber(most, 2),
            fmtNumber(self.rate),
            self.check(),
        ]


def frame(spark: Any, shape: Shape, batches: int, valueBytes: int) -> Any:
    """The shape's first ``batches * rowsPerBatch`` rows (``bench.shapes.source``); the JVM
    source's later rows filtered out, so its micro-batches past them write nothing."""
    rows = shape.rowsPerBatch * batches
    stream = source(spark, shape, batches, valueBytes)
    return stream.where(f"id < {rows}") if shape.source == "rate" else stream


def appendWithWriteDeltalake(table: str) -> Callable[[Any, int], None]:
    """The ``foreachBatch`` function users write today: each batch appended by delta-rs from
    the driver, with no record of which batches the table holds (at least once)."""

    def append(batch: Any, batchId: int) -> None:
        import deltalake

        data = batch.toArrow() if hasattr(batch, "toArrow") else batch.toPandas()
        if len(data):
            deltalake.write_deltalake(table, data, mode="append")

    return append


def writerFor(spark: Any, path: str, shape: Shape, batches: int, work: Path, label: str) -> Any:
    """The query of ``path`` (a letter of ``PATHS``), its output and checkpoint under ``work``."""
    stream = frame(spark, shape, batches, 100).writeStream
    output, checkpoint = str(work / f"{label}-out"), str(work / f"{label}-ckpt")
    if path == "t":
        writer = stream.format("twophase.delta").option("path", output)
    elif path == "f":
        import twophase

        options = {"path": output, "checkpointLocation": checkpoint}
        writer = stream.foreachBatch(twophase.foreachBatch("twophase.delta", options))
    elif path == "w":
        writer = stream.foreachBatch(appendWithWriteDeltalake(output))
    elif path == "p":
        writer = stream.format("parquet").option("path", output)
    else:
        writer = stream.format("noop")
    return writer.option("checkpointLocation", checkpoint)


def runQuery(writer: Any, shape: Shape, batches: int, timeout: float) -> tuple[list[float], str]:
    """Start the query and wait for its ``batches`` micro-batches: ``availableNow`` for the
    Python source, until they are done and then stopped for the JVM one (as ``bench.shapes``).
    The seconds of each micro-batch with rows, in order, and the failure, if any."""
    if shape.source == "rate":
        query = writer.trigger(processingTime="0 seconds").start()
    else:
        query = writer.trigger(availableNow=True).start()
    deadline = time.monotonic() + timeout
    error = ""
    try:
        while query.isActive and time.monotonic() < deadline:
            done = [p for p in query.recentProgress if p.get("batchId", -1) < batches]
            if shape.source == "rate" and len(done) >= batches:
                break
            time.sleep(0.2)
        if query.exception() is not None:
            error = failureLine(str(query.exception()))
        elif time.monotonic() >= deadline:
            error = f"not done after {timeout:.0f} s"
    finally:
        query.stop()
    timed = {
        int(p["batchId"]): p["durationMs"]["triggerExecution"] / 1000
        for p in query.recentProgress
        if p.get("numInputRows", 0) > 0 and int(p["batchId"]) < batches
    }
    return [timed[b] for b in sorted(timed)], error


def countOutput(path: str, output: str) -> tuple[int, int | None]:
    """Rows the output holds and, for a Delta table, its commits: after the creation commit for
    ``t`` (it creates the table empty), all of them for ``w`` (its first write creates it)."""
    if path in TABLE_PATHS:
        import deltalake

        table = deltalake.DeltaTable(output)
        held = int(table.to_pyarrow_dataset().count_rows())
        return held, table.version() if path in TWOPHASE_PATHS else table.version() + 1
    import pyarrow.dataset as ds

    # Spark's _spark_metadata log is skipped (a leading underscore), as pyarrow does by default.
    return int(ds.dataset(output, format="parquet").count_rows()), None


def measure(
    spark: Any, path: str, shape: Shape, batches: int, work: Path, label: str, timeout: float
) -> Run:
    """One path on one shape, with an output and a checkpoint of its own, checked after."""
    run = Run(path, shape.rowsPerBatch * batches, batches)
    writer = writerFor(spark, path, shape, batches, work, label)
    run.seconds, run.error = runQuery(writer, shape, batches, timeout)
    if not run.error and path != "n":
        try:
            run.held, run.commits = countOutput(path, str(work / f"{label}-out"))
        except Exception as exc:  # a table that cannot be read is this run's result
            run.error = f"cannot read the output: {failureLine(str(exc))}"
    return run


def shapeTitle(shape: Shape, batches: int) -> str:
    return f"{shape.title}, {batches} batches"


def measureShape(
    spark: Any, shape: Shape, batches: int, work: Path, timeout: float
) -> dict[str, Run]:
    """Every path on ``shape``, one after another; each printed as it ends."""
    runs = {}
    for path, name in PATHS.items():
        label = f"{shape.source}{shape.partitions}-{path}"
        run = measure(spark, path, shape, batches, work, label, timeout)
        p50, p95, most = percentiles(run.seconds)
        log(
            f"  ({path}) {name}: s/batch p50 {fmtNumber(p50, 2)}, p95 {fmtNumber(p95, 2)}, "
            f"max {fmtNumber(most, 2)}; {fmtNumber(run.rate)} rows/s; {run.check()}"
        )
        runs[path] = run
    return runs


@dataclass
class Growth:
    """What ``--log-growth`` saw: commit seconds in order, the log's files and the open time."""

    batches: int
    rowsPerFile: int
    seconds: list[float] = field(default_factory=list)
    logFiles: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Files of ``_delta_log`` by kind: (count, bytes)."""
    checkpoints: dict[int, int] = field(default_factory=dict)
    """The checkpoint files delta-rs wrote: bytes by the version they hold."""
    openSeconds: float = float("nan")
    openAgainSeconds: float = float("nan")
    held: int = 0
    version: int = 0

    def check(self) -> str:
        wrong = []
        if self.held != self.batches * self.rowsPerFile:
            wrong.append(f"{self.held:,} rows, not {self.batches * self.rowsPerFile:,}")
        if self.version != self.batches:
            wrong.append(f"version {self.version}, not {self.batches}")
        return "WRONG COUNT: " + "; ".join(wrong) if wrong else "ok"


def logKind(name: str) -> str:
    """The kind of a file of ``_delta_log``, by its name."""
    if name.endswith(".checkpoint.parquet") or ".checkpoint." in name:
        return "checkpoint parquet"
    if name.endswith(".json"):
        return "JSON commits"
    if name == "_last_checkpoint":
        return "_last_checkpoint"
    if name.endswith(".crc"):
        return "crc"
    return "other"


def logGrowth(batches: int, work: Path, rowsPerFile: int = 10) -> Growth:
    """Drive ``DeltaCommitter.completeBatch`` for ``batches`` micro-batches, each one tiny
    Parquet file written into the table's directory beside it (as ``commit`` leaves a task's
    file), and time each commit; then the log's files and the table's open time."""
    import deltalake
    import pyarrow as pa
    import pyarrow.parquet as pq

    from twophase.protocol import TransactionContext
    from twophase.sinks.delta import DeltaCommitter, ensureTable
    from twophase.sinks.files.handles import StagedFile, preparedHandle
    from twophase.sinks.files.layout import (
        attemptName,
        finalFileName,
        sinkStagingDir,
        stagedFileName,
    )

    table = work / "growth" / "table"
    schema = pa.schema([("id", pa.int64()), ("payload", pa.string())])
    ensureTable(str(table), schema, None, True)
    committer = DeltaCommitter.fromOptions({"path": str(table)})
    files = committer.settings.files
    growth = Growth(batches, rowsPerFile)
    for batchId in range(batches):
        ctx = TransactionContext(GROWTH_SINK, "bench-delta", batchId, 0, 0)
        staging = f"{sinkStagingDir(GROWTH_SINK)}/{attemptName(batchId, '', 0, 0)}"
        final = finalFileName(GROWTH_SINK, batchId, 0, 0, files.extension)
        ids = range(batchId * rowsPerFile, (batchId + 1) * rowsPerFile)
        rows = pa.table({"id": list(ids), "payload": [f"row-{i}" for i in ids]}, schema=schema)
        pq.write_table(rows, table / final, compression=files.compression)
        staged = StagedFile(stagedFileName(staging, 0), final, rowsPerFile)
        handle = preparedHandle(ctx, str(table), files.staging, staging, [staged])
        started = time.perf_counter()
        committer.completeBatch(GROWTH_SINK, batchId, [handle])
        growth.seconds.append(time.perf_counter() - started)
        if (batchId + 1) % 1000 == 0:
            log(f"  {batchId + 1:,} commits, the last in {growth.seconds[-1] * 1000:.1f} ms")
    for entry in sorted((table / "_delta_log").rglob("*")):
        if entry.is_file():
            count, size = growth.logFiles.get(logKind(entry.name), (0, 0))
            growth.logFiles[logKind(entry.name)] = (count + 1, size + entry.stat().st_size)
            if logKind(entry.name) == "checkpoint parquet":
                version = int(entry.name.split(".")[0])
                growth.checkpoints[version] = (
                    growth.checkpoints.get(version, 0) + entry.stat().st_size
                )
    started = time.perf_counter()
    opened = deltalake.DeltaTable(str(table))
    growth.openSeconds = time.perf_counter() - started
    started = time.perf_counter()
    deltalake.DeltaTable(str(table))
    growth.openAgainSeconds = time.perf_counter() - started
    growth.held = int(opened.to_pyarrow_dataset().count_rows())
    growth.version = int(opened.version())
    return growth


def growthReport(growth: Growth) -> str:
    """``--log-growth``'s findings as Markdown."""
    window = min(GROWTH_WINDOW, len(growth.seconds))
    first, last = growth.seconds[:window], growth.seconds[-window:]
    rows = [
        [f"first {window}", *(fmtNumber(s * 1000, 1) for s in percentiles(first)),
         fmtNumber(statistics.fmean(first) * 1000, 1)],
        [f"last {window}", *(fmtNumber(s * 1000, 1) for s in percentiles(last)),
         fmtNumber(statistics.fmean(last) * 1000, 1)],
        [f"all {len(growth.seconds)}", *(fmtNumber(s * 1000, 1) for s in
         percentiles(growth.seconds)), fmtNumber(statistics.fmean(growth.seconds) * 1000, 1)],
    ]  # fmt: skip
    files = [
        [kind, fmtNumber(count), fmtNumber(size)]
        for kind, (count, size) in sorted(growth.logFiles.items())
    ]
    total = sum(count for count, _ in growth.logFiles.values())
    totalBytes = sum(size for _, size in growth.logFiles.values())
    files.append(["all", fmtNumber(total), fmtNumber(totalBytes)])
    versions = sorted(growth.checkpoints)
    # Batch b is version b + 1 (the creation is version 0): its commit time is seconds[b].
    withCheckpoint = [growth.seconds[v - 1] for v in versions if 0 < v <= len(growth.seconds)]
    others = [s for v, s in enumerate(growth.seconds, start=1) if v not in growth.checkpoints]
    if versions:
        checkpoints = (
            f"{len(versions)}, at versions {', '.join(str(v) for v in versions[:5])}"
            f"{' ...' if len(versions) > 5 else ''}; the last (version {versions[-1]:,}) "
            f"{fmtNumber(growth.checkpoints[versions[-1]])} bytes. Median commit time of the "
            f"commits that wrote one: {fmtNumber(statistics.median(withCheckpoint) * 1000, 1)} "
            f"ms, of the others: {fmtNumber(statistics.median(others) * 1000, 1)} ms"
        )
    else:
        checkpoints = "none"
    slower = ratio(statistics.median(last), statistics.median(first))
    return (
        f"`DeltaCommitter.completeBatch` driven directly (no Spark) for {growth.batches:,} "
        f"micro-batches of one {growth.rowsPerFile}-row Parquet file each.\n\n"
        "Commit time per micro-batch (ms):\n\n"
        + markdownTable(["commits", "p50", "p95", "max", "mean"], rows)
        + f"\n\nMedian commit time, last {window} over first {window}: {slower:.2f}\n\n"
        "`_delta_log` at the end:\n\n"
        + markdownTable(["files", "count", "bytes"], files)
        + f"\n\nCheckpoints delta-rs wrote on its own: {checkpoints}\n\n"
        f"`DeltaTable(path)` at the end: {growth.openSeconds * 1000:.1f} ms, "
        f"{growth.openAgainSeconds * 1000:.1f} ms the second time; the table holds "
        f"{growth.held:,} rows at version {growth.version:,}: {growth.check()}\n"
    )


def session(master: str) -> Any:
    """The bench's Spark session: no connector jars (it writes local files only), twophase
    registered, every micro-batch's progress kept for the timings."""
    from pyspark.sql import SparkSession

    import twophase

    spark = (
        SparkSession.builder.master(master)
        .appName("twophase-bench-delta")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    twophase.register(spark)
    return spark


def sparkReport(
    measured: list[tuple[str, dict[str, Run]]], args: Any, slots: int, seconds: float
) -> str:
    """The side-by-side tables as Markdown: every run, then the ratios."""
    header = ["shape", "path", "batches", "s/batch p50", "p95", "max", "rows/s", "table check"]
    rows = [
        [title, f"({path}) {PATHS[path]}", *run.cells()]
        for title, runs in measured
        for path, run in runs.items()
    ]
    pairs = (("t", "w"), ("f", "w"), ("t", "p"), ("t", "n"))
    ratios = [
        [title, *(f"{ratio(runs[a].rate, runs[b].rate):.2f}" for a, b in pairs)]
        for title, runs in measured
    ]
    ratioHeader = ["shape", *(f"({a})/({b}) rows/s" for a, b in pairs)]
    return (
        f"PySpark master {args.master} ({slots} task slots), {os.cpu_count()} cores; "
        f"{args.rows:,} rows of {args.value_bytes + 8} bytes ({args.value_bytes}-byte payload) "
        f"in batches of {args.rows_per_batch:,} per run, after one warm-up run of each path; "
        f"{seconds:.0f} s in all. Seconds per micro-batch: Spark's triggerExecution of each "
        "micro-batch with rows; rows/s: the rows over their sum. (w) is at least once: a "
        "driver that dies after `write_deltalake` and before Spark's commit log appends the "
        "batch again on restart; (t) records each batch in the table's log (txn "
        "`twophase-<sinkId>`, version = batch id) in the same commit as its files.\n\n"
        + markdownTable(header, rows)
        + "\n\nRates of twophase.delta's two paths over the others (above 1: twophase is "
        "faster):\n\n" + markdownTable(ratioHeader, ratios) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.delta", description=__doc__)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows per run (default 1,000,000)")
    p.add_argument("--rows-per-batch", type=int, default=125_000)
    p.add_argument("--value-bytes", type=int, default=100, help="payload bytes (default 100)")
    p.add_argument("--master", default="local[*]")
    p.add_argument(
        "--log-growth",
        type=int,
        default=None,
        help="micro-batches of the Spark-free log measurement (default 10,000; 1,000 with "
        "--quick; 0: skip it)",
    )
    p.add_argument("--no-spark", action="store_true", help="only the --log-growth measurement")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run at most")
    p.add_argument("--quick", action="store_true", help="20,000 rows in batches of 5,000")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.rows_per_batch = 20_000, 5_000
    if args.log_growth is None:
        args.log_growth = 1_000 if args.quick else 10_000
    if args.rows_per_batch < 1 or args.rows % args.rows_per_batch:
        p.error("--rows must be a multiple of --rows-per-batch")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")
    batches = args.rows // args.rows_per_batch
    shapes = (
        Shape("rate", 8, args.rows_per_batch),
        Shape("rate", 200, args.rows_per_batch),
        Shape("sequence", 200, args.rows_per_batch),
    )
    work = Path(tempfile.mkdtemp(prefix="twophase-bench-delta-"))
    began = time.perf_counter()
    sections = ["# twophase.delta against write_deltalake, Spark's Parquet and noop sinks\n"]
    wrong = False
    try:
        if not args.no_spark:
            spark = session(args.master)
            try:
                log("warming up every path on a small run")
                warm = Shape("sequence", 8, min(args.rows_per_batch, 5_000))
                measureShape(spark, warm, 2, work / "warm", args.timeout)
                measured = []
                for shape in shapes:
                    log(f"measuring {shapeTitle(shape, batches)}")
                    runs = measureShape(spark, shape, batches, work, args.timeout)
                    measured.append((shapeTitle(shape, batches), runs))
                slots = spark.sparkContext.defaultParallelism
            finally:
                spark.stop()
            wrong |= any("WRONG" in r.check() for _, runs in measured for r in runs.values())
            sections.append(sparkReport(measured, args, slots, time.perf_counter() - began))
        if args.log_growth:
            log(f"log growth: {args.log_growth:,} commits by DeltaCommitter.completeBatch")
            growth = logGrowth(args.log_growth, work)
            wrong |= "WRONG" in growth.check()
            sections.append("## The Delta log under one commit per micro-batch\n")
            sections.append(growthReport(growth))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = "\n".join(sections)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "delta.md").write_text(text)
    print(text)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
