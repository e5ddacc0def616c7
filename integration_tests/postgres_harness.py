"""Run a twophase.sequence -> twophase.postgres streaming query in a child process, crash it.

A minimal runner for the PostgreSQL crash tests, next to the shared ``spark_harness`` (whose
start-up speed-ups it reuses: private ``SPARK_HOME`` without ``pyspark.zip``, C1-only JVMs,
``SPARK_LOCAL_IP``, the leftover-process sweep). It exists because these tests need what that
harness does not offer yet: output columns computed by Spark SQL expressions (every primitive
type, upsert keys) and a database rather than files as the output. The query
runs in a child of its own session (``start_new_session``) that calls
``faults.markQueryProcessGroup()`` before Spark starts, so a ``driver.*`` crash point
(``TWOPHASE_CRASH_AT=<point>:<batch>``, once per ``TWOPHASE_CRASH_ONCE_FILE``) SIGKILLs the
driver JVM and every Python worker, like a power cut. ``task.*`` points kill only the task's
Python worker, and Spark retries the task (in ``local-cluster[...]``; ``local[n]`` fails the
job at the first task failure).

The child writes the sequence source's rows (``id``, ``payload``), plus what ``columns`` adds
(Spark SQL expressions), with the sink options given, and exits 0 when the ``availableNow``
query has drained the source, 3 when the query failed (its error on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from integration_tests.spark_processes import (
    QUERY_FAILED,
    awaitDrained,
    killSession,
    makeSparkHome,
    sessionBuilder,
)
from twophase import faults

__all__ = ["QUERY_FAILED", "QuerySpec", "Run", "runChild"]


@dataclass
class QuerySpec:
    """What the child runs: source size and shape, sink options, extra columns, master."""

    checkpoint: str
    options: dict[str, str]
    rows: int = 1000
    rowsPerBatch: int = 100
    partitions: int = 2
    master: str = "local[2]"
    columns: dict[str, str] = field(default_factory=dict)
    """Output columns as Spark SQL expressions over ``id`` and ``payload``; empty keeps both."""
    sparkConf: dict[str, str] = field(default_factory=dict)


@dataclass
class Run:
    returncode: int
    stderr: str

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def tail(self, chars: int = 4000) -> str:
        return self.stderr[-chars:]


def runChild(
    spec: QuerySpec,
    logDir: Path,
    *,
    crashAt: str | None = None,
    timeout: float = 240.0,
    env: dict[str, str] | None = None,
) -> Run:
    """Run the query in a child process until it ends (or ``timeout``); return how it ended.

    ``crashAt`` arms one crash (a fresh once-file per call, so the restarted query runs
    through).
    """
    logDir.mkdir(parents=True, exist_ok=True)
    childEnv = dict(os.environ if env is None else env)
    childEnv["PYSPARK_PYTHON"] = sys.executable
    childEnv["SPARK_HOME"] = str(makeSparkHome(logDir / "spark-home"))
    childEnv["SPARK_LOCAL_IP"] = "127.0.0.1"
    repo = str(Path(__file__).resolve().parents[1])
    childEnv["PYTHONPATH"] = os.pathsep.join(p for p in (repo, childEnv.get("PYTHONPATH")) if p)
    childEnv.pop(faults.ENV, None)
    childEnv.pop(faults.ONCE_ENV, None)
    childEnv.pop(faults.GROUP_ENV, None)
    index = len(list(logDir.glob("run-*.log")))
    if crashAt:
        childEnv[faults.ENV] = crashAt
        childEnv[faults.ONCE_ENV] = str(logDir / f"crash-{index}.once")
    specFile = logDir / f"run-{index}.json"
    specFile.write_text(json.dumps(asdict(spec)))
    logPath = logDir / f"run-{index}.log"
    with logPath.open("w") as logFile:
        child = subprocess.Popen(
            [sys.executable, "-m", "integration_tests.postgres_harness", str(specFile)],
            stdout=logFile,
            stderr=subprocess.STDOUT,
            env=childEnv,
            cwd=Path(__file__).resolve().parents[1],
            start_new_session=True,
        )
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            killSession(child.pid)  # the child's own session: only our query
            child.wait()
            raise AssertionError(
                f"query did not finish within {timeout:.0f} s; log:\n{logPath.read_text()[-4000:]}"
            ) from None
        finally:
            killSession(child.pid)  # executors or workers a SIGKILLed driver left behind
    return Run(code, logPath.read_text())


def _runQuery(spec: QuerySpec) -> int:
    faults.markQueryProcessGroup()

    import twophase

    builder = sessionBuilder(spec.master, "twophase-postgres-it", spec.partitions).config(
        "spark.sql.session.timeZone", "UTC"
    )
    for key, value in spec.sparkConf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    twophase.register(spark)
    stream = (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", spec.rowsPerBatch)
        .option("totalRows", spec.rows)
        .option("numPartitions", spec.partitions)
        .load()
    )
    if spec.columns:
        stream = stream.selectExpr(*[f"{expr} AS `{name}`" for name, expr in spec.columns.items()])
    writer = stream.writeStream.format("twophase.postgres")
    for key, value in spec.options.items():
        writer = writer.option(key, value)
    query = writer.option("checkpointLocation", spec.checkpoint).trigger(availableNow=True).start()
    return awaitDrained(spark, query)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("spec", help="JSON file of a QuerySpec")
    args = parser.parse_args(argv)
    spec = QuerySpec(**json.loads(Path(args.spec).read_text()))
    return _runQuery(spec)


if __name__ == "__main__":
    raise SystemExit(main())
