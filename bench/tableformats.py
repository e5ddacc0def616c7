"""The table-format benches' shared runner: twophase's sink against the other paths, then growth.

``bench.delta`` and ``bench.iceberg`` each describe their format in a ``TableFormat`` (its
sink, its at-least-once ``foreachBatch`` alternative, how an output is named, counted and how
its log grows without Spark) and call ``main``; the paths, shapes, timings, checks, reports and
command line here are the same for every format (the growth measurement: ``bench.tablegrowth``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bench._common import REPO, fmtNumber, markdownTable, percentiles, ratio
from bench.session import log
from bench.shapes import Shape, failureLine, source
from bench.tablegrowth import Growth, LogTerms, growthReport

TABLE_PATHS = ("t", "f", "w")
"""The paths that write a table of the format."""
TWOPHASE_PATHS = ("t", "f")
"""The paths that create the table empty, then commit once per micro-batch."""


@dataclass(frozen=True)
class TableFormat:
    """What the shared bench needs to know of one table format."""

    name: str
    """``delta``: the sink ``twophase.<name>``, ``bench/results/<name>.md``."""
    title: str
    """The report's first heading."""
    atLeastOnce: str
    """Path (w)'s name in the tables."""
    pathsNote: str
    """What (w) risks and what (t) records, for the report."""
    options: Callable[[Path, str], dict[str, str]]
    """The sink's options for the output of run ``label`` under a work directory."""
    appendBatch: Callable[[Mapping[str, str]], Callable[[Any, int], None]]
    """Path (w)'s ``foreachBatch`` function into the output those options name."""
    count: Callable[[Mapping[str, str], bool], tuple[int, int]]
    """Rows the output holds and its commits that added rows; the flag says that the sink
    created the table empty."""
    growth: Callable[[int, Path], list[tuple[str, Growth]]]
    """``--log-growth``: the committer driven for N micro-batches under a work directory, as
    (section heading, what it saw)."""
    terms: LogTerms
    growthBatches: tuple[int, int] = (10_000, 1_000)
    """``--log-growth``'s default, and with ``--quick``."""

    @property
    def sink(self) -> str:
        return f"twophase.{self.name}"

    @property
    def paths(self) -> dict[str, str]:
        """Every path by its letter, in the order each shape runs them."""
        return {
            "t": self.sink,
            "f": f"twophase.foreachBatch('{self.sink}')",
            "w": self.atLeastOnce,
            "p": "Spark parquet sink",
            "n": "Spark noop sink",
        }


@dataclass
class Run:
    """One query: the seconds of each micro-batch with rows, what its output holds, or why it
    failed."""

    path: str
    rows: int
    batches: int
    seconds: list[float] = field(default_factory=list)
    held: int | None = None
    """Rows in the output (the table's current version, or the Parquet files), if it has one."""
    commits: int | None = None
    """The table's commits that added rows."""
    error: str = ""

    @property
    def rate(self) -> float:
        """Rows per second over the micro-batches' summed time; NaN unless all finished."""
        if self.error or len(self.seconds) != self.batches:
            return float("nan")
        return self.rows / sum(self.seconds)

    def check(self) -> str:
        """``ok`` when the output holds exactly ``rows`` (and ``t``, ``f`` one commit per
        batch); ``WRONG COUNT`` and what differs otherwise."""
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


def writerFor(
    spark: Any, fmt: TableFormat, path: str, shape: Shape, batches: int, work: Path, label: str
) -> Any:
    """The query of ``path`` (a letter of ``fmt.paths``), its output and checkpoint under
    ``work``."""
    stream = frame(spark, shape, batches, 100).writeStream
    checkpoint = str(work / f"{label}-ckpt")
    if path == "t":
        writer = stream.format(fmt.sink).options(**fmt.options(work, label))
    elif path == "f":
        import twophase

        options = {**fmt.options(work, label), "checkpointLocation": checkpoint}
        writer = stream.foreachBatch(twophase.foreachBatch(fmt.sink, options))
    elif path == "w":
        writer = stream.foreachBatch(fmt.appendBatch(fmt.options(work, label)))
    elif path == "p":
        writer = stream.format("parquet").option("path", str(work / f"{label}-out"))
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


def countOutput(
    fmt: TableFormat, path: str, work: Path, label: str, batches: int
) -> tuple[int, int | None]:
    """Rows the output holds and, for a table, its commits that added rows."""
    if path in TABLE_PATHS:
        return fmt.count(fmt.options(work, label), path in TWOPHASE_PATHS)
    return sparkSinkRows(work / f"{label}-out", batches), None


def sparkSinkRows(out: Path, batches: int) -> int:
    """Rows of Spark's file sink in batches ``0..batches-1``, read through its
    ``_spark_metadata`` log as Spark's readers do: a micro-batch the stop interrupted leaves
    files that the log does not name (and that its abort may be deleting meanwhile)."""
    import pyarrow.parquet as pq

    log = out / "_spark_metadata"
    files: list[str] = []
    for batch in range(batches):
        compact = log / f"{batch}.compact"
        entries = (compact if compact.exists() else log / str(batch)).read_text().splitlines()
        named = [json.loads(line)["path"] for line in entries[1:] if line.strip()]
        files = named if compact.exists() else files + named
    return sum(pq.ParquetFile(urlparse(f).path).metadata.num_rows for f in files)


def measure(
    spark: Any,
    fmt: TableFormat,
    path: str,
    shape: Shape,
    batches: int,
    work: Path,
    label: str,
    timeout: float,
) -> Run:
    """One path on one shape, with an output and a checkpoint of its own, checked after."""
    work.mkdir(parents=True, exist_ok=True)
    run = Run(path, shape.rowsPerBatch * batches, batches)
    writer = writerFor(spark, fmt, path, shape, batches, work, label)
    run.seconds, run.error = runQuery(writer, shape, batches, timeout)
    if not run.error and path != "n":
        try:
            run.held, run.commits = countOutput(fmt, path, work, label, batches)
        except Exception as exc:  # a table that cannot be read is this run's result
            run.error = f"cannot read the output: {failureLine(str(exc))}"
    return run


def shapeTitle(shape: Shape, batches: int) -> str:
    return f"{shape.title}, {batches} batches"


def measureShape(
    spark: Any, fmt: TableFormat, shape: Shape, batches: int, work: Path, timeout: float
) -> dict[str, Run]:
    """Every path on ``shape``, one after another; each printed as it ends."""
    runs = {}
    for path, name in fmt.paths.items():
        label = f"{shape.source}{shape.partitions}-{path}"
        run = measure(spark, fmt, path, shape, batches, work, label, timeout)
        p50, p95, most = percentiles(run.seconds)
        log(
            f"  ({path}) {name}: s/batch p50 {fmtNumber(p50, 2)}, p95 {fmtNumber(p95, 2)}, "
            f"max {fmtNumber(most, 2)}; {fmtNumber(run.rate)} rows/s; {run.check()}"
        )
        runs[path] = run
    return runs


def session(master: str, name: str) -> Any:
    """The bench's Spark session: no connector jars (it writes local files only), twophase
    registered, every micro-batch's progress kept for the timings."""
    from pyspark.sql import SparkSession

    import twophase

    spark = (
        SparkSession.builder.master(master)
        .appName(f"twophase-bench-{name}")
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
    fmt: TableFormat,
    measured: list[tuple[str, dict[str, Run]]],
    args: Any,
    slots: int,
    seconds: float,
) -> str:
    """The side-by-side tables as Markdown: every run, then the ratios."""
    header = ["shape", "path", "batches", "s/batch p50", "p95", "max", "rows/s", "table check"]
    rows = [
        [title, f"({path}) {fmt.paths[path]}", *run.cells()]
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
        f"micro-batch with rows; rows/s: the rows over their sum. {fmt.pathsNote}\n\n"
        + markdownTable(header, rows)
        + f"\n\nRates of {fmt.sink}'s two paths over the others (above 1: twophase is "
        "faster):\n\n" + markdownTable(ratioHeader, ratios) + "\n"
    )


def parseArgs(fmt: TableFormat, argv: list[str] | None, description: str | None) -> Any:
    full, quick = fmt.growthBatches
    p = argparse.ArgumentParser(prog=f"bench.{fmt.name}", description=description)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows per run (default 1,000,000)")
    p.add_argument("--rows-per-batch", type=int, default=125_000)
    p.add_argument("--value-bytes", type=int, default=100, help="payload bytes (default 100)")
    p.add_argument("--master", default="local[*]")
    p.add_argument(
        "--log-growth",
        type=int,
        default=None,
        help=f"micro-batches of the Spark-free log measurement (default {full:,}; {quick:,} "
        "with --quick; 0: skip it)",
    )
    p.add_argument("--no-spark", action="store_true", help="only the --log-growth measurement")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run at most")
    p.add_argument("--quick", action="store_true", help="20,000 rows in batches of 5,000")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.rows_per_batch = 20_000, 5_000
    if args.log_growth is None:
        args.log_growth = quick if args.quick else full
    if args.rows_per_batch < 1 or args.rows % args.rows_per_batch:
        p.error("--rows must be a multiple of --rows-per-batch")
    return args


def main(fmt: TableFormat, argv: list[str] | None = None, description: str | None = None) -> int:
    """The format's bench: every path on every shape under Spark (unless ``--no-spark``), then
    ``--log-growth``; writes ``<out>/<name>.md`` and prints it. 1 when a count is wrong."""
    args = parseArgs(fmt, argv, description)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")
    batches = args.rows // args.rows_per_batch
    shapes = (
        Shape("rate", 8, args.rows_per_batch),
        Shape("rate", 200, args.rows_per_batch),
        Shape("sequence", 200, args.rows_per_batch),
    )
    work = Path(tempfile.mkdtemp(prefix=f"twophase-bench-{fmt.name}-"))
    began = time.perf_counter()
    sections = [f"# {fmt.title}\n"]
    wrong = False
    try:
        if not args.no_spark:
            spark = session(args.master, fmt.name)
            try:
                log("warming up every path on a small run")
                warm = Shape("sequence", 8, min(args.rows_per_batch, 5_000))
                measureShape(spark, fmt, warm, 2, work / "warm", args.timeout)
                measured = []
                for shape in shapes:
                    log(f"measuring {shapeTitle(shape, batches)}")
                    runs = measureShape(spark, fmt, shape, batches, work, args.timeout)
                    measured.append((shapeTitle(shape, batches), runs))
                slots = spark.sparkContext.defaultParallelism
            finally:
                spark.stop()
            wrong |= any("WRONG" in r.check() for _, runs in measured for r in runs.values())
            sections.append(sparkReport(fmt, measured, args, slots, time.perf_counter() - began))
        if args.log_growth:
            log(f"log growth: {args.log_growth:,} commits by {fmt.terms.committer}.completeBatch")
            for heading, growth in fmt.growth(args.log_growth, work):
                wrong |= "WRONG" in growth.check(fmt.terms)
                sections.append(f"## {heading}\n")
                sections.append(growthReport(fmt.terms, growth))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = "\n".join(sections)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{fmt.name}.md").write_text(text)
    print(text)
    return 1 if wrong else 0
