"""``make bench-floor``: where a 200-task micro-batch's time goes, from Spark's own Python runner.

For every Python task, Spark's Python runner logs at INFO ``Times: total = T, boot = B,
init = I, finish = F`` (milliseconds): the task's whole Python round trip as the JVM saw it,
getting a worker (a fork of PySpark's daemon, or a reused one), the worker's set-up (reading
the command: the pickled function or data source writer, its imports), and the rows
themselves. Each path runs in a child process whose JVM log is read for those lines:
``bench.drop`` (a Python sink that drops its rows: PySpark alone), ``twophase.files`` through
``format()`` (one task per partition) and ``twophase.foreachBatch`` (two write tasks), with
Spark's Python worker reuse on (and off with ``--with-no-reuse``). Prints the table and writes
``bench/results/floor.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import REPO, markdownTable
from bench.drop import DropSink

TIMES = re.compile(r"Times: total = (\d+), boot = (-?\d+), init = (\d+), finish = (\d+)")
PATHS = {
    "drop": "bench.drop (PySpark alone)",
    "files": "twophase.files, format()",
    "foreachBatch": "twophase.foreachBatch (twophase.files)",
}


def child(path: str, partitions: int, rows: int, batches: int, reuse: bool) -> None:
    """Run ``batches`` micro-batches of the shape into ``path``; print each batch's seconds."""
    import twophase
    from bench.session import benchSession

    conf = {"spark.python.worker.reuse": str(reuse).lower()}
    spark = benchSession("local[2]", 200, (), conf)
    spark.dataSource.register(DropSink)
    jvm = spark.sparkContext._jvm
    level = jvm.org.apache.logging.log4j.Level.INFO
    for name in ("org.apache.spark.api.python", "org.apache.spark.sql.execution.python"):
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
    work = Path(tempfile.mkdtemp(prefix="twophase-floor-"))
    frame = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows)
        .option("numPartitions", partitions)
        .option("startTimestamp", 0)
        .load()
        .selectExpr("value AS id", "rpad(concat('row-', value), 100, '.') AS payload")
    )
    ckpt = str(work / "ckpt")
    if path == "drop":
        writer = frame.writeStream.format("bench.drop")
    elif path == "files":
        writer = frame.writeStream.format("twophase.files").option("path", str(work / "out"))
    else:
        options = {"path": str(work / "out"), "checkpointLocation": ckpt}
        writer = frame.writeStream.foreachBatch(twophase.foreachBatch("twophase.files", options))
    query = writer.option("checkpointLocation", ckpt).trigger(processingTime="0 seconds").start()
    while len([p for p in query.recentProgress if p.get("numInputRows", 0)]) < batches:
        if query.exception() is not None:
            raise SystemExit(str(query.exception()))
        time.sleep(0.2)
    query.stop()
    done = [p for p in query.recentProgress if p.get("numInputRows", 0)]
    print(json.dumps([p["durationMs"]["triggerExecution"] / 1000 for p in done]), flush=True)
    spark.stop()


def measure(path: str, args: Any, reuse: bool) -> list[str]:
    """One path in a child process: its batches' seconds and its Python tasks' times."""
    cmd = [sys.executable, "-m", "bench.floor", "--child", path, "--batches", str(args.batches),
           "--partitions", str(args.partitions), "--rows", str(args.rows)]  # fmt: skip
    if not reuse:
        cmd.append("--no-reuse")
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=1800)
    if done.returncode != 0:
        return [PATHS[path], "on" if reuse else "off", f"failed: {done.stderr.strip()[-200:]}"]
    seconds = json.loads(done.stdout.strip().splitlines()[-1])
    times = [tuple(int(x) for x in m) for m in TIMES.findall(done.stderr)]
    perBatch = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]

    def med(i: int) -> str:
        return f"{statistics.median(t[i] for t in times):.0f}" if times else "-"

    # Most Python tasks of the first batch are start-up, so it is left out of the means.
    tasksPerBatch = len(times) / len(seconds) if seconds else 0
    return [PATHS[path], "on" if reuse else "off", f"{perBatch:.2f}", f"{tasksPerBatch:.0f}",
            med(0), med(1), med(2), med(3),
            f"{sum(t[0] for t in times) / 1000 / max(len(seconds), 1):.2f}"]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.floor", description=__doc__)
    p.add_argument("--partitions", type=int, default=200)
    p.add_argument("--rows", type=int, default=20_000, help="rows per micro-batch")
    p.add_argument("--batches", type=int, default=5)
    p.add_argument("--child", choices=sorted(PATHS), help=argparse.SUPPRESS)
    p.add_argument("--no-reuse", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--with-no-reuse",
        action="store_true",
        help="also each path with Python worker reuse off (a fork per task: many minutes)",
    )
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")
    if args.child:
        child(args.child, args.partitions, args.rows, args.batches, not args.no_reuse)
        return 0
    reuses = (True, False) if args.with_no_reuse else (True,)
    rows = [measure(path, args, reuse) for path in PATHS for reuse in reuses]
    header = ["path", "worker reuse", "s/batch (median after the first)", "Python tasks/batch",
              "total ms (median task)", "boot ms", "init ms", "finish ms",
              "task seconds/batch (sum)"]  # fmt: skip
    text = (
        f"# A micro-batch's Python tasks, from Spark's Python runner\n\nJVM rate-micro-batch, "
        f"{args.partitions} partitions, {args.rows:,} rows per batch, {args.batches} batches, "
        f"local[2]. Times per Python task as Spark logs them (ms).\n\n"
        + markdownTable(header, rows)
        + "\n"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "floor.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
