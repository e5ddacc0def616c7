"""What the benchmarks share: service addresses, timing results, commit times, memory, output.

``bench.postgres``, ``bench.kafka`` and ``bench.bench`` (``make bench``) import from here; only
the standard library, pyarrow and twophase at import time (psutil and matplotlib lazily).
"""

from __future__ import annotations

import csv
import io
import math
import os
import statistics
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def serviceValue(name: str, hint: str = "run make services") -> str:
    """``name`` from the environment, else from the repository's ``.services.env``."""
    value = os.environ.get(name)
    if not value and (REPO / ".services.env").is_file():
        for line in (REPO / ".services.env").read_text().splitlines():
            if line.strip().startswith(f"export {name}="):
                value = line.split("=", 1)[1].strip()
    if not value:
        raise SystemExit(f"{name} is not set and .services.env has none: {hint}")
    return value


def pgUrl() -> str:
    return serviceValue("TWOPHASE_PG_URL")


def bootstrapServers() -> str:
    return serviceValue("TWOPHASE_KAFKA_BOOTSTRAP")


def sequenceStream(spark: Any, rows: int, rowsPerBatch: int, partitions: int, *columns: str) -> Any:
    """``twophase.sequence`` rows 0..rows-1 in batches of ``rowsPerBatch``, as ``columns``."""
    return (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", rowsPerBatch)
        .option("totalRows", rows)
        .option("numPartitions", partitions)
        .load()
        .selectExpr(*columns)
    )


@dataclass
class Result:
    """One timed run: ``rows`` in ``seconds`` (``rate`` rows/s)."""

    name: str
    rows: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


def ratio(a: float, b: float) -> float:
    """``a / b``, NaN when either side is missing or ``b`` is zero."""
    if b == 0 or math.isnan(a) or math.isnan(b):
        return float("nan")
    return a / b


def commitLine(ckpt: str) -> str:
    """The ``commit time`` line of ``twophase status --checkpoint <ckpt>``."""
    from twophase.cli.status import status

    out = io.StringIO()
    status(ckpt, None, False, out)
    lines = [line.strip() for line in out.getvalue().splitlines() if "commit time" in line]
    return lines[0] if lines else "no commit times in the log"


def commitPercentiles(ckpt: str) -> tuple[float, float, int]:
    """Driver commit time per batch from the decision log(s): p50 ms, p95 ms, batches."""
    from twophase.cli.status import commitTimes, percentile
    from twophase.coordinator import DecisionLog
    from twophase.coordinator.paths import sinkLogLocations

    times: list[float] = []
    for _, url in sinkLogLocations(ckpt):
        times += commitTimes(DecisionLog(url))
    if not times:
        return float("nan"), float("nan"), 0
    return statistics.median(times) * 1000, percentile(times, 0.95) * 1000, len(times)


def percentiles(values: Sequence[float]) -> tuple[float, float, float]:
    """p50, p95 and max of ``values`` (nearest rank); NaNs when empty."""
    if not values:
        return float("nan"), float("nan"), float("nan")
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return statistics.median(ordered), p95, ordered[-1]


@dataclass
class MemoryPeaks:
    """Peak resident memory (bytes) seen by :func:`sampleMemory`, by role."""

    driver: int = 0  # the root process: the Python driver (Spark) or client (PyFlink)
    jvm: int = 0  # JVMs under it: Spark's driver with its local executors, Flink's mini cluster
    workers: int = 0  # Python worker processes (Spark's pyspark.daemon, Flink's Beam workers)
    samples: int = 0


def classify(cmdline: Sequence[str], isRoot: bool) -> str:
    """Which :class:`MemoryPeaks` bucket a process belongs to, from its command line."""
    if isRoot:
        return "driver"
    if cmdline and "java" in Path(cmdline[0]).name:
        return "jvm"
    return "workers"


@contextmanager
def sampleMemory(
    root: int | None = None, children: bool = True, interval: float = 0.2
) -> Iterator[MemoryPeaks]:
    """Sample the RSS of process ``root`` (default: this one) and its descendants in a thread.

    Peaks are per bucket (the sum over a bucket's processes at one sample).
    """
    import psutil

    peaks = MemoryPeaks()
    top = psutil.Process(root or os.getpid())

    def sample() -> None:
        sums = {"driver": 0, "jvm": 0, "workers": 0}
        try:
            procs = [top, *(top.children(recursive=True) if children else [])]
        except psutil.Error:
            procs = []
        for proc in procs:
            try:
                sums[classify(proc.cmdline(), proc.pid == top.pid)] += proc.memory_info().rss
            except psutil.Error:
                continue
        peaks.driver = max(peaks.driver, sums["driver"])
        peaks.jvm = max(peaks.jvm, sums["jvm"])
        peaks.workers = max(peaks.workers, sums["workers"])
        peaks.samples += 1

    with sampling(sample, interval, "bench-memory"):
        yield peaks


@contextmanager
def sampling(sample: Callable[[], None], interval: float, name: str) -> Iterator[None]:
    """Call ``sample()`` every ``interval`` s on a thread of its own while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            sample()
            stop.wait(interval)

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@dataclass
class CpuSeconds:
    """CPU time (user + system) spent during one run, by the roles of :func:`classify`."""

    driver: float = 0.0
    jvm: float = 0.0
    workers: float = 0.0

    @property
    def total(self) -> float:
        return self.driver + self.jvm + self.workers


def cpuByRole(root: int | None = None) -> CpuSeconds:
    """Cumulative CPU seconds of ``root`` (default: this process) and its descendants, by role.

    Python workers that already exited still count: their time is in the ``children_*`` times
    of the process that reaped them (the daemon, or the JVM for workers it spawned itself).
    Profilers (py-spy) started by the bench are left out.
    """
    import psutil

    cpu = CpuSeconds()
    top = psutil.Process(root or os.getpid())
    for proc in [top, *top.children(recursive=True)]:
        try:
            cmdline = proc.cmdline()
            times = proc.cpu_times()
        except psutil.Error:
            continue
        if any("py-spy" in part for part in cmdline[:2]):
            continue
        own, reaped = times.user + times.system, times.children_user + times.children_system
        role = classify(cmdline, proc.pid == top.pid)
        if role == "driver":
            cpu.driver += own
        elif role == "jvm":
            cpu.jvm += own
            cpu.workers += reaped
        else:
            cpu.workers += own + reaped
    return cpu


@contextmanager
def measureCpu(root: int | None = None) -> Iterator[CpuSeconds]:
    """CPU seconds by role spent inside the ``with`` block (filled in when it ends)."""
    spent = CpuSeconds()
    before = cpuByRole(root)
    try:
        yield spent
    finally:
        after = cpuByRole(root)
        spent.driver = after.driver - before.driver
        spent.jvm = after.jvm - before.jvm
        spent.workers = after.workers - before.workers


def fmtNumber(value: float, digits: int = 0) -> str:
    """``value`` with thousands separators, ``-`` when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def markdownTable(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub Markdown table, columns padded to their widest cell."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def writeCsv(path: Path, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(header)
        writer.writerows(rows)


def writeResults(
    out: Path, name: str, text: str, header: Sequence[str], rows: Sequence[Sequence[object]]
) -> None:
    """Write ``<name>.md`` (``text``) and ``<name>.csv`` into ``out``, and print ``text``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(text)
    writeCsv(out / f"{name}.csv", header, rows)
    print(text)
