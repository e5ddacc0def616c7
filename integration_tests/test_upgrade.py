"""An upgrade with transactions in doubt: the previous release killed, this one resumes it.

The previous release (``releases.PREVIOUS``, built once into a venv of its own) runs one
``twophase.multi`` query from ``twophase.sequence`` into PostgreSQL, Kafka and Parquet files,
in a child process whose working directory and ``PYTHONPATH`` are outside the checkout (its
Spark workers import the old twophase too). A task of batch 2 is killed after its prepare (a
transaction prepared that no decision will name) and the driver after the decision of batch 2
(decided, not committed). This code then resumes the query until it is
drained: every target holds each row once (``twophase.verify``, and a ``read_committed`` read
of the topic), nothing is left prepared, and the records the old release wrote (format 1)
stand beside this release's (format 2).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from integration_tests.releases import PREVIOUS, releaseHome, releasePython
from integration_tests.spark_processes import (
    FAST_JVM,
    QUERY_FAILED,
    REPO_ROOT,
    killSession,
    makeSparkHome,
)
from integration_tests.test_kafka_helpers import createTopic, readTopic
from twophase import faults, verify
from twophase.coordinator import BatchStatus, DecisionLog
from twophase.coordinator.formats import LOG_FORMAT

ROWS = 40
ROWS_PER_BATCH = 10
PARTITIONS = 2
TARGETS = "orders=postgres,events=kafka,archive=files"
START_SECONDS = 240

CHILD = '''\
"""One start of the upgrade test's query; runs under either release."""
import json, os, sys

from twophase import faults

faults.markQueryProcessGroup()  # before Spark: a driver point kills the whole query
import twophase
from pyspark.sql import SparkSession, functions as F

spec = json.load(open(sys.argv[1]))
assert twophase.__file__.startswith(spec["expect"]), (twophase.__file__, spec["expect"])
spark = (
    SparkSession.builder.master("local[2,4]")  # 4: a task killed by a fault point is retried
    .appName("twophase-upgrade")
    .config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false")
    .config("spark.sql.shuffle.partitions", str(spec["partitions"]))
    .config("spark.driver.extraJavaOptions", spec["jvm"])
    .config("spark.sql.session.timeZone", "UTC")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
twophase.register(spark)
stream = (
    spark.readStream.format("twophase.sequence")
    .option("totalRows", spec["rows"])
    .option("rowsPerBatch", spec["rowsPerBatch"])
    .option("numPartitions", spec["partitions"])
    .load()
)
stream = stream.select(
    F.struct("id", "payload").alias("orders"),
    F.struct(F.col("id").cast("string").alias("key"), F.col("payload").alias("value")).alias(
        "events"
    ),
    F.struct("id", "payload").alias("archive"),
)
query = (
    stream.writeStream.format("twophase.multi")
    .options(**spec["options"])
    .option("checkpointLocation", spec["checkpoint"])
    .trigger(availableNow=True)
    .start()
)
try:
    query.awaitTermination()
except Exception as exc:
    sys.stderr.write(f"QUERY FAILED: {exc}\\n")
    sys.exit(3)
finally:
    spark.stop()
'''


class UpgradedQuery:
    """The query's checkpoint, targets and children, under either release."""

    def __init__(self, tmp: Path, pgUrl: str, table: str, bootstrap: str) -> None:
        self.tmp = tmp
        self.pgUrl = pgUrl
        self.bootstrap = bootstrap
        self.topic = createTopic(bootstrap, partitions=2, prefix="it-upgrade")
        self.sinkId = f"upgrade-{uuid.uuid4().hex[:8]}"
        self.checkpoint = tmp / "checkpoint"
        self.onceDir = tmp / "fired"
        self.onceDir.mkdir()
        self.workdir = tmp / "run"  # outside the checkout: the children's working directory
        self.workdir.mkdir()
        self.sparkHome = makeSparkHome(tmp / "spark-home")
        self.script = tmp / "child.py"
        self.script.write_text(CHILD)
        self.options = {
            "sinkId": self.sinkId,
            "targets": TARGETS,
            "orders.url": pgUrl,
            "orders.table": table,
            "orders.createTable": "true",
            "events.kafka.bootstrap.servers": bootstrap,
            "events.topic": self.topic,
            "events.transactionalIdPrefix": self.sinkId,
            # The decided transactions must outlive the restart, however slow the machine.
            "events.kafka.transaction.timeout.ms": "300000",
            "archive.path": str(tmp / "archive"),
        }
        self.starts: list[tuple[str, float, int]] = []

    @property
    def log(self) -> DecisionLog:
        return DecisionLog(str(self.checkpoint / "twophase" / self.sinkId))

    def run(self, python: Path, release: str, crashAt: str = "") -> int:
        """One start under ``python``; its exit status (``-SIGKILL`` when a point fired)."""
        src = REPO_ROOT if release == "this" else releaseHome(release) / "src"
        spec = {
            "rows": ROWS,
            "rowsPerBatch": ROWS_PER_BATCH,
            "partitions": PARTITIONS,
            "checkpoint": str(self.checkpoint),
            "options": self.options,
            "jvm": FAST_JVM,
            "expect": str(src / "twophase"),
        }
        specFile = self.tmp / f"spec-{len(self.starts)}.json"
        specFile.write_text(json.dumps(spec))
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("TWOPHASE_CRASH_") and k != "PYTHONPATH"
        }
        env.update(
            PYSPARK_PYTHON=str(python),
            SPARK_HOME=str(self.sparkHome),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOCAL_DIRS=str(self.workdir / "spark-local"),
            TWOPHASE_CRASH_ONCE_DIR=str(self.onceDir),
        )
        if crashAt:
            env[faults.ENV] = crashAt
        started = time.monotonic()
        child = subprocess.Popen(
            [str(python), str(self.script), str(specFile)],
            cwd=self.workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = child.communicate(timeout=START_SECONDS)
        except subprocess.TimeoutExpired:
            killSession(child.pid)
            output, _ = child.communicate()
            pytest.fail(f"a start of {release} did not end in {START_SECONDS} s:\n{output[-4000:]}")
        finally:
            killSession(child.pid)  # Python workers in process groups of their own
        self.starts.append((release, time.monotonic() - started, child.returncode))
        self.output = output
        return child.returncode

    def kafkaIds(self) -> list[int]:
        return sorted(int(r.key or b"-1") for r in readTopic(self.bootstrap, self.topic))

    def preparedGids(self) -> list[str]:
        with psycopg.connect(self.pgUrl, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%{self.sinkId}%",)
            )
            return [str(r[0]) for r in rows]

    def formats(self) -> dict[str, tuple[int, str | None]]:
        """Each record of the log: its format and the twophase version that wrote it."""
        found = {}
        for path in sorted(Path(self.log.url).glob("*.json")):
            body = json.loads(path.read_text())
            found[path.name] = (body.get("format", 1), body.get("twophase"))
        return found


def _killed(status: int, query: UpgradedQuery, fired: list[str]) -> None:
    assert status == -signal.SIGKILL, f"exit {status}, not killed:\n{query.output[-4000:]}"
    assert faults.firedItems(str(query.onceDir)) == fired


def test_this_release_resumes_the_previous_ones_batches_in_doubt_exactly_once(
    tmp_path: Path, pg_url: str, pg_table: str, kafka_bootstrap: str
) -> None:
    began = time.monotonic()
    old = releasePython(PREVIOUS)
    built = time.monotonic() - began
    query = UpgradedQuery(tmp_path, pg_url, pg_table, kafka_bootstrap)

    # The previous release: a task of batch 2 dies after its prepare (retried), and the driver
    # after the decision of batch 2.
    status = query.run(old, PREVIOUS, "task.afterPreCommit:2,driver.afterDecision:2")
    _killed(status, query, ["driver.afterDecision:2", "task.afterPreCommit:2"])
    decided = query.log.state(2)
    assert decided is not None and decided.status is BatchStatus.DECIDED
    assert any(h.attemptNumber > 0 for h in decided.handles), "no task of batch 2 was retried"
    written = query.formats()
    assert {f for f, _ in written.values()} == {1}, written  # all of the previous release's
    assert len(query.kafkaIds()) == 2 * ROWS_PER_BATCH  # batches 0 and 1 only
    assert query.preparedGids(), "nothing of batch 2 was left prepared in PostgreSQL"

    # This release resumes the query until it is drained.
    status = query.run(Path(sys.executable), "this")
    assert status == 0, f"exit {status}:\n{query.output[-4000:]}"
    assert status != QUERY_FAILED

    report = verify.verify("sequence", {"start": "0", "end": str(ROWS)}, "multi", query.options)
    assert report.ok, report.toJson()
    assert query.kafkaIds() == list(range(ROWS))  # read_committed: each once
    assert query.preparedGids() == []
    assert query.log.outstanding() == []
    written = query.formats()
    assert written[f"batch-{2:020d}.decided.json"][0] == 1  # the old decision, as it was
    assert written[f"batch-{2:020d}.committed.json"] == (LOG_FORMAT, _version())
    assert written[f"batch-{3:020d}.committed.json"] == (LOG_FORMAT, _version())
    newest = query.log.runs.read(max(int(n[4:14]) for n in written if n.startswith("run-")))
    assert newest is not None and newest.twophase == _version()

    seconds = time.monotonic() - began
    starts = ", ".join(f"{r} {s:.1f} s (exit {c})" for r, s, c in query.starts)
    sys.stdout.write(
        f"\nupgrade {PREVIOUS} -> this: {ROWS} rows in {ROWS // ROWS_PER_BATCH} batches of "
        f"{ROWS_PER_BATCH}, {PARTITIONS} partitions, 3 targets; venv {built:.1f} s; starts: "
        f"{starts}; {seconds:.1f} s in all\n"
    )


def _version() -> Any:
    from twophase.version import __version__

    return __version__
