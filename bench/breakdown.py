"""``make bench-profile``: where the time of each twophase sink goes, against its floors.

For each target (files, PostgreSQL, Kafka) the bench query of ``make bench`` (same source,
rows, batches and partitions) runs into four sinks in one Spark session:

- ``noop``: Spark's JVM no-op sink: the source and Spark's micro-batch engine alone;
- ``drop``: a Python stream writer that reads its Arrow input and drops it (``bench.drop``):
  the floor of any PySpark Python sink;
- ``spark``: Spark's own path for the target (Parquet sink, JDBC in ``foreachBatch``, Kafka sink);
- ``twophase``: the twophase sink.

Each run reports wall time and CPU seconds by role (the JVM: Spark's driver and local
executors; the Python workers: source readers, sink writers, planners and commit runners; the
Python driver), so ``twophase - drop`` is what the sink itself costs and ``drop - noop`` what
PySpark charges for handing rows to Python. Then the twophase run is repeated under py-spy
(``--subprocesses``, 100 Hz) attached to every PySpark daemon and the workers it forks, and the
samples are summed by the innermost Python function and by package (native time inside
pyarrow, librdkafka or libpq counts for the Python line that called it).

Writes ``bench/results/profile.md`` and the raw py-spy stacks (``profile-<target>.txt``,
collapsed-stack format, for flamegraph.pl or speedscope); prints the Markdown.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench import kafka as kb
from bench import postgres as pb
from bench._common import (
    CpuSeconds,
    bootstrapServers,
    fmtNumber,
    markdownTable,
    measureCpu,
    pgUrl,
)
from bench.drop import DropSink
from bench.files import fileStream, writeFiles
from bench.measures import TARGETS
from bench.session import benchSession, log

REPO = Path(__file__).resolve().parents[1]
SINKS = ("noop", "drop", "spark", "twophase")
SINK_NAMES = {
    "noop": "Spark noop sink (JVM)",
    "drop": "Python sink that drops its input",
    "spark": "Spark's own path",
    "twophase": "twophase",
}
WAITING = frozenset(
    {
        "pyspark/daemon.py:manager",
        "pyspark/serializers.py:read_int",
        "python3.11/selectors.py:EpollSelector.select",
        "python3.11/threading.py:Condition.wait",
    }
)
"""Innermost frames where a worker waits: the daemon's loop between calls, a socket read for
the JVM's next message, a select, a condition. py-spy does not see these processes go idle
(its idle check fails for the daemon's forked workers here: it counts far more samples than
their CPU time allows), so its figures are wall-clock; leaving these frames out of the shares
keeps the tables about work. CPU time comes from the table above (psutil)."""
PACKAGES = (
    ("twophase", "/twophase/"),
    ("pyarrow", "/pyarrow/"),
    ("pyspark", "/pyspark/"),
    ("confluent_kafka", "/confluent_kafka/"),
    ("psycopg", "/psycopg/"),
    ("sqlalchemy", "/sqlalchemy/"),
    ("fsspec", "/fsspec/"),
    ("numpy", "/numpy/"),
)


@dataclass
class Run:
    target: str
    sink: str
    seconds: float = float("nan")
    cpu: CpuSeconds = field(default_factory=CpuSeconds)


@dataclass
class Stacks:
    """py-spy samples of one run, summed by innermost frame and by package."""

    samples: int = 0
    leaves: Counter[str] = field(default_factory=Counter)
    packages: Counter[str] = field(default_factory=Counter)
    ours: Counter[str] = field(default_factory=Counter)  # inclusive, twophase functions
    kinds: Counter[str] = field(default_factory=Counter)  # by PySpark worker module
    waiting: int = 0
    """Samples in :data:`WAITING` frames, reported apart and left out of the shares."""


def pythonWorkers(root: int | None = None) -> list[int]:
    """Pids of PySpark's daemons under this process (py-spy follows their forked workers)."""
    top = psutil.Process(root or os.getpid())
    pids = []
    for proc in top.children(recursive=True):
        try:
            cmdline, parent = proc.cmdline(), proc.parent()
            parentName = Path(parent.cmdline()[0]).name if parent else ""
        except (psutil.Error, IndexError):
            continue
        if "pyspark.daemon" in cmdline and not parentName.startswith("python"):
            pids.append(proc.pid)
    return pids


def pySpyBinary() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("py-spy is missing: pip install -e '.[bench]' (make bench-profile does)")
    return found


@contextmanager
def pySpy(outDir: Path, tag: str) -> Iterator[list[Path]]:
    """Record every Python worker under this process with py-spy while the block runs."""
    binary = pySpyBinary()
    outputs: list[Path] = []
    procs: list[subprocess.Popen[bytes]] = []
    for pid in pythonWorkers():
        out = outDir / f"{tag}-{pid}.txt"
        cmd = [binary, "record", "--pid", str(pid), "--subprocesses", "--full-filenames",
               "--rate", "100", "--format", "raw", "--output", str(out)]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        outputs.append(out)
    time.sleep(1.0)  # let py-spy attach before the measured query starts
    try:
        yield outputs
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def frameName(frame: str) -> tuple[str, str]:
    """``"write (/x/twophase/sinks/files/writer.py:123)"`` ->
    ``("files/writer.py:write", "twophase")``."""
    func, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    package = next((name for name, marker in PACKAGES if marker in path), "")
    if not package:
        package = "stdlib" if "/lib/python" in path and "site-packages" not in path else "other"
    short = "/".join(Path(path).parts[-2:])
    return f"{short}:{func}", package


def workerKind(frames: list[str]) -> str:
    """The PySpark worker module of a stack's process (``pyspark.worker``, ``...sink_runner``)."""
    for frame in frames:
        if frame.startswith("process ") and "pyspark.daemon " in frame:
            return frame.rsplit("pyspark.daemon ", 1)[1].strip('"').split(".")[-1]
    return "other"


def readStacks(paths: list[Path]) -> Stacks:
    stacks = Stacks()
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            raw = [f for f in stack.split(";") if f]
            frames = [frameName(f) for f in raw if not f.startswith("process ")]
            if not frames:
                continue
            leaf, package = frames[-1]
            if leaf in WAITING:
                stacks.waiting += n  # see ``Stacks.waiting``
                continue
            stacks.samples += n
            stacks.kinds[workerKind(raw)] += n
            stacks.leaves[f"{leaf} [{package}]"] += n
            stacks.packages[package] += n
            for name in {name for name, pkg in frames if pkg == "twophase"}:
                stacks.ours[name] += n
    return stacks


def merge(paths: list[Path], dest: Path) -> None:
    with dest.open("w") as out:
        for path in paths:
            if path.exists():
                out.write(path.read_text())


def share(n: int, total: int) -> str:
    return f"{100.0 * n / total:.1f}%" if total else "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.breakdown", description=__doc__)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--rows-per-batch", type=int, default=125_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--targets", default="files,postgres,kafka")
    p.add_argument("--no-pyspy", action="store_true", help="timings and CPU only")
    p.add_argument("--master", default="local[*]")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    unknown = set(targets) - set(TARGETS)
    if unknown:
        raise SystemExit(f"unknown --targets {sorted(unknown)}; choose from {TARGETS}")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")
    url, bootstrap = pgUrl(), bootstrapServers()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="twophase-profile-"))
    rows, per, parts, width = args.rows, args.rows_per_batch, args.partitions, args.value_bytes
    kshape = kb.Shape(rows, per, parts, width)
    dests = ("twophase", "spark", "warm", "again")
    tables = {k: f"bench_profile_{k}" for k in dests}
    topics = {k: kb.createTopic(bootstrap, parts, k) for k in dests}
    spark = benchSession(args.master, parts)
    spark.dataSource.register(DropSink)
    began = time.perf_counter()

    def streamOf(target: str, n: int, batch: int) -> Any:
        if target == "files":
            return fileStream(spark, n, batch, parts, width)
        if target == "postgres":
            return pb.stream(spark, n, batch, parts)
        return kb.stream(spark, kshape, n if n != rows else None)

    def floor(target: str, fmt: str, tag: str, n: int, batch: int) -> float:
        writer = streamOf(target, n, batch).writeStream.format(fmt)
        return kb.runQuery(writer.option("checkpointLocation", str(work / tag)))

    def sinkRun(target: str, sink: str, dest: str, n: int, batch: int) -> float:
        """One query of ``n`` rows into ``sink``; ``dest`` picks the table/topic/directory."""
        ckpt = str(work / f"c-{target}-{sink}-{dest}-{time.monotonic_ns()}")
        if sink in ("noop", "drop"):
            fmt = "noop" if sink == "noop" else DropSink.name()
            writer = streamOf(target, n, batch).writeStream.format(fmt)
            return kb.runQuery(writer.option("checkpointLocation", ckpt))
        if target == "files":
            fmt = "twophase.files" if sink == "twophase" else "parquet"
            path = str(work / f"f-{sink}-{dest}-{time.monotonic_ns()}")
            return writeFiles(spark, fmt, path, ckpt, n, batch, parts, width)
        if target == "postgres":
            pb.resetTable(url, tables[dest])
            run = pb.runTwophase if sink == "twophase" else pb.runJdbc
            return run(spark, url, tables[dest], ckpt, n, batch, parts)
        fmt = "twophase.kafka" if sink == "twophase" else "kafka"
        return kb.writeKafka(
            spark, fmt, bootstrap, topics[dest], ckpt, kshape, None if n == rows else n
        )

    runs: list[Run] = []
    stacks: dict[str, Stacks] = {}
    try:
        warm = max(parts * 1000, 10_000)
        log(f"warming up ({warm:,} rows per sink)")
        for target in targets:
            for sink in SINKS:
                sinkRun(target, sink, "warm", warm, warm)
        log(f"measuring {rows:,} rows, batches of {per:,}, {parts} partitions")
        for target in targets:
            for sink in SINKS:
                run = Run(target, sink)
                with measureCpu() as cpu:
                    dest = sink if sink in dests else "warm"
                    run.seconds = sinkRun(target, sink, dest, rows, per)
                run.cpu = cpu
                runs.append(run)
                log(f"  {target} {sink}: {run.seconds:.1f} s, CPU jvm {cpu.jvm:.1f} s, "
                       f"workers {cpu.workers:.1f} s, driver {cpu.driver:.1f} s")  # fmt: skip
            if args.no_pyspy:
                continue
            with pySpy(work, f"spy-{target}") as outputs:
                seconds = sinkRun(target, "twophase", "again", rows, per)
            log(f"  {target} twophase under py-spy: {seconds:.1f} s")
            merge(outputs, out / f"profile-{target}.txt")
            stacks[target] = readStacks(outputs)
        text = report(args, runs, stacks, time.perf_counter() - began, spark.version)
        (out / "profile.md").write_text(text)
        print(text)
        return 0
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
        kb.deleteTopics(bootstrap, list(topics.values()))
        pb.dropTables(url, list(tables.values()))


def report(
    args: argparse.Namespace,
    runs: list[Run],
    stacks: dict[str, Stacks],
    seconds: float,
    sparkVersion: str,
) -> str:
    rows = args.rows
    lines = [
        "# twophase sinks: where the time goes (`make bench-profile`)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, PySpark {sparkVersion}; load average at the end "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}.",
        f"Run: `python -m bench.breakdown {' '.join(sys.argv[1:])}`.".replace("  ", " "),
        f"Rows: {rows:,}, batches of {args.rows_per_batch:,}, {args.partitions} partitions. "
        f"Total time {seconds / 60:.1f} min.",
        "",
        "## Wall time and CPU seconds by role",
        "",
        "CPU: user + system seconds spent during the run. `sink CPU` = this run's total minus "
        "the `noop` run's total for the same target: what the sink (and handing rows to it) "
        "costs on top of the source and Spark's engine.",
        "",
    ]
    header = ["target", "sink", "seconds", "rows/s", "JVM CPU s", "Python workers CPU s",
              "driver CPU s", "total CPU s", "sink CPU s", "sink CPU µs/row"]  # fmt: skip
    table = []
    noop = {r.target: r for r in runs if r.sink == "noop"}
    for r in runs:
        extra = r.cpu.total - noop[r.target].cpu.total if r.target in noop else float("nan")
        table.append([
            r.target, SINK_NAMES[r.sink], f"{r.seconds:.1f}", fmtNumber(rows / r.seconds),
            f"{r.cpu.jvm:.1f}", f"{r.cpu.workers:.1f}", f"{r.cpu.driver:.1f}",
            f"{r.cpu.total:.1f}", "-" if r.sink == "noop" else f"{extra:.1f}",
            "-" if r.sink == "noop" else f"{extra / rows * 1e6:.1f}",
        ])  # fmt: skip
    lines += [markdownTable(header, table), ""]
    for target, st in stacks.items():
        lines += [
            f"## py-spy: twophase {target}, Python workers ({st.samples:,} samples at 100 Hz)",
            "",
            f"Left out: {st.waiting:,} samples of workers waiting (the daemon's loop between "
            "calls, socket reads for the JVM's next message, select, condition waits): "
            "py-spy cannot tell these workers idle, so its samples are wall-clock.",
            "",
        ]
        sections = (
            ("By PySpark worker (the module the daemon forked it for):", "worker", st.kinds, None),
            ("By package (innermost Python frame; native code counts for its caller):",
             "package", st.packages, None),
            ("Innermost functions (top 15):", "function [package]", st.leaves, 15),
            ("twophase functions, inclusive (anywhere on the stack; top 10):", "function",
             st.ours, 10),
        )  # fmt: skip
        for title, first, counts, top in sections:
            cells = [[k, fmtNumber(v), share(v, st.samples)] for k, v in counts.most_common(top)]
            lines += [title, "", markdownTable([first, "samples", "share"], cells), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
