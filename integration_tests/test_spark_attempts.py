"""Task attempts Spark throws away, modes twophase refuses, the foreachBatch adapter, memory.

Real Spark in child processes (``spark_harness``); the sinks below are ``FilesSink``
subclasses that misbehave on purpose for one attempt and note what every attempt did in
``<workdir>/attempts/`` (a side channel from the Python workers to the test):

- a failed task attempt: Spark retries it; only the retry's output is visible and the failed
  attempt's staging is gone;
- a speculative duplicate: both attempts run, one is decided, the other is aborted;
- async progress tracking and a missing ``checkpointLocation`` fail with clear errors;
- ``twophase.foreachBatch`` survives a driver crash after the decision;
- one micro-batch several times larger than the Python worker may use is written.
"""

from __future__ import annotations

import json
import os
import resource
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from integration_tests.sink_outputs import FILES, filesStagedOf
from integration_tests.spark_cluster import StandaloneCluster
from integration_tests.spark_harness import FOREACH_BATCH, Harness, assertExactlyOnce
from twophase.protocol import TransactionContext
from twophase.settings import optionOf
from twophase.sinks.files import FilesTransaction, FilesWriter
from twophase.spark.declared import FilesSink

ATTEMPTS_DIR = "it.attemptsDir"
"""Sink option: where each attempt records what it did (one JSON file per event)."""


def record(writer: ProbedWriter, txn: FilesTransaction, event: str, **extra: Any) -> None:
    directory = writer.attemptsDir
    if not directory:
        return
    ctx = txn.ctx
    body = {
        "event": event,
        "batchId": ctx.batchId,
        "partitionId": ctx.partitionId,
        "attemptNumber": ctx.attemptNumber,
        "staging": txn.staging,
        "pid": os.getpid(),
        **extra,
    }
    name = f"{event}-b{ctx.batchId}-p{ctx.partitionId}-a{ctx.attemptNumber}-{uuid.uuid4().hex}"
    Path(directory, f"{name}.json").write_text(json.dumps(body))


def attempts(directory: Path, event: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob(f"{event}-*.json"))]


class ProbedWriter(FilesWriter):
    """The files sink's writer, with the directory its attempts record their events in."""

    attemptsDir: str | None = None


class FailingAttemptWriter(ProbedWriter):
    """Attempt 0 of partition 0 in batch 1 raises after its first write (a staged file open)."""

    def write(self, txn: FilesTransaction, batch: Any) -> None:
        super().write(txn, batch)
        ctx = txn.ctx
        if (ctx.batchId, ctx.partitionId, ctx.attemptNumber) == (1, 0, 0):
            staged = sorted(part.staging for part in txn.openParts.values())
            record(self, txn, "failing", staged=staged)
            raise RuntimeError("injected failure: batch 1 partition 0 attempt 0, after a write")


SLOW_BATCH = 1
SLOW_SECONDS = 15.0


class SlowAttemptWriter(ProbedWriter):
    """The first attempt of partition 0 in batch ``SLOW_BATCH`` to prepare stalls after
    preparing, so another attempt (Spark's speculative copy, or the original when a busy machine
    made Spark speculate before the original began) wins; the stalled attempt's prepared
    transaction is never reported. Which attempt stalls is claimed through a file, not fixed
    by its number: on a loaded machine either may prepare first."""

    def beginTransaction(self, ctx: TransactionContext) -> FilesTransaction:
        txn = super().beginTransaction(ctx)
        record(self, txn, "begin")
        return txn

    def preCommit(self, txn: FilesTransaction) -> dict[str, Any]:
        handle = super().preCommit(txn)
        record(self, txn, "prepared", files=[f["staging"] for f in handle["files"]])
        ctx = txn.ctx
        if (ctx.batchId, ctx.partitionId) == (SLOW_BATCH, 0) and self._claimStall():
            record(self, txn, "stalled", files=[f["staging"] for f in handle["files"]])
            time.sleep(SLOW_SECONDS)
        return handle

    def _claimStall(self) -> bool:
        assert self.attemptsDir, "the slow sink needs its attempts directory"
        try:
            os.close(os.open(Path(self.attemptsDir, "stall.claim"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True


class MemoryProbeWriter(ProbedWriter):
    """Puts the writing worker's address-space limit and peak RSS into every handle."""

    def preCommit(self, txn: FilesTransaction) -> dict[str, Any]:
        handle = super().preCommit(txn)
        handle["probe"] = {
            "rlimitAs": resource.getrlimit(resource.RLIMIT_AS)[0],
            "peakRssBytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "rows": txn.rows,
        }
        return handle


class ProbedFilesSink(FilesSink):
    """The files sink with a probed writer (``writerClass``)."""

    writerClass: type[ProbedWriter] = ProbedWriter

    def createWriter(self) -> FilesWriter:
        writer = self.writerClass.fromOptions(self.options)
        assert isinstance(writer, ProbedWriter)
        writer.attemptsDir = optionOf(self.options, ATTEMPTS_DIR)
        return writer


class FailingAttemptFilesSink(ProbedFilesSink):
    writerClass = FailingAttemptWriter

    @classmethod
    def name(cls) -> str:
        return "it.failingAttemptFiles"


class SlowAttemptFilesSink(ProbedFilesSink):
    writerClass = SlowAttemptWriter

    @classmethod
    def name(cls) -> str:
        return "it.slowAttemptFiles"


class MemoryProbeFilesSink(ProbedFilesSink):
    writerClass = MemoryProbeWriter

    @classmethod
    def name(cls) -> str:
        return "it.memoryProbeFiles"


def spec(cls: type) -> str:
    return f"{__name__}:{cls.__name__}"


def stagingExists(query: Harness, staging: str) -> bool:
    return bool(filesStagedOf(query.output, staging))


# -- (a) a failed task attempt ----------------------------------------------------------------


@pytest.mark.timeout(300)
def test_a_failed_task_attempt_is_retried_and_its_staging_swept(tmp_path: Path) -> None:
    attemptsDir = tmp_path / "attempts"
    attemptsDir.mkdir()
    query = Harness(
        tmp_path / "query",
        "local",
        sink=spec(FailingAttemptFilesSink),
        rows=6000,
        rowsPerBatch=2000,
        options={ATTEMPTS_DIR: str(attemptsDir)},
    )
    run = query.run()
    assert run.succeeded, run.describe()
    assert "injected failure" in run.tail(400), "Spark did not report the failed attempt"
    [failed] = attempts(attemptsDir, "failing")
    assert failed["staged"], "the failing attempt had no staged file open"
    assert not stagingExists(query, failed["staging"]), "the failed attempt's staging remains"
    state = query.decisionLog().state(1)
    assert state is not None
    decided = sorted((h.partitionId, h.attemptNumber) for h in state.handles)
    assert decided == [(0, 1), (1, 0)], f"batch 1 decided with attempts {decided}"
    assertExactlyOnce(FILES, query)
    assert len(FILES.visibleFiles(query.output)) == 3 * 2, "an extra visible file"


# -- (b) a speculative duplicate --------------------------------------------------------------


@pytest.mark.timeout(420)
def test_a_speculative_duplicate_is_aborted_after_the_decision(tmp_path: Path) -> None:
    attemptsDir = tmp_path / "attempts"
    attemptsDir.mkdir()
    cluster = StandaloneCluster(tmp_path).start()
    try:
        query = Harness(
            tmp_path / "query",
            "standalone",
            master=cluster.url,
            sink=spec(SlowAttemptFilesSink),
            rows=8000,
            rowsPerBatch=2000,
            options={ATTEMPTS_DIR: str(attemptsDir)},
            conf={
                "spark.speculation": "true",
                "spark.speculation.multiplier": "1",
                "spark.speculation.quantile": "0.1",
                "spark.speculation.minTaskRuntime": "3s",
                "spark.speculation.interval": "100ms",
                "spark.executor.cores": "1",
                "spark.cores.max": "2",
                "spark.executor.memory": "1g",
            },
        )
        run = query.run()
    finally:
        cluster.stop()
    assert run.succeeded, run.describe()
    ofPartition = [
        a
        for a in attempts(attemptsDir, "begin")
        if (a["batchId"], a["partitionId"]) == (SLOW_BATCH, 0)
    ]
    assert len({a["attemptNumber"] for a in ofPartition}) >= 2, (
        f"no second attempt of batch {SLOW_BATCH} partition 0 ran: {ofPartition}\n" + run.tail()
    )
    [stalled] = attempts(attemptsDir, "stalled")
    state = query.decisionLog().state(SLOW_BATCH)
    assert state is not None
    decided = {h.handle["staging"] for h in state.handles}
    assert stalled["staging"] not in decided, "the stalled attempt won; no duplicate to abort"
    assert stalled["files"], "the stalled attempt prepared no file"
    assert not stagingExists(query, stalled["staging"]), "the duplicate was not aborted"
    assertExactlyOnce(FILES, query)
    assert len(FILES.visibleFiles(query.output)) == 4 * 2, "an extra visible file"


# -- (c) async progress tracking, (d) no checkpointLocation: refused with a clear error -------


def assertNothingWritten(query: Harness) -> None:
    assert not FILES.visibleFiles(query.output), "a refused query wrote visible files"
    assert not FILES.prepared(query.output, None), "a refused query left staging behind"


ASYNC = {"asyncProgressTrackingEnabled": "true"}
SPARK_SINK_CHECK_OFF = {"_asyncProgressTrackingOverrideSinkSupportCheck": "true"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        (ASYNC, "Sink twophase.files does not support async progress tracking"),
        ({**ASYNC, **SPARK_SINK_CHECK_OFF}, "cannot run with asyncProgressTrackingEnabled=true"),
    ],
    ids=["spark-refuses-first", "twophase-refuses"],
)
def test_async_progress_tracking_is_refused(
    tmp_path: Path, options: dict[str, str], refusal: str
) -> None:
    """Spark 4.3 refuses async progress tracking for every sink but Kafka, memory and foreach
    before ours sees the option; with Spark's test-only override of that check (what a later
    Spark allowing Python sinks would do), twophase refuses on its own."""
    query = Harness(tmp_path / "query", "local", rows=4000, options=options, trigger="1 second")
    run = query.run()
    assert run.returncode == 1 and not run.succeeded, run.describe()
    assert refusal in run.error, run.error
    assertNothingWritten(query)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("checkpointMode", "refusal"),
    [
        ("none", 'checkpointLocation must be specified either through option("checkpointLocation"'),
        (
            "session",
            'to keep its decision log: add .option("checkpointLocation"',
        ),
    ],
    ids=["nowhere", "session-conf-only"],
)
def test_a_missing_checkpoint_location_is_refused(
    tmp_path: Path, checkpointMode: str, refusal: str
) -> None:
    """No checkpoint at all: Spark itself refuses. Only the session-wide
    spark.sql.streaming.checkpointLocation: Spark runs the query, but data sources never see
    that conf, so the sink refuses (it has nowhere to keep its decision log)."""
    query = Harness(tmp_path / "query", "local", rows=4000, checkpointMode=checkpointMode)
    run = query.run()
    assert run.returncode == 1 and not run.succeeded, run.describe()
    assert refusal in run.error, run.error
    assertNothingWritten(query)


# -- (e) the foreachBatch adapter under a driver crash ----------------------------------------


@pytest.mark.timeout(400)
def test_foreach_batch_adapter_survives_a_driver_crash_after_the_decision(
    tmp_path: Path,
) -> None:
    query = Harness(tmp_path / "query", "local", via=FOREACH_BATCH, rows=8000, rowsPerBatch=2000)
    query.crashRun("driver.afterDecision:2")
    decided = query.decisionLog().state(2)
    assert decided is not None and decided.status == "decided"
    assert len(FILES.read(query.output)) == 4000, "a decided batch became visible before commit"
    [restart] = query.restartUntilExhausted()
    assert restart.result and restart.result["batches"][0]["batchId"] == 2, "no replay of 2"
    committed = query.decisionLog().state(2)
    assert committed is not None and committed.status == "committed"
    assert committed.handleKeys == decided.handleKeys, "the replay wrote batch 2 again"
    assertExactlyOnce(FILES, query)
    assert len(FILES.visibleFiles(query.output)) == 4 * 2, "an extra visible file"


# -- (f) one micro-batch several times larger than the Python worker may use ------------------

PYSPARK_MEMORY_MB = 600
BIG_ROWS = 2_500_000
PAD_REPEATS = 100
"""Each row carries ``pad = repeat(payload, 100)``: about 1.1 kB, so the batch is ~2.8 GB."""


def arrowBytes(rows: int, padRepeats: int) -> int:
    """Bytes of Arrow data of ``rows`` rows (id, payload, pad): values plus 4-byte offsets."""
    ids = np.arange(rows, dtype=np.int64)
    digits = np.ones(rows, dtype=np.int64)
    for power in range(1, 19):
        digits += ids >= 10**power
    payload = 4 + digits  # "row-" + the digits
    return int(rows * 8 + (payload + 4).sum() + (payload * padRepeats + 4).sum())


@pytest.mark.timeout(300)
def test_a_micro_batch_larger_than_the_python_worker_memory_limit(tmp_path: Path) -> None:
    """spark.executor.pyspark.memory=600m sets RLIMIT_AS in every Python worker (PySpark's
    worker_util.setup_memory_limits; honoured in local mode): a sink that held a task's input
    would die. The batch is > 4x the limit, in one micro-batch of two tasks."""
    limit = PYSPARK_MEMORY_MB * 1024 * 1024
    batchBytes = arrowBytes(BIG_ROWS, PAD_REPEATS)
    assert batchBytes >= 4 * limit
    query = Harness(
        tmp_path / "query",
        "local",
        sink=spec(MemoryProbeFilesSink),
        rows=BIG_ROWS,
        rowsPerBatch=BIG_ROWS,
        conf={"spark.executor.pyspark.memory": f"{PYSPARK_MEMORY_MB}m"},
        columns={"id": "id", "payload": "payload", "pad": f"repeat(payload, {PAD_REPEATS})"},
    )
    run = query.run(timeout=240)
    assert run.succeeded, run.describe()
    assert [b["batchId"] for b in run.result["batches"]] == [0], "not one micro-batch"  # type: ignore[index]
    state = query.decisionLog().state(0)
    assert state is not None and len(state.handles) == 2
    probes = [h.handle["probe"] for h in state.handles]
    assert sum(p["rows"] for p in probes) == BIG_ROWS
    assert all(p["rlimitAs"] == limit for p in probes), f"the limit was not in force: {probes}"
    peak = max(p["peakRssBytes"] for p in probes)
    assert peak < limit and peak * 8 < batchBytes, f"peak RSS {peak} for a {batchBytes} batch"
    assertExactlyOnce(FILES, query)
    print(
        f"batch {batchBytes / 2**30:.2f} GiB, limit {limit / 2**20:.0f} MiB, peak RSS "
        f"{peak / 2**20:.0f} MiB per writing worker"
    )
