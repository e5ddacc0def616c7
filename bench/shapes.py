"""``make bench-shapes``: seconds and files per micro-batch, by shape, target and path.

``make bench`` measures one shape (a Python source, 8 partitions, big batches), which hides what
a sink pays per task. Real pipelines have an aggregation, a join or a ``repartition`` before the
sink, so Spark's default 200 shuffle partitions, and a JVM source. For each shape, one Spark
session runs the same query into Spark's ``noop`` sink (the engine alone, the ceiling for any
sink) and ``bench.drop`` (a Python data source that drops its input: what PySpark charges any
Python sink per task), both also after ``.coalesce(n)``, and a ``foreachBatch`` whose Python
tasks (one per slot) drop their rows: the floor of the foreachBatch path, so the most it can
reach against Spark's own path at equal task counts. Then, for each target
(``bench/targets/``), five paths:

- ``spark``: Spark's own path as users run it by default, one task per input partition;
- ``spark coalesced``: the same after ``.coalesce(n)``, n = the session's task slots;
- ``format``: ``writeStream.format("twophase.<target>")``, one task per input partition;
- ``format coalesced``: the same after ``.coalesce(n)``;
- ``foreachBatch``: ``twophase.foreachBatch("twophase.<target>", options)``, which writes each
  batch with as many tasks as there are slots (``writerTasks``' default).
- ``bare`` (``make bench-rounds`` only): the floor's tasks writing the rows with the Python
  client twophase uses for the target, without twophase (``bench.bare``).

Each run is ``--batches`` micro-batches (the 1,000-partition shape fewer); the figure is the
median of Spark's ``triggerExecution`` over the batches after the first. Files per batch are the
data files each path made visible, over the batches it committed. Ratios are Spark's own default
path's time over each path's (above 1: faster than Spark's own). Writes
``bench/results/shapes.{md,csv}`` and prints them with the goals that hold.
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

from bench._common import REPO, bootstrapServers, markdownTable, pgUrl, writeResults
from bench.drop import DropSink, dropRows
from bench.session import benchSession, log
from bench.targets import TARGETS, Context, Target


@dataclass(frozen=True)
class Shape:
    """One query shape: the source, the tasks per micro-batch and the rows per micro-batch."""

    source: str
    partitions: int
    rowsPerBatch: int
    maxBatches: int = 0
    """At most this many micro-batches per path (0: ``--batches``), to bound large shapes."""

    @property
    def title(self) -> str:
        kind = "JVM rate-micro-batch" if self.source == "rate" else "Python twophase.sequence"
        return f"{kind}, {self.partitions} partitions, {self.rowsPerBatch:,} rows per batch"


SHAPES = (
    Shape("rate", 8, 125_000),
    Shape("rate", 200, 20_000),
    Shape("rate", 1000, 20_000, maxBatches=3),
    Shape("sequence", 200, 20_000),
)
DEFAULT_SHAPES = "0,1,2"
"""What ``make bench-shapes`` measures; the Python-source shape (3) is asked for by name."""
PATHS = ("spark", "spark coalesced", "format", "format coalesced", "foreachBatch")
GOALS = {
    "kafka": 2.0,
    "files": 2.0,
    "postgres": 1.5,
    "sql": 1.5,
    "s3": 1.5,
    "delta": 1.0,
    "iceberg": 1.0,
}
"""twophase's default foreachBatch over Spark's own default path, at 200 partitions and more."""


@dataclass
class Run:
    """One query: seconds per micro-batch after the first and files per batch, or why it failed."""

    secondsPerBatch: float = float("nan")
    batches: int = 0
    files: int | None = None
    error: str = ""
    checkpoint: str = ""

    def shown(self) -> str:
        return f"failed: {self.error}" if self.error else f"{self.secondsPerBatch:.2f}"

    def filesPerBatch(self) -> str:
        if self.files is None or not self.batches:
            return "-"
        return f"{self.files / self.batches:.0f}"


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


def failureLine(text: str) -> str:
    """The line of a query's error that names the cause: the Python error's own, if any."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    causes = [
        line
        for line in lines
        if re.match(r"^[\w.]+(Error|Exception): ", line) and not line.startswith(("org.", "java."))
    ]
    return (causes[-1] if causes else lines[0] if lines else "unknown error")[:200]


def timeQuery(
    writer: Any,
    batches: int,
    timeout: float = 900.0,
    onBatches: Callable[[int], None] | None = None,
) -> Run:
    """Run until ``batches`` micro-batches finished: the median time of all but the first, and
    the micro-batches that committed (one cut short by the stop commits nothing).
    ``onBatches`` hears, at each look, how many micro-batches have finished."""
    query = writer.trigger(processingTime="0 seconds").start()
    deadline = time.monotonic() + timeout
    run = Run()
    try:
        while True:
            done = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
            if onBatches is not None:
                onBatches(len(done))
            if len(done) >= batches or not query.isActive or time.monotonic() > deadline:
                break
            time.sleep(0.2 if onBatches is None else 0.05)
        if query.exception() is not None:
            run.error = failureLine(str(query.exception()))
        else:
            times = [p["durationMs"]["triggerExecution"] / 1000 for p in done[1:batches]]
            if times:
                run.secondsPerBatch = statistics.median(times)
            else:
                run.error = "no micro-batch finished in time"
    finally:
        query.stop()
    run.batches = len([p for p in query.recentProgress if p.get("numInputRows", 0) > 0])
    return run


def measurePath(
    spark: Any,
    target: Target,
    shape: Shape,
    path: str,
    batches: int,
    tag: str = "",
    onBatches: Callable[[int], None] | None = None,
) -> Run:
    """Write the shape into ``target`` by ``path``, with a place and a checkpoint of its own
    (``tag`` tells repeated runs of one path apart)."""
    import twophase

    label = f"{shape.source}{shape.partitions}-{path.replace(' ', '-')}{tag}"
    target.prepare(label)
    ckpt = str(target.ctx.work / f"{target.name}-{label}-ckpt")
    frame = source(spark, shape, batches, 100).selectExpr(*target.columns)
    if path.endswith("coalesced"):
        frame = frame.coalesce(spark.sparkContext.defaultParallelism)
    if path == "bare":
        writer = frame.writeStream.foreachBatch(inSlotTasks(spark, target.bareTask(label)))
    elif path.startswith("spark"):
        writer = target.sparkWriter(frame, label)
    elif path.startswith("format"):
        options = target.twophaseOptions(label)
        writer = frame.writeStream.format(target.twophaseFormat).options(**options)
    else:
        options = {**target.twophaseOptions(label), "checkpointLocation": ckpt}
        writer = frame.writeStream.foreachBatch(
            twophase.foreachBatch(target.twophaseFormat, options)
        )
    run = timeQuery(writer.option("checkpointLocation", ckpt), batches, onBatches=onBatches)
    run.checkpoint = ckpt
    if not run.error:
        run.files = target.filesWritten(label, own=path.startswith("spark"))
    return run


def engineRun(
    spark: Any,
    ctx: Context,
    shape: Shape,
    batches: int,
    fmt: str,
    coalesced: bool = False,
    tag: str = "",
    onBatches: Callable[[int], None] | None = None,
) -> Run:
    """The shape into a sink that writes nothing: Spark's ``noop`` (the engine alone) or
    ``bench.drop`` (PySpark's Python data source writer), optionally coalesced to the slots."""
    frame = source(spark, shape, batches, 100)
    if coalesced:
        frame = frame.coalesce(spark.sparkContext.defaultParallelism)
    label = f"{fmt}-{shape.source}{shape.partitions}{'-coalesced' if coalesced else ''}{tag}"
    ckpt = str(ctx.work / f"{label}-ckpt")
    writer = frame.writeStream.format(fmt).option("checkpointLocation", ckpt)
    return timeQuery(writer, batches, onBatches=onBatches)


def dropInForeachBatch(
    spark: Any,
    ctx: Context,
    shape: Shape,
    batches: int,
    tag: str = "",
    onBatches: Callable[[int], None] | None = None,
) -> Run:
    """What ``twophase.foreachBatch`` costs before its sink does anything: the batch coalesced
    to one task per slot, its rows handed to Python tasks that drop them (the floor)."""
    writer = floorWriter(spark, ctx, shape, batches, tag)
    return timeQuery(writer, batches, onBatches=onBatches)


def floorWriter(spark: Any, ctx: Context, shape: Shape, batches: int, tag: str = "") -> Any:
    """The floor's query, ready to start: ``writeStream`` with a checkpoint of its own."""
    frame = source(spark, shape, batches, 100)
    ckpt = str(ctx.work / f"drop-foreachBatch-{shape.source}{shape.partitions}{tag}-ckpt")
    writer = frame.writeStream.foreachBatch(inSlotTasks(spark, dropRows))
    return writer.option("checkpointLocation", ckpt)


def inSlotTasks(spark: Any, task: Callable[..., Any]) -> Callable[[Any, int], None]:
    """A ``foreachBatch`` function that hands each batch, coalesced to one task per slot, to
    ``task`` by ``mapInArrow`` (``task`` yields one ``rows`` row): the floor's shape."""
    slots = spark.sparkContext.defaultParallelism

    def writeBatch(df: Any, batchId: int) -> None:
        df.coalesce(slots).mapInArrow(task, "rows long").collect()

    return writeBatch


def measureShape(
    spark: Any, ctx: Context, shape: Shape, batches: int, targets: tuple[str, ...]
) -> list[list[str]]:
    """The rows of one shape: ``noop`` and ``bench.drop`` once, then every path per target."""
    if shape.maxBatches:
        batches = min(batches, shape.maxBatches)

    def engine(fmt: str, coalesced: bool = False) -> Run:
        return engineRun(spark, ctx, shape, batches, fmt, coalesced)

    noop, drop = engine("noop"), engine("bench.drop")
    noopC, dropC = engine("noop", coalesced=True), engine("bench.drop", coalesced=True)
    dropF = dropInForeachBatch(spark, ctx, shape, batches)
    log(
        f"  {shape.title}: noop {noop.shown()} s, bench.drop {drop.shown()} s; coalesced: "
        f"noop {noopC.shown()} s, bench.drop {dropC.shown()} s; dropped in foreachBatch "
        f"{dropF.shown()} s"
    )
    rows = [
        [shape.title, "-", "Spark noop sink", noop.shown(), "-", "-", _ratio(noop, noop)],
        [shape.title, "-", "bench.drop (Python)", drop.shown(), "-", "-", _ratio(noop, drop)],
        [shape.title, "-", "Spark noop sink coalesced", noopC.shown(), "-", "-",
         _ratio(noop, noopC)],
        [shape.title, "-", "bench.drop (Python) coalesced", dropC.shown(), "-", "-",
         _ratio(noop, dropC)],
        [shape.title, "-", "rows dropped by Python tasks in foreachBatch", dropF.shown(), "-",
         "-", _ratio(noop, dropF)],
    ]  # fmt: skip
    for name in targets:
        target = TARGETS[name](ctx)
        try:
            runs = {path: measurePath(spark, target, shape, path, batches) for path in PATHS}
        finally:
            target.cleanup()
        own = runs["spark"]
        for path, run in runs.items():
            shown = (
                f"{target.sparkOwn}{path[len('spark') :]}"
                if path.startswith("spark")
                else (f"twophase {path}")
            )
            log(f"  {name}: {shown} {run.shown()} s, files/batch {run.filesPerBatch()}")
            rows.append(
                [shape.title, target.title, shown, run.shown(), run.filesPerBatch(),
                 _ratio(own, run), _ratio(noop, run)]
            )  # fmt: skip
        rows[-1].append(goal(shape, name, runs, dropF))
    return rows


def goal(shape: Shape, target: str, runs: dict[str, Run], floor: Run) -> str:
    """Which of the issue's goals hold for this shape and target, in a few words, and the most
    the foreachBatch path could reach at equal task counts: Spark's own path coalesced over
    ``floor``, the same path with Python tasks that drop their rows."""
    fb = runs["foreachBatch"]
    need = GOALS[target] if shape.partitions >= 200 else 1.0
    said = []
    for name, base, want in (("vs default", runs["spark"], need),
                             ("vs coalesced", runs["spark coalesced"], 1.0)):  # fmt: skip
        ratio = _ratio(base, fb)
        held = ratio != "-" and float(ratio) >= want
        said.append(f"{name} {ratio} (>= {want:g}: {'met' if held else 'not met'})")
    return "; ".join(said) + f" (ceiling at equal tasks {_ratio(runs['spark coalesced'], floor)})"


def _ratio(a: Run, b: Run) -> str:
    if a.error or b.error or not b.secondsPerBatch:
        return "-"
    return f"{a.secondsPerBatch / b.secondsPerBatch:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.shapes", description=__doc__)
    p.add_argument("--batches", type=int, default=6, help="micro-batches per run (default 6)")
    p.add_argument("--master", default="local[2]")
    p.add_argument(
        "--shapes",
        default=DEFAULT_SHAPES,
        help=f"comma-separated indexes into the shapes, or all (default {DEFAULT_SHAPES})",
    )
    p.add_argument("--targets", default=",".join(TARGETS), help="comma-separated targets")
    p.add_argument("--quick", action="store_true", help="files at 200 partitions, 3 batches")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args(argv)
    if args.quick:
        args.shapes, args.targets, args.batches = "1", "files", 3
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")
    chosen = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    targets = tuple(t for t in args.targets.split(",") if t)
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        p.error(f"unknown targets {unknown}; choose among {', '.join(TARGETS)}")
    began = time.perf_counter()
    packages = tuple(pkg for t in targets for pkg in TARGETS[t].sessionPackages())
    conf = {k: v for t in targets for k, v in TARGETS[t].sessionConf().items()}
    spark = benchSession(args.master, 200, packages, conf)
    spark.dataSource.register(DropSink)
    ctx = Context(
        spark, Path(tempfile.mkdtemp(prefix="twophase-shapes-")), pgUrl(), bootstrapServers()
    )
    rows: list[list[str]] = []
    try:
        log("warming up every path on a small shape")
        measureShape(spark, ctx, Shape("sequence", 8, 10_000), 2, targets)
        for shape in chosen:
            log(f"measuring {shape.title}")
            rows += measureShape(spark, ctx, shape, args.batches, targets)
        slots = spark.sparkContext.defaultParallelism
    finally:
        spark.stop()
        shutil.rmtree(ctx.work, ignore_errors=True)
    report(Path(args.out), rows, args, slots, time.perf_counter() - began)
    return 0


def report(out: Path, rows: list[list[str]], args: Any, slots: int, seconds: float) -> None:
    header = ["shape", "target", "path", "s/batch", "files/batch",
              "Spark's own / path", "noop / path", "twophase foreachBatch: goals"]  # fmt: skip
    rows = [row + [""] * (len(header) - len(row)) for row in rows]
    text = (
        f"# Sinks per micro-batch, by shape and path\n\nPySpark master {args.master}, "
        f"{slots} task slots (the coalesced paths' and foreachBatch's write tasks), "
        f"{os.cpu_count()} cores; median of micro-batches 2..n of each run (n = {args.batches}, "
        f"3 at 1,000 partitions); {seconds:.0f} s in all.\n\n" + markdownTable(header, rows) + "\n"
    )
    writeResults(out, "shapes", text, header, rows)


if __name__ == "__main__":
    raise SystemExit(main())
