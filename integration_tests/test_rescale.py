"""A query restarted from its checkpoint with another number of partitions stays exactly once.

The ``multi`` pipeline (``integration_tests.chaos.pipeline``: twophase.sequence -> PostgreSQL
and Kafka under one decision, the two sinks whose transactions are tied to a partition or a
pooled id) runs three starts from one checkpoint, 8 -> 200 -> 8 partitions, with a kill in each
shape:

1. 8 partitions, the driver killed right after deciding batch 1: 8 decided handles are left for
   the next start to commit;
2. 200 partitions: batch 1 is replayed (decided: nothing is written again) and the driver is
   killed before deciding batch 2: 200 prepared transactions of the wide shape are left
   behind, most of them for partitions the next start never runs;
3. 8 partitions with one task attempt killed after preparing batch 3: the start sweeps the wide
   shape's leftovers, replays batch 2 and drains the source.

Then every id is in both systems once and neither holds anything prepared. The PostgreSQL target
prepares partitions 0-49 and stages the others (``maxPreparedPartitions=50``), so the wide shape
leaves both kinds behind. Flink's rescale and
pooled-id bugs (FLINK-40626, FLINK-40689) are the failures this looks for: a leftover of a
partition or id the new shape does not use, committed twice or never swept.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from integration_tests.chaos.pipeline import PipelineSpec
from integration_tests.chaos.setup import prepare, servicesFromEnvironment, verifyOutput
from integration_tests.spark_processes import (
    REPO_ROOT,
    childEnvironment,
    killSession,
    makeSparkHome,
)
from integration_tests.test_kafka_spark import openTransactions
from twophase import faults
from twophase.coordinator.paths import sinkLogLocations
from twophase.sinks.postgres.staging import STAGING_SUFFIX, TOKEN_COLUMN
from twophase.sinks.relational.naming import sinkPrefix

ROWS_PER_BATCH = 400
BATCHES = 4
SHAPES = (
    (8, "driver.afterDecision:1"),
    (200, "driver.beforeDecision:2"),
    (8, "task.afterPreCommit:3"),
)
"""(partitions, crash point) of each start, in order."""

pytestmark = pytest.mark.timeout(900)


def start(spec: PipelineSpec, number: int, crashAt: str) -> int:
    """One start of the pipeline with ``crashAt`` armed (once); its exit code."""
    workdir = Path(spec.workdir)
    specPath = workdir / f"spec-{number}.json"
    spec.save(specPath)
    onceDir = workdir / f"once-{number}"
    onceDir.mkdir(parents=True, exist_ok=True)
    crash = {faults.ENV: crashAt, faults.ONCE_DIR_ENV: str(onceDir)}
    env = childEnvironment(workdir, makeSparkHome(workdir / "spark-home"), crash)
    with (workdir / f"start-{number}.log").open("w") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "integration_tests.chaos.pipeline", str(specPath)],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = child.wait(timeout=600)
        finally:
            killSession(child.pid)
    fired = faults.firedItems(str(onceDir))
    assert fired == [crashAt], f"start {number}: {crashAt} did not fire ({fired}); " + tail(
        workdir / f"start-{number}.log"
    )
    return code


def tail(log: Path, lines: int = 60) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def sinkId(spec: PipelineSpec) -> str:
    logs = [name for name, _ in sinkLogLocations(spec.checkpoint)]
    assert len(logs) == 1, f"expected one sink log in {spec.checkpoint}, found {logs}"
    return logs[0]


def leftovers(spec: PipelineSpec) -> list[str]:
    """What the two targets still hold: prepared transactions and staged rows in PostgreSQL,
    open transactions in Kafka."""
    sink = sinkId(spec)
    with psycopg.connect(spec.pgUrl, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)",
            (sinkPrefix(f"{sink}-orders"),),
        ).fetchall()
        staged = conn.execute(
            sql.SQL("SELECT DISTINCT {} FROM {}").format(
                sql.Identifier(TOKEN_COLUMN),
                sql.Identifier(*(spec.table + STAGING_SUFFIX).split(".")),  # schema.table
            )
        ).fetchall()
    held = [str(r[0]) for r in rows] + [f"staged {r[0]}" for r in staged]
    return held + openTransactions(spec.bootstrap, f"twophase-{sink}-events")


def test_eight_to_two_hundred_to_eight_partitions_with_kills_is_exactly_once(
    tmp_path: Path,
) -> None:
    pipeline = "multi"
    workdir = (tmp_path / pipeline).resolve()
    workdir.mkdir(parents=True)
    services = servicesFromEnvironment()
    spec = prepare(pipeline, workdir, services, BATCHES * ROWS_PER_BATCH, ROWS_PER_BATCH)
    spec.master = "local[2,4]"
    spec.sinkOptions["orders.maxPreparedPartitions"] = "50"
    # Kafka's default timeout: the chaos harness's short one is for its outage, not wanted here.
    del spec.sinkOptions["events.kafka.transaction.timeout.ms"]
    for number, (partitions, crashAt) in enumerate(SHAPES, start=1):
        spec.partitions = partitions
        code = start(spec, number, crashAt)
        log = tail(workdir / f"start-{number}.log")
        if crashAt.startswith("driver."):
            assert code == -signal.SIGKILL, f"start {number} was not killed ({code}):\n{log}"
        else:
            assert code == 0, f"start {number} did not drain the source ({code}):\n{log}"
    report = verifyOutput(spec)
    assert report.ok, f"{pipeline} after 8 -> 200 -> 8 partitions: {report}"
    assert leftovers(spec) == [], f"{pipeline}: left prepared after draining"
