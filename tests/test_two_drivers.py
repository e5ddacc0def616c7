"""Two drivers on one decision log: the newest run holds it, an older one never decides again.

No Spark and no server: two coordinators over one log directory on local disk (and fsspec's
memory filesystem), each with its own run, writing through the real files sink into one output
directory, read back as users read it (pyarrow). Each test is one interleaving of the two
drivers from docs/protocol.md ("Two drivers, one checkpoint"); integration_tests/
test_two_drivers.py runs the same on the S3 server and under Spark.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from twophase.coordinator import (
    Coordinator,
    CoordinatorSettings,
    DecisionLog,
    Driver,
    DriverFencedError,
    UnfencedLogStoreError,
)
from twophase.coordinator.records import linkName
from twophase.coordinator.runs import RUNS_KEPT
from twophase.coordinator.storage import LogStorage
from twophase.protocol import TaskResult, TransactionContext
from twophase.sinks.files import FilesCommitter, FilesSettings, FilesWriter

SINK = "s1"
QUERY = "q1"
ROWS = 4
SETTINGS = CoordinatorSettings(retryInitialSeconds=0.001, retryMaxSeconds=0.01)


@dataclass
class Pipeline:
    """One sink: its output directory and decision log, shared by every driver."""

    output: str
    logUrl: str
    sinkId: str = SINK

    def settings(self) -> FilesSettings:
        return FilesSettings.fromOptions({"path": self.output})

    def tasks(self, batchId: int, tag: str, partitions: int = 2) -> list[TaskResult]:
        """The executors of one driver's batch N: one prepared staged file per partition."""
        writer = FilesWriter(self.settings())
        results = []
        for p in range(partitions):
            ctx = TransactionContext(self.sinkId, QUERY, batchId, p, 0, runId=tag)
            txn = writer.beginTransaction(ctx)
            ids = np.arange(ROWS, dtype=np.int64) + batchId * 100 + p * ROWS
            writer.write(txn, pa.record_batch({"id": ids}))
            handle = writer.preCommit(txn)
            results.append(TaskResult(self.sinkId, QUERY, batchId, p, 0, handle, ROWS))
        return results

    def visible(self) -> list[int]:
        """Every id a reader of the output sees (staged files are not in the data path)."""
        if not fsspec.filesystem("file").exists(self.output):
            return []
        return sorted(ds.dataset(self.output, format="parquet").to_table().column("id").to_pylist())

    def expected(self, batches: range, partitions: int = 2) -> list[int]:
        return sorted(b * 100 + i for b in batches for i in range(ROWS * partitions))


class DriverSide:
    """One driver: its identity, the run it remembers, and a coordinator per call."""

    def __init__(self, pipeline: Pipeline, name: str) -> None:
        self.pipeline = pipeline
        self.identity = Driver(f"driver-{name}", "host-" + name, 1000 + len(name), "Spark driver")
        self.epoch: int | None = None

    def coordinator(self) -> Coordinator:
        committer = FilesCommitter(self.pipeline.settings())
        log = DecisionLog(self.pipeline.logUrl)
        return Coordinator(committer, log, self.pipeline.sinkId, SETTINGS, self.epoch)

    def plan(self, batchId: int) -> Coordinator:
        """What the planning of batch N does: hold the log, then recover."""
        coordinator = self.coordinator()
        self.epoch = coordinator.holdLog(self.identity, self.epoch, batchId, QUERY)
        coordinator.recover(batchId)
        return coordinator

    def runBatch(self, batchId: int) -> None:
        self.plan(batchId)
        self.coordinator().commitBatch(batchId, self.pipeline.tasks(batchId, self.identity.id))


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    return Pipeline(str(tmp_path / "out"), str(tmp_path / "checkpoint" / "twophase" / SINK))


def test_one_driver_keeps_one_run_across_batches(pipeline: Pipeline) -> None:
    a = DriverSide(pipeline, "a")
    for batchId in range(3):
        a.runBatch(batchId)
    assert a.epoch == 1
    assert DecisionLog(pipeline.logUrl).runs.newest() == 1
    assert pipeline.visible() == pipeline.expected(range(3))


def test_a_new_driver_fences_the_batch_the_old_one_is_deciding(pipeline: Pipeline) -> None:
    a, b = DriverSide(pipeline, "a"), DriverSide(pipeline, "b")
    a.runBatch(0)
    a.plan(1)
    prepared = pipeline.tasks(1, "a")  # A's tasks of batch 1 prepared, not decided

    b.plan(1)  # B claims run 2, fences batch 1 and sweeps A's undecided transactions
    assert b.epoch == 2

    with pytest.raises(DriverFencedError) as fenced:
        a.coordinator().commitBatch(1, prepared)
    message = str(fenced.value)
    assert "run 2, Spark driver on host-b, pid 1001" in message
    assert "this driver is run 1" in message and "stops before it decides batch 1" in message
    assert pipeline.visible() == pipeline.expected(range(1)), "nothing of A's batch 1"

    b.coordinator().commitBatch(1, pipeline.tasks(1, "b"))
    assert pipeline.visible() == pipeline.expected(range(2))
    state = DecisionLog(pipeline.logUrl).state(1)
    assert state is not None and state.epoch == 2


def test_an_older_driver_is_fenced_when_it_plans_its_next_batch(pipeline: Pipeline) -> None:
    a, b = DriverSide(pipeline, "a"), DriverSide(pipeline, "b")
    a.runBatch(0)
    b.runBatch(1)
    with pytest.raises(DriverFencedError, match="stops before it plans another batch"):
        a.plan(1)
    with pytest.raises(DriverFencedError, match="stops before it aborts the transactions"):
        a.coordinator().recover(2)
    b.runBatch(2)
    assert pipeline.visible() == pipeline.expected(range(3))


def test_a_decision_made_before_the_takeover_is_rolled_forward(pipeline: Pipeline) -> None:
    """A decides batch 1 and freezes before its commits; B's claim finds 1 decided, fences 2
    instead, and its recovery commits A's batch 1. A thaws: its late commits are no-ops, and
    its batch 2 is fenced."""
    a, b = DriverSide(pipeline, "a"), DriverSide(pipeline, "b")
    a.runBatch(0)
    a.plan(1)
    DecisionLog(pipeline.logUrl).decide(1, pipeline.tasks(1, "a"), queryId=QUERY, epoch=a.epoch)

    b.plan(1)  # recovery rolls A's decision of 1 forward
    assert pipeline.visible() == pipeline.expected(range(2))
    decided = DecisionLog(pipeline.logUrl).state(1)
    assert decided is not None and decided.epoch == 1
    fenceOf2 = Path(pipeline.logUrl) / "batch-00000000000000000002.decided.json"
    assert fenceOf2.exists(), "the fence moved on to the next batch"

    a.coordinator().commitBatch(1, [])  # A thaws inside its commit of 1: nothing new
    with pytest.raises(DriverFencedError):
        a.coordinator().commitBatch(2, pipeline.tasks(2, "a"))
    b.runBatch(2)
    assert pipeline.visible() == pipeline.expected(range(3))


def test_a_driver_frozen_between_its_check_and_its_decision_cannot_decide(
    pipeline: Pipeline,
) -> None:
    """The check before the decision passes, then the driver stands still while a new one
    takes over: the fence in the batch's slot refuses the late decision all the same."""
    a, b = DriverSide(pipeline, "a"), DriverSide(pipeline, "b")
    a.runBatch(0)
    a.plan(1)
    prepared = pipeline.tasks(1, "a")
    late = a.coordinator()
    check = late._guard

    def frozenAfterTheCheck(doing: str) -> None:
        check(doing)
        if doing.startswith("decides"):
            b.plan(1)  # while A stands still

    late._guard = frozenAfterTheCheck  # type: ignore[method-assign]
    with pytest.raises(DriverFencedError, match="stops before it decides batch 1"):
        late.commitBatch(1, prepared)
    b.coordinator().commitBatch(1, pipeline.tasks(1, "b"))
    assert pipeline.visible() == pipeline.expected(range(2))


def test_a_third_driver_takes_over_a_batch_the_second_fenced(pipeline: Pipeline) -> None:
    a, b, c = (DriverSide(pipeline, n) for n in ("a", "b", "c"))
    a.runBatch(0)
    b.plan(1)  # fences batch 1 in its slot
    fromB = pipeline.tasks(1, "b")
    c.plan(1)  # fences the link that B's fence points to
    log = Path(pipeline.logUrl)
    assert (log / linkName(1, 2)).exists()

    with pytest.raises(DriverFencedError, match="run 3, Spark driver on host-c"):
        b.coordinator().commitBatch(1, fromB)
    c.coordinator().commitBatch(1, pipeline.tasks(1, "c"))
    assert (log / linkName(1, 3)).exists(), "C's decision one link further"
    decisionLog = DecisionLog(pipeline.logUrl)
    state = decisionLog.state(1)
    assert state is not None and state.isDecided and state.epoch == 3
    assert decisionLog.lastDecided() == 1 and decisionLog.outstanding() == []
    figures = decisionLog.figures(1)
    assert figures is not None and figures.outcome == "committed" and figures.rows == 8
    c.runBatch(2)
    assert pipeline.visible() == pipeline.expected(range(3))

    assert decisionLog.prune(0) > 0
    assert not [p for p in log.iterdir() if p.name.startswith("batch-00000000000000000001.")]


def test_a_fenced_driver_aborts_only_its_own_handles(pipeline: Pipeline) -> None:
    a, b = DriverSide(pipeline, "a"), DriverSide(pipeline, "b")
    a.runBatch(0)
    a.plan(1)
    fromA = pipeline.tasks(1, "a")
    b.plan(1)
    fromB = pipeline.tasks(1, "b")  # B's batch 1 in flight

    with pytest.raises(DriverFencedError, match="stops before it aborts batch 1"):
        a.coordinator().abortBatch(1, fromA)
    b.coordinator().commitBatch(1, fromB)  # its transactions were not swept by A
    assert pipeline.visible() == pipeline.expected(range(2))


def test_a_coordinator_without_a_run_is_fenced_once_a_driver_claimed(
    pipeline: Pipeline,
) -> None:
    legacy = Coordinator(
        FilesCommitter(pipeline.settings()), DecisionLog(pipeline.logUrl), SINK, SETTINGS
    )
    legacy.recover(0)
    legacy.commitBatch(0, pipeline.tasks(0, "legacy"))
    DriverSide(pipeline, "a").runBatch(1)
    with pytest.raises(DriverFencedError, match="this driver holds no run of it"):
        legacy.recover(2)


def test_drivers_claiming_at_once_get_one_epoch_each_and_the_newest_holds(
    pipeline: Pipeline,
) -> None:
    DriverSide(pipeline, "first").runBatch(0)
    drivers = [DriverSide(pipeline, f"d{i}") for i in range(6)]
    barrier = threading.Barrier(len(drivers))
    epochs: list[int] = []
    fenced: list[DriverFencedError] = []

    def claim(side: DriverSide) -> None:
        barrier.wait()
        try:
            epochs.append(side.coordinator().holdLog(side.identity, None, 1))
        except DriverFencedError as exc:  # a newer one claimed while it fenced
            fenced.append(exc)

    threads = [threading.Thread(target=claim, args=(d,)) for d in drivers]
    [t.start() for t in threads]
    [t.join() for t in threads]
    newest = DecisionLog(pipeline.logUrl).runs.newest()
    assert newest == len(drivers) + 1 and newest in epochs
    assert len(set(epochs)) == len(epochs) and len(epochs) + len(fenced) == len(drivers)
    assert all(e.epoch is not None and e.epoch < newest for e in fenced)


def test_the_log_keeps_the_newest_runs(pipeline: Pipeline) -> None:
    for i in range(RUNS_KEPT + 3):
        DriverSide(pipeline, f"d{i}").runBatch(i)
    log = DecisionLog(pipeline.logUrl)
    log.prune(100)
    runs = sorted(p.name for p in Path(pipeline.logUrl).glob("run-*.json"))
    assert len(runs) == RUNS_KEPT and runs[-1] == f"run-{RUNS_KEPT + 3:010d}.json"
    with pytest.raises(DriverFencedError):
        DriverSide(pipeline, "d0").coordinator().recover(0)  # no run: fenced all the same


def test_the_documented_error_is_what_a_fenced_driver_says(tmp_path: Path) -> None:
    """docs/operations.md, "Two drivers on one checkpoint": the example is real output (the
    document's sink ``orders``, its log on S3, driver B on host-b with pid 4242)."""
    log = str(tmp_path / "ckpt/orders/twophase/orders")
    pipeline = Pipeline(str(tmp_path / "out"), log, "orders")
    a, b = DriverSide(pipeline, "a"), DriverSide(pipeline, "b")
    b.identity = Driver("driver-b", "host-b", 4242, "Spark driver")
    a.plan(7)
    prepared = pipeline.tasks(7, "a")
    b.plan(7)
    with pytest.raises(DriverFencedError) as fenced:
        a.coordinator().commitBatch(7, prepared)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    section = doc.split("### 4. Two drivers on one checkpoint\n", 1)[1].split("\n#", 1)[0]
    documented = [" ".join(b.split()) for b in re.findall(r"```text\n(.*?)```", section, re.S)]
    claimed = re.search(r"claimed the log at (\S+);", documented[0])
    assert claimed is not None
    actual = " ".join(str(fenced.value).split()).replace(
        pipeline.logUrl, "s3://bucket/ckpt/orders/twophase/orders"
    )
    actual = re.sub(r"claimed the log at \S+;", f"claimed the log at {claimed.group(1)};", actual)
    assert [actual] == documented


# ---------------------------------------------------------------------------- the stores


@pytest.fixture
def memoryLog() -> Iterator[str]:
    url = f"memory://twophase-runs-{uuid.uuid4().hex[:8]}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def test_concurrent_exclusive_creates_have_one_winner(tmp_path: Path, memoryLog: str) -> None:
    for url in (str(tmp_path / "log"), memoryLog):
        for round in range(20):
            name = f"race-{round}.json"
            assert racers(url, name, 4) == 1, (url, round)


def racers(url: str, name: str, count: int) -> int:
    """How many of ``count`` threads publishing ``name`` exclusively at once won."""
    wins: list[int] = []
    barrier = threading.Barrier(count)

    def publish(who: int) -> None:
        barrier.wait()
        try:
            LogStorage(url, {}).publish(name, {"who": who}, exclusive=True, what="x")
            wins.append(who)
        except FileExistsError:
            pass

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(count)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    storage = LogStorage(url, {})
    assert storage.readRecord(storage.path(name))["who"] in wins
    return len(wins)


def test_a_store_without_a_create_if_absent_is_refused_unless_accepted(tmp_path: Path) -> None:
    options = {"path": str(tmp_path), "target_protocol": "file"}
    log = DecisionLog("dir://log", options)
    side = DriverSide(Pipeline(str(tmp_path / "out"), "unused"), "a")

    def claim(decisionLog: DecisionLog) -> Callable[[], int]:
        committer = FilesCommitter(side.pipeline.settings())
        coordinator = Coordinator(committer, decisionLog, SINK, SETTINGS)
        return lambda: coordinator.holdLog(side.identity, None, 0)

    with pytest.raises(UnfencedLogStoreError) as refused:
        claim(log)()
    assert "the 'dir' store has no create-if-absent" in str(refused.value)
    assert "twophase.unfencedLogStore=true" in str(refused.value)
    assert not (tmp_path / "log").exists() or not list((tmp_path / "log").glob("run-*"))

    assert claim(DecisionLog("dir://log", options, unfenced=True))() == 1
