"""``twophase demo``: a streaming pipeline that survives a real SIGKILL and proves exactly-once.

sequence source -> files sink (Parquet), no servers. The query runs in a child process of its
own session; the demo SIGKILLs that whole process group partway (driver, JVM, Python workers:
a power cut, not an exception), looks at what the crash left behind, restarts the query from
its checkpoint, and checks that the output holds every id exactly once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds

from twophase import faults
from twophase.cli.console import LiveDisplay, LiveRow
from twophase.coordinator import DecisionLog
from twophase.sinks.files import defaultStagingPath
from twophase.sinks.files.layout import attemptOfStagedFile

log = logging.getLogger(__name__)

PROGRESS_PREFIX = "TWOPHASE-PROGRESS "


@dataclass(frozen=True)
class DemoPlan:
    """Where and how much: the demo's parameters."""

    workdir: Path
    rows: int
    rowsPerBatch: int
    partitions: int
    killAfterFraction: float

    @property
    def output(self) -> Path:
        return self.workdir / "output"

    @property
    def checkpoint(self) -> Path:
        return self.workdir / "checkpoint"

    @property
    def batches(self) -> int:
        return -(-self.rows // self.rowsPerBatch)


def runQuery(plan: DemoPlan) -> None:
    """Child process: run the pipeline until the source is exhausted, printing progress."""
    faults.markQueryProcessGroup()
    from pyspark.sql import SparkSession

    import twophase

    spark = (
        SparkSession.builder.master(f"local[{plan.partitions}]")
        .appName("twophase-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(plan.partitions))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    twophase.register(spark)
    stream = (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", plan.rowsPerBatch)
        .option("totalRows", plan.rows)
        .option("numPartitions", plan.partitions)
        .load()
    )
    query = (
        stream.writeStream.format("twophase.files")
        .option("path", str(plan.output))
        .option("checkpointLocation", str(plan.checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    seen = 0
    while query.isActive:
        query.awaitTermination(1)
        seen = _emitProgress(query.recentProgress, seen)
    _emitProgress(query.recentProgress, seen)
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    spark.stop()


def _emitProgress(progress: list[Any], seen: int) -> int:
    for item in progress[seen:]:
        text = item.json if hasattr(item, "json") else json.dumps(item, default=str)
        sys.stdout.write(PROGRESS_PREFIX + text.replace("\n", " ") + "\n")
    sys.stdout.flush()
    return len(progress)


def _startChild(plan: DemoPlan, logFile: TextIO, crashAt: str | None) -> subprocess.Popen[str]:
    env = dict(os.environ, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    env.pop(faults.ENV, None)
    if crashAt:
        env[faults.ENV] = crashAt
    args = [sys.executable, "-m", "twophase.cli.demo", "--child", str(plan.workdir)]
    args += ["--rows", str(plan.rows), "--rows-per-batch", str(plan.rowsPerBatch)]
    args += ["--partitions", str(plan.partitions)]
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=logFile, text=True, env=env, start_new_session=True
    )


def _committedBatches(plan: DemoPlan) -> int:
    root = plan.checkpoint / "twophase"
    if not root.exists():
        return 0
    return sum(DecisionLog(str(d)).status()["committedBatches"] for d in root.iterdir())


def _stagingAttempts(plan: DemoPlan) -> set[str]:
    """Attempts with staged files on disk, as handles name them (``<sink tag>/<attempt>``)."""
    staging = Path(defaultStagingPath(str(plan.output)))
    if not staging.exists():
        return set()
    return {
        f"{sink.name}/{attempt}"
        for sink in staging.iterdir()
        for staged in sink.iterdir()
        if (attempt := attemptOfStagedFile(staged.name)) is not None
    }


def _outstandingHandles(plan: DemoPlan) -> list[dict[str, Any]]:
    """Handles of batches the log shows decided but not committed."""
    root = plan.checkpoint / "twophase"
    if not root.exists():
        return []
    return [
        h["handle"]
        for d in root.iterdir()
        for b in DecisionLog(str(d)).status()["outstanding"]
        for h in b["handles"]
    ]


class DemoProgress:
    """The demo's live row on a terminal: the step it is at, the batches committed of the
    plan's, the rows they hold (a batch run again after the crash counted once)."""

    def __init__(self, row: LiveRow) -> None:
        self.row = row
        self.rowsByBatch: dict[int, int] = {}

    def step(self, name: str) -> None:
        self.row.show(name=name)

    def committed(self, batchId: int, rows: int) -> None:
        self.rowsByBatch[batchId] = rows
        written = sum(self.rowsByBatch.values())
        self.row.show(done=len(self.rowsByBatch), detail=f"{written:,} rows written")


def _follow(
    child: subprocess.Popen[str], display: LiveDisplay, progress: DemoProgress, run: str
) -> tuple[int, float]:
    """Stream the child's progress lines to the display; return (exit code, seconds)."""
    assert child.stdout is not None
    rows, started = 0, time.monotonic()
    for line in child.stdout:
        if not line.startswith(PROGRESS_PREFIX):
            continue
        batch = json.loads(line[len(PROGRESS_PREFIX) :])
        rows += int(batch.get("numInputRows", 0))
        progress.step(f"{run}: writing")
        progress.committed(int(batch["batchId"]), int(batch.get("numInputRows", 0)))
        display.say(f"  batch {batch['batchId']:>3}: {rows:>10,} rows read by this run\n")
    return child.wait(), time.monotonic() - started


def verifyOutput(plan: DemoPlan) -> dict[str, int]:
    """Count rows, duplicates, missing ids and wrong payloads in the committed output."""
    table = ds.dataset(str(plan.output), format="parquet").to_table(columns=["id", "payload"])
    ids = table.column("id")
    expectedPayload = pc.binary_join_element_wise("row-", pc.cast(ids, "string"), "")
    wrongPayloads = len(table) - pc.sum(pc.equal(table.column("payload"), expectedPayload)).as_py()
    unique = np.unique(ids.to_numpy())
    expected = np.arange(plan.rows, dtype=np.int64)
    return {
        "rows": len(table),
        "duplicates": len(table) - len(unique),
        "missing": len(np.setdiff1d(expected, unique, assume_unique=True)),
        "unexpected": len(np.setdiff1d(unique, expected, assume_unique=True)),
        "wrongPayloads": int(wrongPayloads or 0) if len(table) else 0,
    }


def runDemo(plan: DemoPlan, out: TextIO = sys.stdout) -> int:
    """Run, crash, restart, verify; print a summary. Returns the process exit code.

    On a terminal a live row below the lines shows the step, the batches committed of the
    plan's and the rows written (``LiveDisplay``); elsewhere only the lines."""
    with LiveDisplay(out, "batches") as display:
        progress = DemoProgress(display.row("run 1: starting Spark", total=plan.batches))
        return _runDemo(plan, display, progress)


def _runDemo(plan: DemoPlan, display: LiveDisplay, progress: DemoProgress) -> int:
    say = display.say
    if plan.workdir.exists():
        shutil.rmtree(plan.workdir)
    plan.workdir.mkdir(parents=True)
    sparkLog = (plan.workdir / "spark.log").open("w")
    crashBatch = max(1, int(plan.batches * plan.killAfterFraction))
    say(
        f"twophase demo: {plan.rows:,} rows in {plan.batches} batches of {plan.rowsPerBatch:,}, "
        f"sequence -> files ({plan.output})\n"
        f"run 1: SIGKILL of the whole query (driver JVM and Python workers) in batch "
        f"{crashBatch}, after its decision and its first committed transaction\n"
    )
    started = time.monotonic()
    crashAt = f"driver.betweenCommits:{crashBatch}"
    code, secs1 = _follow(_startChild(plan, sparkLog, crashAt), display, progress, "run 1")
    if code != -signal.SIGKILL:
        say(f"run 1 ended with exit code {code} instead of SIGKILL; see {sparkLog.name}\n")
        return 2
    progress.step("crash: reading the log")
    committedAtCrash = _committedBatches(plan)
    outstandingHandles = _outstandingHandles(plan)
    outstanding = len(outstandingHandles)
    orphans = len(_stagingAttempts(plan) - {h.get("staging") for h in outstandingHandles})
    say(
        f"crash after {secs1:.1f}s: the log holds {committedAtCrash} committed batches and "
        f"{outstanding} decided-but-unfinished transactions; {orphans} undecided staged attempts\n"
        "run 2: restarting from the checkpoint\n"
    )
    progress.step("run 2: restarting")
    code, _ = _follow(_startChild(plan, sparkLog, None), display, progress, "run 2")
    elapsed = time.monotonic() - started
    if code != 0:
        say(f"the restarted query failed (exit {code}); see {sparkLog.name}\n")
        return 2
    progress.step("checking the output")
    result = verifyOutput(plan)
    leftover = len(_stagingAttempts(plan))
    exact = (
        result["rows"] == plan.rows
        and not result["duplicates"]
        and not result["missing"]
        and not result["unexpected"]
        and not result["wrongPayloads"]
        and leftover == 0
    )
    say(
        "\nsummary\n"
        f"  rows expected                  {plan.rows:>12,}\n"
        f"  rows in output                 {result['rows']:>12,}\n"
        f"  duplicated / missing / wrong   {result['duplicates']:>4,} / {result['missing']:,}"
        f" / {result['unexpected'] + result['wrongPayloads']:,}\n"
        f"  batches committed              {_committedBatches(plan):>12,}\n"
        f"  transactions recovered         {outstanding:>12,}  (decided before the crash)\n"
        f"  staged attempts aborted        {orphans:>12,}  (prepared, never decided)\n"
        f"  staging left behind            {leftover:>12,}\n"
        f"  throughput                     {plan.rows / elapsed:>12,.0f} rows/s  (wall clock of "
        "both runs, Spark start-up included)\n"
        f"  result: {'EXACTLY ONCE' if exact else 'VIOLATION'}\n"
    )
    return 0 if exact else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="twophase demo", description=__doc__)
    p.add_argument("--dir", dest="workdir", default="twophase-demo", help="work directory")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--rows-per-batch", type=int, default=50_000)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--kill-after", type=float, default=0.4, help="fraction of batches")
    p.add_argument("--child", metavar="WORKDIR", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    plan = DemoPlan(
        workdir=Path(args.child or args.workdir).resolve(),
        rows=args.rows,
        rowsPerBatch=args.rows_per_batch,
        partitions=args.partitions,
        killAfterFraction=args.kill_after,
    )
    if args.child:
        runQuery(plan)
        return 0
    return runDemo(plan)


if __name__ == "__main__":
    raise SystemExit(main())
