"""``make bench-latency``: how long a row takes from the source to a reader that sees only
committed data, twophase against Spark's own sink, by trigger interval.

Spark's ``rate`` source (8 partitions) stamps each row with its creation time; a reader that
sees only committed data times each row's arrival: a ``read_committed`` consumer for Kafka, a
poller of the files a reader may see (twophase's visible files; the files Spark's
``_spark_metadata`` log lists) and of PostgreSQL's committed rows. For each trigger and target,
three paths in one session: Spark's own sink, ``format("twophase.<target>")`` and
``twophase.foreachBatch``, after one short twophase query that starts the Python workers. Two
more paths have no reader and are run once per trigger: Spark's ``noop`` sink (the engine's
ceiling), ``format-floor``, a Python data source whose writer and commit do nothing
(``bench.drop``): what PySpark's ``format()`` machinery costs a batch before any sink's work,
and ``foreachBatch-floor``, a ``foreachBatch`` function whose Python tasks (as many as
twophase's, one per slot) drop their rows: the same for ``twophase.foreachBatch``'s path.

Rows created during a query's first two micro-batches (its start-up, shown on its own as
"first batch") are left out. The rate source releases each second's rows when that second
ends, on a clock started with the query, and Spark fires triggers on multiples of the
interval: between the two lies a phase of 0 to 1 s that differs from query to query and adds
to every row's latency alike. The table shows it, the percentiles with it replaced by its mean
(what the goals are checked on), and the latency from the start of the micro-batch that read
a row (what the sink's path adds: planning, tasks, commit, the reader's poll). A trigger of 0
starts each micro-batch as soon as the source has a new second of rows: no phase, and each
path's batch cost shows without a trigger's grid. ``--load N`` runs N busy processes beside the
bench, as a machine shared with other work. ``--rounds N`` runs every path N times, in
reverse order every other round, and reports the median of the rounds' figures.

A second table says where each path's micro-batch goes: the medians of Spark's trigger and
``addBatch`` (every path), and for twophase's paths ``addBatch`` split by the instants the
decision log keeps (``bench.phases.timeline``). Writes ``bench/results/latency.{md,csv}``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._common import REPO, bootstrapServers, markdownTable, pgUrl, writeCsv
from bench.drop import DropSink, dropRows
from bench.latency_targets import (
    Arrivals,
    FilesLatency,
    KafkaLatency,
    LatencyTarget,
    PostgresLatency,
    ReaderProcess,
)
from bench.phases import STEPS, collect, timeline
from bench.session import benchSession, log

PATHS = ("spark", "format", "foreachBatch", "format-floor", "foreachBatch-floor", "noop")
TARGETLESS = "-"
"""The target column of the paths without a target."""
READERLESS = ("format-floor", "foreachBatch-floor", "noop")
"""Paths with no target and no reader: only their batches' cost is measured."""
TARGETS = ("kafka", "files", "postgres")
GOALS = {1.0: (1.2, 2.0)}
"""Trigger (s) -> the p50 and p95 (s) twophase's paths must meet there."""


@dataclass
class Run:
    """One path at one trigger: latencies of the rows after the warm-up, or why it failed."""

    trigger: float
    target: str
    path: str
    rate: int = 0
    """Rows per second of the ``rate`` source."""
    rows: int = 0
    repeated: int = 0
    p50: float = float("nan")
    p95: float = float("nan")
    worst: float = float("nan")
    sinkP50: float = float("nan")
    sinkP95: float = float("nan")
    sinkWorst: float = float("nan")
    """The same from the start of the micro-batch that read the row (what the sink's path
    adds: planning, tasks, commit, the reader's poll)."""
    phase: float = float("nan")
    """The luck of the draw: the rate source releases each second's rows on its own clock
    (started with the query), Spark fires triggers on multiples of the interval, so every row
    of a query waits this long for the first trigger after its release (0 to 1 s at triggers of
    1 s and more, 0 to the interval under 1 s), and a sink's slowness adds to that."""
    fairP50: float = float("nan")
    fairP95: float = float("nan")
    """p50 and p95 with the phase replaced by its mean (half of the interval, at most half a
    second): what the goals are checked on, so that one path's luck does not decide them."""
    start: float = float("nan")
    """Seconds from ``start()`` to the end of the first micro-batch (the query's start-up)."""
    triggerMs: float = float("nan")
    addBatchMs: float = float("nan")
    """Medians of Spark's ``durationMs`` over the micro-batches that read rows (after two)."""
    steps: dict[str, float] = field(default_factory=dict)
    """``addBatch`` split (``bench.phases.STEPS``, median ms), for twophase's paths."""
    error: str = ""
    latencies: list[float] = field(default_factory=list, repr=False)


def pathWriter(target: LatencyTarget, frame: Any, name: str, path: str, label: str) -> Any:
    import twophase

    if path == "noop":
        return frame.writeStream.format("noop")
    if path == "format-floor":
        return frame.writeStream.format(DropSink.name())
    if path == "foreachBatch-floor":
        return frame.writeStream.foreachBatch(dropBatch)
    if path == "spark":
        return target.sparkWriter(frame, label)
    options = {**target.twophaseOptions(label), "checkpointLocation": str(target.work / label)}
    if path == "format":
        writer = frame.writeStream.format(f"twophase.{name}")
        for key, value in options.items():
            writer = writer.option(key, value)
        return writer
    return frame.writeStream.foreachBatch(twophase.foreachBatch(f"twophase.{name}", options))


def dropBatch(df: Any, batchId: int) -> None:
    """``foreachBatch-floor``: the batch's rows to as many Python tasks as ``twophase.foreachBatch``
    uses here (one per slot), which drop them."""
    tasks = df.sparkSession.sparkContext.defaultParallelism
    df.coalesce(tasks).mapInArrow(dropRows, "rows long").collect()


def measure(
    spark: Any, target: LatencyTarget, name: str, path: str, trigger: float, rate: int,
    seconds: float, round_: int = 0,
) -> Run:  # fmt: skip
    """Run the rate source into ``path`` for ``seconds`` while the target's reader times rows."""
    label = f"{name}_{path}_{str(trigger).replace('.', '_')}_{rate}_{round_}".lower()
    run = Run(trigger, name, path, rate)
    target.prepare(label)
    frame = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .option("numPartitions", 8)
        .load()
        .selectExpr(*target.columns)
    )
    writer = pathWriter(target, frame, name, path, label)
    if path in ("spark", *READERLESS):
        writer = writer.option("checkpointLocation", str(target.work / label))
    seen = Arrivals()
    reader = None
    if path not in READERLESS:
        reader = ReaderProcess(target.reader(label, own=path == "spark"))
        reader.start()
    started = time.time()
    query = writer.trigger(processingTime=f"{int(trigger * 1000)} milliseconds").start()
    progress: list[dict[str, Any]] = []
    reports: dict[int, dict[str, Any]] = {}
    try:
        while query.isActive and time.time() < started + seconds:
            query.awaitTermination(min(5.0, max(0.1, started + seconds - time.time())))
            collect(query, reports)  # Spark keeps only the last 100 reports
        if query.exception() is not None:
            run.error = str(query.exception()).splitlines()[0][:160]
        progress = [reports[b] for b in sorted(reports)]
    finally:
        query.stop()
        time.sleep(min(2.0 + trigger, 5.0))  # the last committed batch reaches the reader
        if reader is not None:
            seen = reader.finish()
    ends = [batchEnd(p) for p in progress]
    if ends:
        run.start = ends[0] - started
    costs(run, target.work / label, reports)
    # Steady state: rows created after the query's first two micro-batches (its start-up, and
    # the catch-up batch that follows it), and early enough that a full trigger interval and a
    # commit followed them before the stop (a batch the stop cut short is never committed).
    warmup = ends[1] if len(ends) > 1 else started + seconds
    cutoff = started + seconds - 2 * trigger - 2.0
    kept = {i: row for i, row in seen.rows.items() if warmup <= row[0] <= cutoff}
    run.repeated = seen.repeated
    run.rows = len(kept)
    run.latencies = [now - created for created, now in kept.values()]
    run.p50, run.p95, run.worst = spread(run.latencies)
    carriers = carriersOf(progress)
    fromTrigger = []
    for rowId, (_, now) in kept.items():
        began = carriers.get(rowId // rate)
        if began is not None:
            fromTrigger.append(now - began)
    run.sinkP50, run.sinkP95, run.sinkWorst = spread(fromTrigger)
    if trigger == 0:
        run.fairP50, run.fairP95 = run.p50, run.p95  # no grid of triggers: no phase
    elif 0 in seen.rows:
        # The rate source releases second k's rows at origin + k + 1 (origin: row 0's time);
        # Spark fires triggers on multiples of the interval since the epoch. Their offset is
        # the phase, the same for every batch of one query and uniform over queries.
        grain = min(trigger, 1.0)
        run.phase = (-seen.rows[0][0]) % grain
        shift = grain / 2 - run.phase
        run.fairP50, run.fairP95, _ = spread([latency + shift for latency in run.latencies])
    return run


def costs(run: Run, checkpoint: Path, reports: dict[int, dict[str, Any]]) -> None:
    """Fill ``run``'s batch costs: Spark's medians, and the split of twophase's ``addBatch``."""
    kept = [r for b, r in sorted(reports.items())[2:] if r.get("numInputRows", 0) > 0]
    if kept:
        run.triggerMs = statistics.median(r["durationMs"]["triggerExecution"] for r in kept)
        run.addBatchMs = statistics.median(r["durationMs"].get("addBatch", 0) for r in kept)
    logs = sorted(checkpoint.glob("twophase/*/sink.json"))
    if logs and reports:
        run.steps = timeline(reports, str(logs[0].parent))


def combine(runs: list[Run]) -> list[Run]:
    """One run per trigger, target and path: the median of each figure over its rounds (a
    failed round is left out, unless every round failed)."""
    groups: dict[tuple[int, float, str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.rate, run.trigger, run.target, run.path), []).append(run)
    combined = []
    for (rate, trigger, target, path), group in groups.items():
        good = [r for r in group if not r.error] or group[:1]
        merged = Run(trigger, target, path, rate, error=good[0].error)
        for name in ("rows", "repeated"):
            setattr(merged, name, int(statistics.median(getattr(r, name) for r in good)))
        for name in ("p50", "p95", "worst", "sinkP50", "sinkP95", "sinkWorst", "phase",
                     "fairP50", "fairP95", "start", "triggerMs", "addBatchMs"):  # fmt: skip
            values = [v for r in good if (v := getattr(r, name)) == v]
            setattr(merged, name, statistics.median(values) if values else float("nan"))
        for step in STEPS:
            values = [r.steps[step] for r in good if step in r.steps]
            if values:
                merged.steps[step] = statistics.median(values)
        combined.append(merged)
    return combined


def spread(values: list[float]) -> tuple[float, float, float]:
    """p50, p95 and max, NaN when there are too few values."""
    if len(values) < 2:
        return float("nan"), float("nan"), float("nan")
    cuts = statistics.quantiles(values, n=100)
    return cuts[49], cuts[94], max(values)


def carriersOf(progress: list[dict[str, Any]]) -> dict[int, float]:
    """For each second of the rate source's rows, when the micro-batch that read it began.

    The ``rate`` source's offsets count seconds since it started; a micro-batch reads the rows
    of the seconds from its start offset up to its end offset.
    """
    carriers: dict[int, float] = {}
    for p in progress:
        source = p["sources"][0]
        first = int(source["startOffset"]) if source["startOffset"] not in (None, "null") else 0
        began = batchEnd(p) - p["durationMs"]["triggerExecution"] / 1000
        for second in range(first, int(source["endOffset"])):
            carriers[second] = began
    return carriers


def batchEnd(progress: dict[str, Any]) -> float:
    """When a micro-batch of ``query.recentProgress`` ended (epoch seconds)."""
    began = datetime.strptime(progress["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
    began = began.replace(tzinfo=UTC)
    return began.timestamp() + progress["durationMs"]["triggerExecution"] / 1000


def warmUp(spark: Any, work: Path) -> None:
    """One short twophase query first, so the first path measured does not pay for starting
    the session's Python workers (every path after it finds them running)."""
    frame = spark.readStream.format("rate").option("rowsPerSecond", 100).load()
    query = (
        frame.selectExpr("value AS id", "unix_micros(timestamp) AS created")
        .writeStream.format("twophase.files")
        .option("path", str(work / "warm-up"))
        .option("checkpointLocation", str(work / "warm-up-ckpt"))
        .trigger(processingTime="1 second")
        .start()
    )
    while len(query.recentProgress) < 3 and query.isActive:
        time.sleep(0.2)
    query.stop()


def busy(stop: Any) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


@contextmanager
def load(processes: int) -> Iterator[None]:
    """``processes`` busy processes beside the bench for the duration."""
    stop = multiprocessing.Event()
    workers = [multiprocessing.Process(target=busy, args=(stop,)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        stop.set()
        for worker in workers:
            worker.join()


def fmt(value: float) -> str:
    return "-" if value != value else f"{value:.2f}"


def report(runs: list[Run], out: Path, title: str) -> str:
    header = ["rate (rows/s)", "trigger (s)", "target", "path", "rows", "p50 / p95 / max (s)",
              "phase (s)", "p50 / p95 at mean phase (s)", "p95 / Spark's", "goal",
              "from trigger p50 / p95 / max (s)", "first batch (s)"]  # fmt: skip
    rows = []
    for run in runs:
        key = (run.rate, run.trigger, run.target, "spark")
        own = next((r for r in runs if (r.rate, r.trigger, r.target, r.path) == key), None)
        goal = GOALS.get(run.trigger)
        met = "-"
        if goal and run.path != "spark" and not run.error:
            met = "met" if run.fairP50 <= goal[0] and run.fairP95 <= goal[1] else "NOT met"
        rows.append([
            f"{run.rate:,}", f"{run.trigger:g}", run.target, run.path,
            f"failed: {run.error}" if run.error else f"{run.rows:,}" + (
                f" ({run.repeated} twice)" if run.repeated else ""),
            f"{fmt(run.p50)} / {fmt(run.p95)} / {fmt(run.worst)}", fmt(run.phase),
            f"{fmt(run.fairP50)} / {fmt(run.fairP95)}",
            fmt(run.fairP95 / own.fairP95) if own and run.path != "spark" else "-",
            met, f"{fmt(run.sinkP50)} / {fmt(run.sinkP95)} / {fmt(run.sinkWorst)}",
            fmt(run.start),
        ])  # fmt: skip
    table = markdownTable(header, [r for r, run in zip(rows, runs, strict=True)
                                   if run.path not in READERLESS])  # fmt: skip
    costTable = batchCosts(runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latency.md").write_text(
        f"# End-to-end latency\n\n{title}\n\n{table}\n\n## Where a batch goes (ms)\n\n{costTable}\n"
    )
    writeCsv(out / "latency.csv", header, rows)
    return f"{table}\n\nWhere a batch goes (medians, ms):\n\n{costTable}"


def batchCosts(runs: list[Run]) -> str:
    """Each path's trigger and ``addBatch``, ``addBatch`` over its floor's (``format-floor`` for
    ``format``, ``foreachBatch-floor`` for ``foreachBatch``) and over Spark's own path for the
    target, and for twophase's paths ``addBatch`` split (``STEPS``)."""
    keyed = {(r.rate, r.trigger, r.target, r.path): r for r in runs}
    header = ["rate (rows/s)", "trigger (s)", "target", "path", "trigger", "addBatch",
              "- floor's", "- Spark's", *STEPS]  # fmt: skip
    rows = []
    for run in runs:
        floor = keyed.get((run.rate, run.trigger, TARGETLESS, f"{run.path}-floor"))
        own = keyed.get((run.rate, run.trigger, run.target, "spark"))
        ours = run.path not in (*READERLESS, "spark")
        steps = [f"{run.steps[s]:.0f}" if s in run.steps else "-" for s in STEPS]
        rows.append([
            f"{run.rate:,}", f"{run.trigger:g}", run.target, run.path, f"{run.triggerMs:.0f}",
            f"{run.addBatchMs:.0f}",
            f"{run.addBatchMs - floor.addBatchMs:+.0f}" if ours and floor else "-",
            f"{run.addBatchMs - own.addBatchMs:+.0f}" if ours and own else "-",
            *steps,
        ])  # fmt: skip
    return markdownTable(header, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triggers", default="0.1,1,10", help="trigger intervals, seconds")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--rates", default="2000", help="rows per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="per run; at least 6 trigger intervals")  # fmt: skip
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the bench")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every path, alternated")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting of the session, e.g. "
                        "spark.python.unix.domain.socket.enabled=true")  # fmt: skip
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    triggers = [float(t) for t in args.triggers.split(",")]
    rates = [int(r) for r in args.rates.split(",")]
    names = args.targets.split(",")
    paths = args.paths.split(",")
    conf = dict(setting.split("=", 1) for setting in args.conf)
    spark = benchSession("local[2]", 8, conf=conf)
    spark.dataSource.register(DropSink)
    work = Path(tempfile.mkdtemp(prefix="twophase-latency-"))
    targets: dict[str, LatencyTarget] = {}
    for name in names:
        if name == "kafka":
            targets[name] = KafkaLatency(work, bootstrapServers())
        elif name == "files":
            targets[name] = FilesLatency(work)
        elif name == "postgres":
            targets[name] = PostgresLatency(work, pgUrl())
        else:
            raise SystemExit(f"unknown target {name!r}: choose from {', '.join(TARGETS)}")
    title = (
        f"Spark {spark.version}, local[2], `rate` source at "
        f"{' / '.join(f'{r:,}' for r in rates)} rows/s, 8 partitions, "
        f"{args.load} busy processes beside it; each run at least {args.seconds:g} s"
        f"{''.join(f'; {k}={v}' for k, v in conf.items())}. Latency: "
        "a row's creation to a reader of committed data seeing it, over the rows created after "
        "each query's first two micro-batches; first batch: from `start()` to the end of the "
        "query's first micro-batch."
    )
    if args.rounds > 1:
        title += f" Medians of {args.rounds} rounds, paths in reverse order every other round."
    runs: list[Run] = []
    try:
        warmUp(spark, work)
        with load(args.load):
            for rate, trigger in ((r, t) for r in rates for t in triggers):
                seconds = max(args.seconds, 6 * trigger + 8)
                order = [(n, p) for n in targets for p in paths if p not in READERLESS]
                order += [(TARGETLESS, p) for p in paths if p in READERLESS]
                for round_ in range(args.rounds):
                    for name, path in order if round_ % 2 == 0 else order[::-1]:
                        target = targets.get(name) or next(iter(targets.values()))
                        log(f"{rate:,} rows/s, trigger {trigger:g} s, {name}, {path}, round "
                            f"{round_ + 1}: {seconds:g} s")  # fmt: skip
                        run = measure(spark, target, name, path, trigger, rate, seconds, round_)
                        log(f"  p50 {fmt(run.p50)} p95 {fmt(run.p95)} max {fmt(run.worst)}; "
                            f"from trigger {fmt(run.sinkP50)} {fmt(run.sinkP95)} "
                            f"{fmt(run.sinkWorst)}; phase {fmt(run.phase)}; over {run.rows:,} "
                            f"rows; addBatch {run.addBatchMs:.0f} ms {run.error}")  # fmt: skip
                        runs.append(run)
    finally:
        for target in targets.values():
            target.cleanup()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    combined = combine(runs)
    print(f"\n{title}\n\n{report(combined, args.out, title)}")
    return 0


def latencyKafka(spark: Any, bootstrap: str, work: Path, rate: int, seconds: int) -> list[float]:
    """``make bench``'s one latency line for twophase.kafka at a 1 s trigger."""
    run = KafkaLatency(work, bootstrap)
    try:
        return _latencies(spark, run, "kafka", rate, seconds)
    finally:
        run.cleanup()


def latencyFiles(spark: Any, work: Path, rate: int, seconds: int) -> list[float]:
    """``make bench``'s one latency line for twophase.files at a 1 s trigger."""
    return _latencies(spark, FilesLatency(work), "files", rate, seconds)


def _latencies(
    spark: Any, target: LatencyTarget, name: str, rate: int, seconds: int
) -> list[float]:
    run = measure(spark, target, name, "format", 1.0, rate, float(seconds))
    return run.latencies


if __name__ == "__main__":
    sys.exit(main())
