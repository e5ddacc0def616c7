"""``make bench-rounds``: each sink against PySpark's floor, alternated, with spread and CPU.

One run of ``make bench-shapes`` cannot settle a 5% goal: the same path moves by a fifth from
run to run, and whichever path runs first in a session pays its warm-up. Here, for each shape,
the floor (``twophase.foreachBatch``'s path with Python tasks that drop their rows) and each
target's ``twophase.foreachBatch`` (with ``--spark``, also Spark's own path for the target,
as users run it and coalesced to as many tasks) run in rounds: the floor, Spark's ``noop``
sink (the engine's ceiling), then the targets, in reverse order every other round,
``--rounds`` times. A target's ratio is the median of its per-round ratios
(the floor's seconds per batch over the target's, in the same round), so a round slowed as a
whole by the machine moves both sides; the lowest and highest of them are the spread, and the
floor's median over the target's median is shown beside it.

With ``--bare``, the floor's tasks also write the rows with the Python client twophase uses for
the target and nothing of twophase (``bench.bare``: Kafka, PostgreSQL, MariaDB, S3), so the
distance from the floor splits into what the client and its server cost and what twophase adds.

Each run also counts CPU seconds per micro-batch after the first, by role: the JVM, the Python
workers, and the target's server (the process listening on its port, with its children). The
floor has no server, so what a sink costs over the floor splits into the sink's Python time
(workers over the floor's workers) and what the server does for the rows: work no sink can
skip, and which on a shared machine takes the same cores the Spark tasks use.
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
from urllib.parse import urlsplit

from bench import shapes
from bench._common import (
    REPO,
    bootstrapServers,
    commitPercentiles,
    cpuByRole,
    markdownTable,
    pgUrl,
    writeResults,
)
from bench.drop import DropSink
from bench.session import benchSession, log
from bench.targets import TARGETS, Context, Target

FLOOR = "floor"
BARE = "bare"
"""The floor's tasks writing with the target's Python client, without twophase (``bench.bare``)."""
NOOP = "noop"
"""Spark's ``noop`` sink, one task per input partition: the engine alone, the ceiling."""


@dataclass
class Sample:
    """One run of one path: seconds per micro-batch and CPU seconds per micro-batch by role."""

    seconds: float
    commit: float = float("nan")
    """The driver's commit per micro-batch, median, in seconds (twophase's decision log)."""
    driver: float = float("nan")
    jvm: float = float("nan")
    workers: float = float("nan")
    server: float = float("nan")


@dataclass
class Runs:
    """Every round's sample of one path in one shape, in round order."""

    samples: list[Sample | None] = field(default_factory=list)

    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s is not None]

    def median(self, what: str = "seconds") -> float:
        values = [getattr(s, what) for s in self.ok()]
        values = [v for v in values if v == v]
        return statistics.median(values) if values else float("nan")


def serverProcess(address: str | None) -> Any:
    """The process listening on ``address``'s port (a URL or ``host:port``), else ``None``."""
    import psutil

    if not address:
        return None
    port = urlsplit(address if "//" in address else f"//{address}").port
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            return psutil.Process(conn.pid) if conn.pid else None
    return None


def serverCpu(proc: Any) -> float:
    """CPU seconds of a server process and its children, those it reaped included."""
    import psutil

    if proc is None:
        return float("nan")
    total = 0.0
    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return float("nan")
    for p in family:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class CpuMarks:
    """CPU by role at the end of the first micro-batch and at the end of the run."""

    def __init__(self, server: Any, batches: int) -> None:
        self.server, self.batches = server, batches
        self.marks: list[tuple[float, float, float, float]] = []

    def __call__(self, done: int) -> None:
        if (done >= 1 and not self.marks) or (done >= self.batches and len(self.marks) == 1):
            cpu = cpuByRole()
            self.marks.append((cpu.driver, cpu.jvm, cpu.workers, serverCpu(self.server)))

    def sample(self, run: shapes.Run) -> Sample | None:
        if run.error:
            log(f"    failed: {run.error}")
            return None
        sample = Sample(run.secondsPerBatch)
        if run.checkpoint:
            sample.commit = commitPercentiles(run.checkpoint)[0] / 1000
        if len(self.marks) == 2:
            n = self.batches - 1
            spent = [(b - a) / n for a, b in zip(*self.marks, strict=True)]
            sample.driver, sample.jvm, sample.workers, sample.server = spent
        return sample


def measureRound(
    spark: Any,
    ctx: Context,
    shape: shapes.Shape,
    batches: int,
    targets: list[Target],
    r: int,
    runs: dict[str, Runs],
    paths: tuple[str, ...] = ("foreachBatch",),
) -> None:
    """One round: the floor, then each target by each of ``paths`` (``bench.shapes``' path
    names), the targets in reverse order in odd rounds."""
    tag = f"-r{r}"
    serverless: tuple[tuple[str, Callable[[CpuMarks], shapes.Run]], ...] = (
        (FLOOR, lambda m: shapes.dropInForeachBatch(spark, ctx, shape, batches, tag, onBatches=m)),
        (
            NOOP,
            lambda m: shapes.engineRun(spark, ctx, shape, batches, "noop", tag=tag, onBatches=m),
        ),
    )
    for key, start in serverless:
        marks = CpuMarks(None, batches)
        run = start(marks)
        runs[key].samples.append(marks.sample(run))
        log(f"  round {r + 1}: {key} {run.shown()} s")
    for target in targets if r % 2 == 0 else list(reversed(targets)):
        server = serverProcess(target.server())
        for path in pathsOf(target, paths):
            marks = CpuMarks(server, batches)
            run = shapes.measurePath(spark, target, shape, path, batches, f"-r{r}", marks)
            runs[f"{target.name}/{path}"].samples.append(marks.sample(run))
            log(f"  round {r + 1}: {target.name} {path} {run.shown()} s")


def pathsOf(target: Target, paths: tuple[str, ...]) -> tuple[str, ...]:
    """The paths ``target`` has: all of ``paths`` but the bare client where it has none."""
    return tuple(p for p in paths if p != BARE or target.bareTitle)


def rowsOf(
    shape: shapes.Shape, runs: dict[str, Runs], targets: list[Target], paths: tuple[str, ...]
) -> list[list[str]]:
    """The shape's table rows: the floor, then each target by each path against it."""
    floor = runs[FLOOR]
    rows = [
        [shape.title, "Spark noop sink (the engine alone)", *_cells(runs[NOOP], floor)],
        [shape.title, "floor (rows dropped by Python tasks)", *_cells(floor, floor)],
    ]
    for target in targets:
        for path in pathsOf(target, paths):
            shown = (
                f"{target.sparkOwn}{path[len('spark') :]}"
                if path.startswith("spark")
                else f"bare client, no twophase: {target.bareTitle}"
                if path == BARE
                else f"twophase {path}, {target.title}"
            )
            rows.append([shape.title, shown, *_cells(runs[f"{target.name}/{path}"], floor)])
    return rows


def _cells(path: Runs, floor: Runs) -> list[str]:
    per = [
        f.seconds / p.seconds
        for f, p in zip(floor.samples, path.samples, strict=True)
        if f is not None and p is not None and p.seconds
    ]
    ratio = statistics.median(per) if per else float("nan")
    ofMedians = floor.median() / path.median() if path.ok() else float("nan")
    spread = f"{min(per):.2f}-{max(per):.2f}" if per else "-"
    over = path.median("workers") - floor.median("workers")
    return [
        f"{path.median():.3f}",
        f"{len(path.ok())}",
        f"{ratio:.2f}",
        spread,
        f"{ofMedians:.2f}",
        "-" if path is floor else _fmt(path.median("commit")),
        _fmt(path.median("driver")),
        _fmt(path.median("jvm")),
        _fmt(path.median("workers")),
        "-" if path is floor else _fmt(over),
        _fmt(path.median("server")),
    ]


def _fmt(value: float) -> str:
    return "-" if value != value else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.rounds", description=__doc__)
    p.add_argument("--rounds", type=int, default=4, help="rounds per shape (default 4)")
    p.add_argument("--batches", type=int, default=8, help="micro-batches per run (default 8)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--shapes", default="0,1", help="indexes into bench.shapes' shapes (0,1)")
    p.add_argument("--targets", default=",".join(TARGETS), help="comma-separated targets")
    p.add_argument(
        "--spark",
        action="store_true",
        help="also Spark's own path, as users run it and coalesced alike (equal write tasks)",
    )
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument(
        "--bare",
        action="store_true",
        help="also the rows written by the target's Python client without twophase (bench.bare)",
    )
    args = p.parse_args(argv)
    paths: tuple[str, ...] = ("foreachBatch",)
    paths += ("spark", "spark coalesced") if args.spark else ()
    paths += (BARE,) if args.bare else ()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")
    chosen = [shapes.SHAPES[int(i)] for i in args.shapes.split(",")]
    names = [t for t in args.targets.split(",") if t]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        p.error(f"unknown targets {unknown}; choose among {', '.join(TARGETS)}")
    began = time.perf_counter()
    packages = tuple(pkg for t in names for pkg in TARGETS[t].sessionPackages())
    conf = {k: v for t in names for k, v in TARGETS[t].sessionConf().items()}
    spark = benchSession(args.master, 200, packages, conf)
    spark.dataSource.register(DropSink)
    work = Path(tempfile.mkdtemp(prefix="twophase-rounds-"))
    ctx = Context(spark, work, pgUrl(), bootstrapServers())
    targets = [TARGETS[name](ctx) for name in names]
    rows: list[list[str]] = []
    try:
        log("warming up the floor and every target on a small shape")
        warm = shapes.Shape("rate", 8, 10_000)
        keys = [FLOOR, NOOP, *(f"{n}/{p}" for n in names for p in paths)]
        measureRound(spark, ctx, warm, 3, targets, 0, {k: Runs() for k in keys}, paths)
        for shape in chosen:
            log(f"measuring {shape.title}, {args.rounds} rounds")
            runs = {k: Runs() for k in keys}
            for r in range(args.rounds):
                measureRound(spark, ctx, shape, args.batches, targets, r, runs, paths)
            rows += rowsOf(shape, runs, targets, paths)
    finally:
        for target in targets:
            target.cleanup()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(Path(args.out), rows, args, time.perf_counter() - began)
    return 0


def report(out: Path, rows: list[list[str]], args: Any, seconds: float) -> None:
    header = ["shape", "path", "s/batch (median)", "runs", "floor / path", "spread",
              "floor median / path median",
              "driver's commit s/batch", "Python driver CPU s/batch", "JVM CPU s/batch",
              "workers CPU s/batch", "workers over floor", "server CPU s/batch"]  # fmt: skip
    load = os.getloadavg()
    text = (
        f"# Each sink against the floor, {args.rounds} alternated rounds\n\nPySpark master "
        f"{args.master}, {os.cpu_count()} cores, {args.batches} micro-batches a run (medians of "
        f"2..n); floor / path: the median of the per-round ratios, spread: their lowest and "
        f"highest; CPU per micro-batch after the "
        f"first. {seconds:.0f} s in all; load average at the end {load[0]:.1f}, "
        f"{load[1]:.1f}, {load[2]:.1f}.\n\n" + markdownTable(header, rows) + "\n"
    )
    writeResults(out, "rounds", text, header, rows)


if __name__ == "__main__":
    raise SystemExit(main())
