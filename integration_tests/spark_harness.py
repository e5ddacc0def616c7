"""Run a twophase streaming query in a child process, crash it on purpose, restart it, verify.

The parent (a test) builds a :class:`Harness` for one work directory and calls
:meth:`Harness.run` once per query start. Each run is a child process
``python -m integration_tests.spark_harness --mode ... --sink ... --workdir ... --rows ...
--rows-per-batch ...`` started with ``start_new_session=True``; the child calls
``twophase.faults.markQueryProcessGroup()`` before the SparkSession exists, so a ``driver.*``
crash point SIGKILLs the child's whole process group (driver JVM, driver-side Python workers,
and in local-cluster mode the executor JVMs, which the in-driver Worker forks): a power cut.
A crash is armed with ``TWOPHASE_CRASH_AT=<point>[:<batch>]`` and
``TWOPHASE_CRASH_ONCE_FILE=<workdir>/crashed...``, so the restarted query runs through. The
child reads ``twophase.sequence`` (``totalRows``, ``rowsPerBatch``, ``Trigger.availableNow``)
and writes one sink; output, checkpoint and logs all live in the work directory, so tests share
nothing but the virtualenv. Verification is pyarrow only (:func:`exactlyOnceReport`).

``--source files`` reads the same rows from JSON files that the parent writes under
``<workdir>/input`` (one file per partition of each batch), through Spark's own file source
with ``maxFilesPerTrigger``: a bounded, replayable source that every PySpark has, for the
versions without Python streaming sources (``integration_tests/test_compat.py``).

Modes (``MODES``)
-----------------
``local``          ``local[2,4]``: one JVM, 2 task slots, a failed task is retried (up to 4
                   failures); plain ``local[2]`` fails the job at the first task failure.
``local-cluster``  ``local-cluster[2,1,1024]``: master and 2 workers inside the driver JVM,
                   each worker forks its own executor JVM (1 core, 1024 MB), so tasks run in
                   separate processes, as on a real cluster.
``standalone``     a real standalone cluster the test starts (:class:`StandaloneCluster`):
                   master plus 2 worker JVMs bound to 127.0.0.2 and 127.0.0.3. Needed for
                   speculation: Spark never launches a speculative copy on a host where the
                   task already ran (``TaskSetManager.dequeueTaskFromList`` skips it when
                   ``hasAttemptOnHost``), and in ``local[...]`` and ``local-cluster[...]`` every
                   executor reports the same host.

How the child processes are set up (SPARK_HOME, JVM flags, environment) is
``integration_tests.spark_processes``'s business; the standalone cluster is in
``spark_cluster``, how each sink's output is read and checked in ``sink_outputs``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from integration_tests.sink_outputs import FILES_SINK, SinkUnderTest, exactlyOnceReport
from integration_tests.spark_processes import (
    REPO_ROOT,
    childEnvironment,
    killSession,
    lastCommittedOffset,
    makeSparkHome,
    sessionBuilder,
)
from twophase.coordinator import DecisionLog

MODES: dict[str, str] = {
    "local": "local[2,4]",
    "local-cluster": "local-cluster[2,1,1024]",
}
"""Test id -> Spark master, for the modes a test can run in without starting servers."""

RUN_TIMEOUT = 300.0
"""Seconds one child run may take before the harness kills its session and fails."""

FOREACH_BATCH = "foreachBatch"
"""``--via``: write through ``twophase.foreachBatch`` instead of ``writeStream.format``."""

SEQUENCE_SOURCE = "sequence"
FILES_SOURCE = "files"
KAFKA_SOURCE = "kafka"
"""``--source``: ``twophase.sequence``, Spark's JSON file source (see the module doc), or
twophase's Kafka source with the ``--source-option`` options (``key``, ``value``, ...;
``maxOffsetsPerTrigger`` is ``--rows-per-batch``)."""
FILES_SOURCE_SCHEMA = "id BIGINT, payload STRING"


# The child: one query start.


def _keyValues(items: Iterable[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def loadSinkClass(spec: str) -> type:
    """``module:Class`` -> the class (the child imports it; workers import it by reference)."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def childMain(args: argparse.Namespace) -> int:
    """Run the query until ``availableNow`` drains the source; write ``--result`` JSON."""
    from twophase import faults

    faults.markQueryProcessGroup()  # before Spark: the JVM and every worker inherit it
    started = time.monotonic()
    workdir = Path(args.workdir)

    import twophase

    sinkClass = loadSinkClass(args.sink)
    builder = sessionBuilder(args.master, f"twophase-it-{workdir.name}", args.partitions)
    for key, value in _keyValues(args.conf).items():
        builder = builder.config(key, value)
    if args.checkpoint == "session":
        builder = builder.config("spark.sql.streaming.checkpointLocation", args.checkpointDir)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    stream = _sourceStream(spark, args)
    if args.repartition:  # a shuffle before the sink, as after an aggregation or a join
        stream = stream.repartition(args.repartition, "id")
    columns = _keyValues(args.column)
    if columns:
        stream = stream.selectExpr(*(f"{expr} AS {name}" for name, expr in columns.items()))
    options = {"path": args.output, **_keyValues(args.option)}
    if args.trigger == "availableNow":
        writer = stream.writeStream.trigger(availableNow=True)
    else:
        writer = stream.writeStream.trigger(processingTime=args.trigger)
    if args.via == FOREACH_BATCH:
        writer = writer.foreachBatch(
            twophase.foreachBatch(sinkClass, {**options, "checkpointLocation": args.checkpointDir})
        )
    else:
        spark.dataSource.register(sinkClass)
        writer = writer.format(sinkClass.name()).options(**options)
    if args.checkpoint == "option":
        writer = writer.option("checkpointLocation", args.checkpointDir)
    result: dict[str, Any] = {"ok": False, "error": None, "batches": []}
    try:
        query = writer.start()
        while not query.awaitTermination(0.5):
            if args.trigger == "availableNow":
                continue
            drained = lastCommittedOffset(Path(args.checkpointDir))
            if drained is not None and drained >= args.rows:
                query.stop()  # a processing-time trigger never stops by itself
        if query.exception() is not None:
            raise query.exception()  # type: ignore[misc]
        result["batches"] = [
            {"batchId": p["batchId"], "numInputRows": p["numInputRows"]}
            for p in query.recentProgress
        ]
        result["ok"] = True
    except Exception as exc:  # the query's failure is the result some tests look for
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["seconds"] = round(time.monotonic() - started, 2)
    Path(args.result).write_text(json.dumps(result, indent=1))
    if result["error"]:
        print(f"query failed: {result['error']}", file=sys.stderr, flush=True)
    spark.stop()
    return 0 if result["ok"] else 1


def _sourceStream(spark: Any, args: argparse.Namespace) -> Any:
    """The source's rows (``id``, ``payload``): ``twophase.sequence``, or the input files; the
    Kafka source's records (``key``, ``value``, ...)."""
    if args.source == KAFKA_SOURCE:
        import twophase

        twophase.register(spark)
        return (
            spark.readStream.format("twophase.kafka")
            .option("maxOffsetsPerTrigger", args.rows_per_batch)
            .options(**_keyValues(args.source_option))
            .load()
        )
    if args.source == FILES_SOURCE:
        return (
            spark.readStream.schema(FILES_SOURCE_SCHEMA)
            .option("maxFilesPerTrigger", args.partitions)
            .json(str(Path(args.workdir) / "input"))
        )
    from twophase.spark.sequence import SequenceSource

    spark.dataSource.register(SequenceSource)
    return (
        spark.readStream.format(SequenceSource.name())
        .option("totalRows", args.rows)
        .option("rowsPerBatch", args.rows_per_batch)
        .option("numPartitions", args.partitions)
        .load()
    )


def writeInputFiles(directory: Path, rows: int, rowsPerBatch: int, partitions: int) -> None:
    """The rows of ``[0, rows)`` as JSON files for ``--source files``: one file per partition of
    each batch, oldest first (the file source takes the oldest files first)."""
    directory.mkdir(parents=True, exist_ok=True)
    perFile = -(-rowsPerBatch // partitions)
    for number, start in enumerate(range(0, rows, perFile)):
        lines = (
            json.dumps({"id": i, "payload": f"row-{i}"})
            for i in range(start, min(start + perFile, rows))
        )
        path = directory / f"part-{number:05d}.json"
        path.write_text("\n".join(lines) + "\n")
        stamp = time.time() - 3600 + number  # distinct, increasing modification times
        os.utime(path, (stamp, stamp))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="run one start of a twophase test query (child)")
    p.add_argument("--mode", default="local", help=f"one of {', '.join(MODES)} or standalone")
    p.add_argument("--master", help="Spark master URL (default: from --mode)")
    p.add_argument("--sink", default=FILES_SINK, help="module:Class of the sink")
    p.add_argument("--via", choices=("format", FOREACH_BATCH), default="format")
    p.add_argument(
        "--source",
        choices=(SEQUENCE_SOURCE, FILES_SOURCE, KAFKA_SOURCE),
        default=SEQUENCE_SOURCE,
        help="twophase.sequence, Spark's JSON file source over <workdir>/input, or twophase.kafka",
    )
    p.add_argument("--source-option", action="append", default=[], help="KEY=VALUE (kafka)")
    p.add_argument("--workdir", required=True)
    p.add_argument("--output", help="sink path (default <workdir>/output)")
    p.add_argument("--checkpoint-dir", dest="checkpointDir", help="default <workdir>/checkpoint")
    p.add_argument(
        "--checkpoint",
        choices=("option", "session", "none"),
        default="option",
        help="how the checkpoint location is given: writer option, session conf, not at all",
    )
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--rows-per-batch", type=int, required=True)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument(
        "--repartition",
        type=int,
        default=0,
        help="shuffle the source's rows by id into this many partitions before the sink",
    )
    p.add_argument(
        "--trigger",
        default="availableNow",
        help="availableNow, or a processing-time interval ('1 second'): stops once drained",
    )
    p.add_argument(
        "--column",
        action="append",
        default=[],
        help="NAME=SQL output column over id and payload (default: id, payload as read)",
    )
    p.add_argument("--conf", action="append", default=[], help="Spark conf KEY=VALUE")
    p.add_argument("--option", action="append", default=[], help="sink option KEY=VALUE")
    p.add_argument("--result", help="result JSON path (default <workdir>/result.json)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    workdir = Path(args.workdir)
    args.master = args.master or MODES[args.mode]
    args.output = args.output or str(workdir / "output")
    args.checkpointDir = args.checkpointDir or str(workdir / "checkpoint")
    args.result = args.result or str(workdir / "result.json")
    return childMain(args)


# The parent: start, crash, restart, verify.


@dataclass
class QueryRun:
    """One child process: how it ended, its log, and the result it wrote (if it got that far)."""

    number: int
    returncode: int
    seconds: float
    log: Path
    result: dict[str, Any] | None
    crashAt: str | None

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    @property
    def succeeded(self) -> bool:
        return self.returncode == 0 and bool(self.result and self.result.get("ok"))

    @property
    def error(self) -> str:
        return str((self.result or {}).get("error") or "")

    def tail(self, lines: int = 80) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def describe(self) -> str:
        return (
            f"run {self.number} (crash armed: {self.crashAt or 'none'}) ended with "
            f"{self.returncode} after {self.seconds:.1f}s; log {self.log}; last lines:\n"
            f"{self.tail()}"
        )


@dataclass
class Harness:
    """One query (one checkpoint, one output) of one test, started as often as the test needs.

    ``sink`` is the ``module:Class`` of the sink; ``via`` is ``format`` (the data source) or
    ``foreachBatch``; ``repartition`` shuffles the rows by id before the sink (0: no shuffle);
    ``conf`` and ``options`` are extra Spark confs and sink options; ``source`` is
    ``sequence``, ``files`` (see the module doc) or ``kafka`` (``sourceOptions``).
    """

    workdir: Path
    mode: str
    sink: str = FILES_SINK
    rows: int = 8000
    rowsPerBatch: int = 2000
    partitions: int = 2
    repartition: int = 0
    via: str = "format"
    source: str = SEQUENCE_SOURCE
    conf: dict[str, str] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)
    sourceOptions: dict[str, str] = field(default_factory=dict)
    checkpointMode: str = "option"
    trigger: str = "availableNow"
    columns: dict[str, str] = field(default_factory=dict)
    master: str | None = None
    runs: list[QueryRun] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sparkHome = makeSparkHome(self.workdir / "spark-home")
        if self.source == FILES_SOURCE:
            writeInputFiles(self.workdir / "input", self.rows, self.rowsPerBatch, self.partitions)

    @property
    def output(self) -> Path:
        return self.workdir / "output"

    @property
    def checkpoint(self) -> Path:
        return self.workdir / "checkpoint"

    @property
    def batches(self) -> int:
        return -(-self.rows // self.rowsPerBatch)

    def onceFile(self, tag: str = "") -> Path:
        return self.workdir / f"crashed{tag}"

    def run(
        self,
        crashAt: str | None = None,
        *,
        onceFile: Path | None = None,
        timeout: float = RUN_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> QueryRun:
        """Start the query once and wait for the child; arm ``crashAt`` (once per ``onceFile``)."""
        number = len(self.runs) + 1
        logPath = self.workdir / f"run-{number}.log"
        resultPath = self.workdir / f"run-{number}.json"
        childEnv = self._env(crashAt, onceFile or self.onceFile(), env)
        args = [sys.executable, "-m", "integration_tests.spark_harness"]
        args += ["--mode", self.mode, "--sink", self.sink, "--via", self.via]
        args += ["--source", self.source]
        args += ["--workdir", str(self.workdir), "--result", str(resultPath)]
        args += ["--rows", str(self.rows), "--rows-per-batch", str(self.rowsPerBatch)]
        args += ["--partitions", str(self.partitions), "--checkpoint", self.checkpointMode]
        args += ["--repartition", str(self.repartition)]
        args += ["--trigger", self.trigger]
        args += [f"--column={k}={v}" for k, v in self.columns.items()]
        if self.master:
            args += ["--master", self.master]
        args += [f"--conf={k}={v}" for k, v in self.conf.items()]
        args += [f"--option={k}={v}" for k, v in self.options.items()]
        args += [f"--source-option={k}={v}" for k, v in self.sourceOptions.items()]
        started = time.monotonic()
        with logPath.open("w") as log:
            child = subprocess.Popen(
                args,
                cwd=REPO_ROOT,
                env=childEnv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                returncode = child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                killSession(child.pid)
                child.wait()
                raise AssertionError(
                    f"run {number} did not finish in {timeout:.0f}s; log {logPath}:\n"
                    + "\n".join(logPath.read_text(errors="replace").splitlines()[-80:])
                ) from None
            finally:
                leftovers = killSession(child.pid)
        result = json.loads(resultPath.read_text()) if resultPath.exists() else None
        run = QueryRun(number, returncode, time.monotonic() - started, logPath, result, crashAt)
        if leftovers:
            with logPath.open("a") as log:
                log.write(f"\n[harness] killed {leftovers} leftover process(es) of the run\n")
        print(
            f"[harness] {self.workdir.name}: run {number} ({self.mode}, crash {crashAt}) -> "
            f"{returncode} in {run.seconds:.1f}s",
            flush=True,
        )
        self.runs.append(run)
        return run

    def _env(
        self, crashAt: str | None, onceFile: Path, extra: Mapping[str, str] | None
    ) -> dict[str, str]:
        crash = {}
        if crashAt:
            crash = {"TWOPHASE_CRASH_AT": crashAt, "TWOPHASE_CRASH_ONCE_FILE": str(onceFile)}
        return {**childEnvironment(self.workdir, self.sparkHome, crash), **(extra or {})}

    # -- the crash-and-restart protocol -----------------------------------------------------

    def crashRun(self, crashAt: str, *, onceFile: Path | None = None) -> QueryRun:
        """Run with ``crashAt`` armed and check that the crash point really fired.

        ``driver.*``: the child must die by SIGKILL. ``task.*``: Spark retries the killed
        attempt and the query completes.
        """
        once = onceFile or self.onceFile()
        run = self.run(crashAt, onceFile=once)
        point, _, batch = crashAt.partition(":")
        fired = once.read_text().strip() if once.exists() else ""
        # faults writes "<point>:<batch it was reached in>"; unnumbered points fire in any batch
        assert fired == crashAt if batch else fired.startswith(f"{point}:"), (
            f"crash point {crashAt} did not fire (once-file says {fired!r}); " + run.describe()
        )
        if point.startswith("driver."):
            assert run.killed, f"expected SIGKILL at {crashAt}; " + run.describe()
        else:
            assert run.succeeded, f"Spark did not recover from {crashAt}; " + run.describe()
        return run

    def restartUntilExhausted(self, maxRuns: int = 2) -> list[QueryRun]:
        """Start the query without a crash until its checkpoint shows the source drained.

        Every restart must succeed; one is normally enough (``availableNow``).
        """
        runs = []
        while not self.exhausted():
            assert len(runs) < maxRuns, (
                f"source not drained after {maxRuns} clean restarts; " + runs[-1].describe()
            )
            run = self.run()
            assert run.succeeded, "a clean restart failed; " + run.describe()
            runs.append(run)
        return runs

    def exhausted(self) -> bool:
        """True when Spark's checkpoint commits a batch whose end offset is ``rows`` (the
        files source: the batch that reads the last input files)."""
        if self.source == FILES_SOURCE:
            commits = [int(p.name) for p in (self.checkpoint / "commits").glob("[0-9]*")]
            return bool(commits) and max(commits) + 1 >= self.batches
        last = lastCommittedOffset(self.checkpoint)
        return last is not None and last >= self.rows

    def decisionLog(self) -> DecisionLog:
        """The sink's decision log (the only one under ``<checkpoint>/twophase/``)."""
        logs = sorted((self.checkpoint / "twophase").iterdir())
        assert len(logs) == 1, f"expected one decision log, found {logs}"
        return DecisionLog(str(logs[0]))

    def sparkCommitted(self, batchId: int) -> bool:
        """Whether Spark's own checkpoint has ``commits/<batchId>``."""
        return (self.checkpoint / "commits" / str(batchId)).exists()

    def describeRuns(self) -> str:
        return "\n\n".join(r.describe() for r in self.runs)


def assertExactlyOnce(sink: SinkUnderTest, harness: Harness) -> None:
    """Every id in ``[0, rows)`` exactly once with its payload, and no debris left behind."""
    report = exactlyOnceReport(sink.read(harness.output), harness.rows)
    want = {
        "rows": harness.rows,
        "duplicates": 0,
        "missing": 0,
        "unexpected": 0,
        "wrongPayloads": 0,
    }
    assert report == want, f"{sink} output is not exactly-once: {report}\n" + (
        harness.describeRuns()
    )
    left = sink.prepared(harness.output, None)
    assert not left, f"{sink} left uncommitted debris after the final run: {left}"


if __name__ == "__main__":
    raise SystemExit(main())
