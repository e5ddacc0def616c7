"""The coordinator's state machine, one test per crash window of docs/protocol.md section 5.

A crash point is armed as in production (``TWOPHASE_CRASH_AT`` with a once-file, the committer
through ``faults.injectFaults``); only ``faults.kill`` is replaced: it raises ``SimulatedCrash``
(a BaseException, so nothing in the coordinator can swallow it) and marks the crashed "process"
dead: its participant stops talking to the external system, as a SIGKILLed driver would. A
restart is a new participant, log object and coordinator over the same log directory and the
same fake system.
Exactly-once is checked on the fake system: every record of every batch visible exactly once,
no transaction left open or prepared, no committed transaction ever aborted.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from twophase import faults
from twophase.coordinator import (
    CommitFailedError,
    CommitOutcome,
    Coordinator,
    CoordinatorError,
    CoordinatorSettings,
    DecisionLog,
    LogOwnershipError,
)
from twophase.coordinator.execution import CommitExecutor, CommitJob
from twophase.coordinator.figures import TIMES, BatchTimes
from twophase.coordinator.records import BatchStatus, LoggedHandle, recordName
from twophase.protocol import (
    Handle,
    RecoveryScope,
    TaskResult,
    TransactionContext,
    TransactionLostError,
    TransientCommitError,
    TwoPhaseParticipant,
)

SINK = "s1"
QUERY = "q1"
RECORDS_PER_BATCH = 6
HELD_SECONDS = 10.0  # the bound on the wait for commit threads to end


# ---------------------------------------------------------------------------- the fake system


@dataclass
class FakeTxn:
    txnId: str
    sinkId: str
    batchId: int
    rows: list[str] = field(default_factory=list)
    state: str = "open"  # open -> prepared -> committed | aborted


class FakeSystem:
    """The external system: transactions that become visible only when committed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.txns: dict[str, FakeTxn] = {}
        self.visible: list[str] = []
        self.violations: list[str] = []
        self.commitCalls: Counter[str] = Counter()
        self.failures: dict[str, list[Exception]] = {}
        self.ids = itertools.count()

    def txnsIn(self, *states: str) -> list[FakeTxn]:
        return [t for t in self.txns.values() if t.state in states]


class SimulatedCrash(BaseException):
    """The process died at a crash point (SIGKILL in production)."""


class Killed(SimulatedCrash):
    """A call made by a participant whose process has crashed (it never reaches the system): the
    crash, as another thread of that process meets it."""


class FakeParticipant(TwoPhaseParticipant[FakeTxn]):
    """A test double of a participant over ``FakeSystem``; ``dead`` once its process crashed."""

    def __init__(self, system: FakeSystem) -> None:
        self.system = system
        self.dead = False

    def _alive(self) -> None:
        if self.dead:
            raise Killed("this process crashed")

    def beginTransaction(self, ctx: TransactionContext) -> FakeTxn:
        self._alive()
        with self.system.lock:
            txn = FakeTxn(f"{ctx.transactionTag}-{next(self.system.ids)}", ctx.sinkId, ctx.batchId)
            self.system.txns[txn.txnId] = txn
        return txn

    def write(self, txn: FakeTxn, batch: pa.RecordBatch) -> None:
        self._alive()
        txn.rows.extend(str(v) for v in batch.column(0).to_pylist())

    def preCommit(self, txn: FakeTxn) -> Handle:
        self._alive()
        with self.system.lock:
            txn.state = "prepared"
        return {"txn": txn.txnId, "batchId": txn.batchId}

    def _injected(self, txnId: str) -> None:
        with self.system.lock:
            queue = self.system.failures.get(txnId)
            error = queue.pop(0) if queue else None
        if error is not None:
            raise error

    def commit(self, handle: Handle) -> None:
        txnId = handle["txn"]
        self._alive()
        with self.system.lock:
            self.system.commitCalls[txnId] += 1
        self._injected(txnId)
        with self.system.lock:
            txn = self.system.txns.get(txnId)
            if txn is None or txn.state in ("open", "aborted"):
                raise TransactionLostError(f"transaction {txnId} is gone")
            if txn.state == "prepared":
                txn.state = "committed"
                self.system.visible.extend(txn.rows)

    def abort(self, handle: Handle) -> None:
        self._alive()
        self._injected(handle["txn"])
        with self.system.lock:
            txn = self.system.txns.get(handle["txn"])
            if txn is None:
                return
            if txn.state == "committed":
                self.system.violations.append(f"abort of committed {txn.txnId}")
                return
            txn.state = "aborted"

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle]:
        self._alive()
        aborted = []
        with self.system.lock:
            for txn in self.system.txns.values():
                if txn.sinkId != scope.sinkId or txn.state not in ("open", "prepared"):
                    continue
                if scope.batchId is not None and txn.batchId != scope.batchId:
                    continue
                if scope.keeps("txn", txn.txnId):
                    continue
                txn.state = "aborted"
                aborted.append({"txn": txn.txnId, "batchId": txn.batchId})
        return aborted

    def describe(self, handle: Handle) -> str:
        return f"fake transaction {handle['txn']}"


# ---------------------------------------------------------------------------- driver & tasks


def txnOf(result: TaskResult) -> str:
    assert result.handle is not None
    return str(result.handle["txn"])


@dataclass
class Driver:
    """One run of the query's driver: a participant, a log object, a coordinator."""

    participant: FakeParticipant
    log: DecisionLog
    coordinator: Coordinator


class World:
    """One sink's external system and decision log, surviving any number of restarts."""

    def __init__(self, tmp_path: Path, **options: Any) -> None:
        self.system = FakeSystem()
        self.url = str(tmp_path / "checkpoint" / "twophase" / SINK)
        self.options = {"retryInitialSeconds": 0.001, "retryMaxSeconds": 0.01, **options}
        self.driver = self.start()

    def start(self) -> Driver:
        """(Re)start the driver process."""
        participant = FakeParticipant(self.system)
        self.driver = self.driverOf(participant)
        return self.driver

    def driverOf(self, participant: FakeParticipant) -> Driver:
        """A driver over ``participant``: its committer handed over as the Spark binding does
        (``faults.injectFaults``), so a point armed by then is lined up."""
        log = DecisionLog(self.url)
        settings = CoordinatorSettings(**self.options)
        coordinator = Coordinator(faults.injectFaults(participant), log, SINK, settings)
        return Driver(participant, log, coordinator)

    def runTasks(
        self, batchId: int, partitions: int = 3, attempt: int = 0, queryId: str = QUERY
    ) -> list[TaskResult]:
        """The executors of batch N: skip a decided batch, else prepare one txn per partition."""
        records = [f"{batchId}-{i}" for i in range(RECORDS_PER_BATCH)]
        participant = FakeParticipant(self.system)  # executors are other processes
        decided = DecisionLog(self.url).isDecided(batchId)
        results = []
        for p in range(partitions):
            mine = records[p::partitions]
            if decided:
                results.append(TaskResult(SINK, queryId, batchId, p, attempt, None, 0))
                continue
            ctx = TransactionContext(SINK, queryId, batchId, p, attempt)
            txn = participant.beginTransaction(ctx)
            batch = pa.record_batch({"v": mine})
            participant.write(txn, batch)
            handle = participant.preCommit(txn)
            results.append(
                TaskResult(
                    SINK,
                    queryId,
                    batchId,
                    p,
                    attempt,
                    handle,
                    len(mine),
                    bytes=batch.nbytes,
                    seconds=0.01 * (p + 1),
                )
            )
        return results

    def runBatch(self, batchId: int, partitions: int = 3) -> list[TaskResult]:
        """What Spark does for one micro-batch: recover, tasks, commit."""
        self.driver.coordinator.recover(batchId)
        results = self.runTasks(batchId, partitions)
        self.driver.coordinator.commitBatch(batchId, results)
        return results

    def assertExactlyOnce(self, batches: range) -> None:
        expected = [f"{b}-{i}" for b in batches for i in range(RECORDS_PER_BATCH)]
        assert sorted(self.system.visible) == sorted(expected), "each record visible once"
        assert self.system.txnsIn("open", "prepared") == [], "nothing left undecided"
        assert self.system.violations == []
        assert DecisionLog(self.url).outstanding() == []


CrashAt = Callable[..., None]


@pytest.fixture
def crashAt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> CrashAt:
    """Arm one simulated crash: the first time the driver reaches ``point`` (of ``batchId``,
    when given) it dies.

    Armed through ``TWOPHASE_CRASH_AT`` with a once-file of its own, as the crash tests under
    Spark arm it; the driver's coordinator is opened again, as the binding opens one per batch.
    """
    crashing: list[World] = []
    onceFiles = itertools.count()

    def fakeKill(point: str) -> None:
        assert point.startswith("driver."), point
        world = crashing.pop()
        world.driver.participant.dead = True
        raise SimulatedCrash(point)

    monkeypatch.setattr(faults, "kill", fakeKill)

    def arm(point: str, world: World, batchId: int | None = None) -> None:
        assert point in faults.POINTS, point
        monkeypatch.setenv(faults.ENV, point if batchId is None else f"{point}:{batchId}")
        monkeypatch.setenv(faults.ONCE_ENV, str(tmp_path / f"crash-{next(onceFiles)}.fired"))
        crashing[:] = [world]
        world.driver = world.driverOf(world.driver.participant)

    return arm


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = World(tmp_path)
    yield made


def crashAndRestart(world: World, batchId: int, results: list[TaskResult]) -> Driver:
    with pytest.raises(SimulatedCrash):
        world.driver.coordinator.commitBatch(batchId, results)
    return world.start()


# ---------------------------------------------------------------------------- happy path


def test_each_batch_is_committed_once(world: World, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="twophase.coordinator"):
        for batchId in range(3):
            world.runBatch(batchId)
    world.assertExactlyOnce(range(3))
    assert all(n == 1 for n in world.system.commitCalls.values())
    lines = [r.getMessage() for r in caplog.records if "committed batch" in r.getMessage()]
    assert len(lines) == 3
    assert lines[0].startswith("twophase sink s1: committed batch 0: 3 handles, 6 rows in ")
    assert lines[0].endswith(" ms")


def test_commit_report_has_outcome_and_timings(world: World) -> None:
    world.driver.coordinator.recover(0)
    report = world.driver.coordinator.commitBatch(0, world.runTasks(0))
    assert report.outcome is CommitOutcome.COMMITTED
    assert (report.batchId, report.handles, report.rows, report.retries) == (0, 3, 6, 0)
    assert 0 <= report.commitSeconds <= report.seconds


# ---------------------------------------------------------------------------- PROTOCOL §5


def test_crash_after_a_task_began_before_precommit(world: World) -> None:
    participant = FakeParticipant(world.system)
    participant.beginTransaction(TransactionContext(SINK, QUERY, 0, 0, 0))  # then it died

    driver = world.start()
    assert driver.coordinator.recover(0).transactionsAborted == 1
    world.runBatch(0)
    world.assertExactlyOnce(range(1))


def test_crash_after_precommit_before_the_decision(world: World, crashAt: CrashAt) -> None:
    world.runBatch(0)
    crashAt("driver.beforeDecision", world)
    crashAndRestart(world, 1, world.runTasks(1))
    assert DecisionLog(world.url).state(1) is None, "nothing decided"

    report = world.driver.coordinator.recover(1)
    assert report.transactionsAborted == 3 and report.batchesFinished == ()
    world.runBatch(1)  # Spark replays batch 1
    world.runBatch(2)
    world.assertExactlyOnce(range(3))


@pytest.mark.parametrize("point", ["driver.afterDecision", "driver.betweenCommits"])
def test_crash_after_the_decision_before_all_commits(
    world: World, crashAt: CrashAt, point: str
) -> None:
    results = world.runTasks(0, partitions=4)
    crashAt(point, world)
    crashAndRestart(world, 0, results)
    committed = len(world.system.txnsIn("committed"))
    assert committed == (0 if point == "driver.afterDecision" else 1), "partly committed"

    report = world.driver.coordinator.recover(0)
    assert report.batchesFinished == (0,) and report.handlesCommitted == 4
    replay = world.runTasks(0)  # Spark replays batch 0: the tasks see it decided
    assert all(r.handle is None for r in replay)
    assert world.driver.coordinator.commitBatch(0, replay).outcome is (
        CommitOutcome.ALREADY_COMMITTED
    )
    world.runBatch(1)
    assertNoCommitThreads()  # the dead process's other commit threads ended, reaching nothing
    world.assertExactlyOnce(range(2))


def test_crash_after_all_commits_before_the_committed_record(
    world: World, crashAt: CrashAt
) -> None:
    crashAt("driver.afterCommits", world)
    crashAndRestart(world, 0, world.runTasks(0))
    assert len(world.system.txnsIn("committed")) == 3
    state = DecisionLog(world.url).state(0)
    assert state is not None and state.status == "decided"

    world.runBatch(0)  # Spark replays 0: recovery re-commits (idempotent), tasks skip
    world.runBatch(1)
    world.assertExactlyOnce(range(2))


def test_crash_after_the_committed_record_before_sparks_commit_log(
    world: World, crashAt: CrashAt
) -> None:
    crashAt("driver.afterCommitted", world)
    crashAndRestart(world, 0, world.runTasks(0))
    driver = world.driver
    assert driver.coordinator.recover(0).idle

    replay = world.runTasks(0, partitions=2)  # re-planned with another partitioning
    assert all(r.handle is None for r in replay), "executors write nothing"
    report = driver.coordinator.commitBatch(0, replay)
    assert report.outcome is CommitOutcome.ALREADY_COMMITTED and report.handles == 0

    # A replay whose tasks wrote anyway (they did not check the log): its handles are aborted.
    world.system.failures.clear()
    rogue = [
        TaskResult(SINK, QUERY, 0, 0, 0, FakeParticipant(world.system).preCommit(txn), 3)
        for txn in [
            FakeParticipant(world.system).beginTransaction(TransactionContext(SINK, QUERY, 0, 0, 0))
        ]
    ]
    report = driver.coordinator.commitBatch(0, rogue)
    assert report.outcome is CommitOutcome.ALREADY_COMMITTED and report.duplicatesAborted == 1
    world.runBatch(1)
    world.assertExactlyOnce(range(2))
    assert sum(world.system.commitCalls.values()) == 6, "nothing committed twice"


def test_failed_or_speculative_attempts_are_aborted_after_the_decision(world: World) -> None:
    world.driver.coordinator.recover(0)
    failed = world.runTasks(0, partitions=3, attempt=0)  # attempts Spark never reports
    results = world.runTasks(0, partitions=3, attempt=1)
    report = world.driver.coordinator.commitBatch(0, results)
    assert report.stragglersAborted == len(failed) == 3
    assert {t.txnId for t in world.system.txnsIn("aborted")} == {txnOf(r) for r in failed}
    world.assertExactlyOnce(range(1))


def test_crash_during_recovery(world: World, crashAt: CrashAt) -> None:
    crashAt("driver.afterDecision", world)
    crashAndRestart(world, 0, world.runTasks(0))
    world.runTasks(1)  # a batch's tasks prepared, then everything died again
    crashAt("driver.duringRecovery", world)
    with pytest.raises(SimulatedCrash):
        world.driver.coordinator.recover(1)
    world.start()
    world.runBatch(1)
    world.assertExactlyOnce(range(2))


@pytest.mark.parametrize("point", [p for p in faults.POINTS if p.startswith("driver.")])
def test_any_single_driver_crash_keeps_exactly_once(
    world: World, crashAt: CrashAt, point: str
) -> None:
    crashAt(point, world, 2)
    batchId, crashes = 0, 0
    while batchId < 5:  # Spark's loop: a batch not in commits/N is replayed after a restart
        try:
            world.runBatch(batchId, partitions=2 + batchId % 3)
        except SimulatedCrash:
            crashes += 1
            world.start()
            continue
        batchId += 1
    assert crashes == 1
    world.driver.coordinator.recover(5)
    world.assertExactlyOnce(range(5))


# ---------------------------------------------------------------------------- Spark's calls


def test_abort_after_a_partial_commit_rolls_forward(world: World, crashAt: CrashAt) -> None:
    results = world.runTasks(0, partitions=4)
    crashAt("driver.betweenCommits", world)
    crashAndRestart(world, 0, results)

    report = world.driver.coordinator.abortBatch(0, results)  # Spark: abort after commit
    assert report.outcome is CommitOutcome.ROLLED_FORWARD and report.handles == 4
    assert report.duplicatesAborted == 0
    world.runBatch(1)
    world.assertExactlyOnce(range(2))


def test_abort_of_an_undecided_batch_aborts_everything_then_the_replay_commits(
    world: World,
) -> None:
    world.driver.coordinator.recover(0)
    reported = world.runTasks(0, partitions=2)
    unreported = world.runTasks(0, partitions=1, attempt=1)
    report = world.driver.coordinator.abortBatch(0, reported)
    assert report.outcome is CommitOutcome.ABORTED
    assert (report.handles, report.stragglersAborted) == (2, 1)
    state = DecisionLog(world.url).state(0)
    assert state is not None and state.status == "aborted"
    assert all(world.system.txns[txnOf(r)].state == "aborted" for r in unreported)

    world.runBatch(0)  # Spark replays the aborted batch
    world.assertExactlyOnce(range(1))


def test_a_task_that_prepares_after_the_abort_is_swept_by_the_second_sweep(
    world: World,
) -> None:
    world.driver.coordinator.recover(0)
    reported = world.runTasks(0, partitions=1)
    world.driver.coordinator.abortBatch(0, reported)
    late = world.runTasks(0, partitions=2)  # a killed task's worker got to PREPARE anyway
    assert world.driver.coordinator.sweepAbortedBatch(0) == 2
    assert all(world.system.txns[txnOf(r)].state == "aborted" for r in late)

    decided = world.runTasks(1, partitions=2)
    world.driver.coordinator.commitBatch(1, decided)
    assert world.driver.coordinator.sweepAbortedBatch(1) == 0  # never touches a decided batch
    world.assertExactlyOnce(range(1, 2))  # batch 0 aborted (Spark would replay it), 1 intact


def test_commit_called_twice_never_aborts_decided_handles(world: World) -> None:
    world.driver.coordinator.recover(0)
    results = world.runTasks(0)
    world.driver.coordinator.commitBatch(0, results)
    again = world.start().coordinator.commitBatch(0, results)
    assert again.outcome is CommitOutcome.ALREADY_COMMITTED and again.duplicatesAborted == 0
    world.start().coordinator.abortBatch(0, results)
    world.assertExactlyOnce(range(1))


def test_decided_replay_commits_the_logged_handles_not_the_new_ones(
    world: World, crashAt: CrashAt
) -> None:
    logged = world.runTasks(0)
    crashAt("driver.afterDecision", world)
    crashAndRestart(world, 0, logged)
    # No recovery ran (a binding that skipped it): the replay's tasks wrote again.
    fresh = [
        TaskResult(SINK, QUERY, 0, r.partitionId, 1, handle, r.rows)
        for r in logged
        for handle in [
            FakeParticipant(world.system).preCommit(
                FakeParticipant(world.system).beginTransaction(
                    TransactionContext(SINK, QUERY, 0, r.partitionId, 1)
                )
            )
        ]
    ]
    report = world.driver.coordinator.commitBatch(0, fresh)
    assert report.outcome is CommitOutcome.ROLLED_FORWARD and report.duplicatesAborted == 3
    assert {t.txnId for t in world.system.txnsIn("committed")} == {txnOf(r) for r in logged}
    world.assertExactlyOnce(range(1))


def test_tasks_without_a_handle_have_nothing_to_commit(world: World, crashAt: CrashAt) -> None:
    crashAt("driver.afterDecision", world)
    crashAndRestart(world, 0, world.runTasks(0))
    replay = world.runTasks(0)  # no recovery ran; the tasks saw the decision and skipped
    assert all(r.handle is None for r in replay)
    report = world.driver.coordinator.commitBatch(0, replay)
    assert report.outcome is CommitOutcome.ROLLED_FORWARD and report.handles == 3

    empty = world.driver.coordinator.commitBatch(1, [])  # a batch without any task
    assert empty.outcome is CommitOutcome.COMMITTED and empty.handles == 0
    assert DecisionLog(world.url).isDecided(1)
    world.assertExactlyOnce(range(1))


def test_skipped_tasks_of_an_undecided_batch_are_refused(world: World) -> None:
    results = world.runTasks(0)[:2] + [TaskResult(SINK, QUERY, 0, 2, 0, None, 0)]
    with pytest.raises(CoordinatorError, match="partitions \\[2\\]"):
        world.driver.coordinator.commitBatch(0, results)
    assert DecisionLog(world.url).state(0) is None, "never decided without their data"
    world.driver.coordinator.abortBatch(0, results)
    world.runBatch(0)
    world.assertExactlyOnce(range(1))


# ---------------------------------------------------------------------------- retries


def test_transient_errors_are_retried_then_succeed(world: World) -> None:
    results = world.runTasks(0)
    txn = txnOf(results[1])
    world.system.failures[txn] = [TransientCommitError("server restarting")] * 3
    report = world.driver.coordinator.commitBatch(0, results)
    assert report.outcome is CommitOutcome.COMMITTED and report.retries == 3
    assert world.system.commitCalls[txn] == 4
    world.assertExactlyOnce(range(1))


def test_a_permanent_error_fails_at_once_and_the_decision_stays(world: World) -> None:
    results = world.runTasks(0)
    txn = txnOf(results[2])
    world.system.failures[txn] = [PermissionError("role may not commit")]
    with pytest.raises(CommitFailedError) as failed:
        world.driver.coordinator.commitBatch(0, results)
    assert world.system.commitCalls[txn] == 1, "not retried"
    message = str(failed.value)
    assert "batch 0" in message and f"fake transaction {txn}" in message
    assert "PermissionError" in message and failed.value.batchId == 0
    assert [s.batchId for s in DecisionLog(world.url).outstanding()] == [0]

    report = world.start().coordinator.recover(1)  # the next start rolls forward
    assert report.batchesFinished == (0,)
    world.assertExactlyOnce(range(1))


def test_retries_are_bounded_by_attempts(tmp_path: Path) -> None:
    world = World(tmp_path, commitRetries=2)
    results = world.runTasks(0)
    txn = txnOf(results[0])
    world.system.failures[txn] = [TransientCommitError("down")] * 100
    with pytest.raises(CommitFailedError, match="3 attempts"):
        world.driver.coordinator.commitBatch(0, results)
    assert world.system.commitCalls[txn] == 3


def test_retries_are_bounded_by_time(tmp_path: Path) -> None:
    world = World(tmp_path, commitRetries=10_000, commitTimeoutSeconds=0.3, retryMaxSeconds=0.05)
    results = world.runTasks(0)
    txn = txnOf(results[0])
    world.system.failures[txn] = [TransientCommitError("down")] * 100_000
    started = time.monotonic()
    with pytest.raises(CommitFailedError):
        world.driver.coordinator.commitBatch(0, results)
    assert time.monotonic() - started < 2.0
    assert world.system.commitCalls[txn] < 10_000


def test_a_lost_transaction_fails_loudly(world: World) -> None:
    results = world.runTasks(0)
    txn = txnOf(results[0])
    world.system.failures[txn] = [TransactionLostError(f"{txn} aborted by the broker")] * 2
    with pytest.raises(TransactionLostError) as lost:
        world.driver.coordinator.commitBatch(0, results)
    assert any("batch 0" in note and txn in note for note in lost.value.__notes__)
    with pytest.raises(TransactionLostError):
        world.start().coordinator.recover(1)  # and again at every start, never swallowed
    assert [s.batchId for s in DecisionLog(world.url).outstanding()] == [0]


# ---------------------------------------------------------------------------- ownership & log


def test_a_log_of_another_query_is_refused(world: World) -> None:
    world.driver.coordinator.claim(QUERY)
    world.runBatch(0)
    # A new checkpoint location: a new query id, batch ids from 0 again, the same sink id.
    skipped = world.runTasks(0, queryId="q-new")
    assert all(r.handle is None for r in skipped), "its tasks saw the old query's batch 0"
    driver = world.start()
    with pytest.raises(LogOwnershipError) as refused:
        driver.coordinator.commitBatch(0, skipped)  # never a silent "already committed"
    message = str(refused.value)
    assert "q1" in message and "q-new" in message and "twophase.resetLog=true" in message
    with pytest.raises(LogOwnershipError):
        driver.coordinator.claim("q-new")

    prepared = [r for r in world.runTasks(1, queryId="q-new")]
    with pytest.raises(LogOwnershipError):
        driver.coordinator.commitBatch(1, prepared)
    with pytest.raises(LogOwnershipError):
        driver.coordinator.abortBatch(1, prepared)  # Spark aborts: its handles are discarded
    assert world.system.txnsIn("open", "prepared") == []
    world.assertExactlyOnce(range(1))


def test_reset_commits_outstanding_decisions_then_takes_the_log_over(
    world: World, crashAt: CrashAt
) -> None:
    world.driver.coordinator.claim(QUERY)
    crashAt("driver.afterDecision", world)
    crashAndRestart(world, 0, world.runTasks(0))

    world.driver.coordinator.claim("q-new", reset=True)
    assert len(world.system.txnsIn("committed")) == 3, "the old decision is never dropped"
    log = DecisionLog(world.url)
    owner = log.owner()
    assert owner is not None and owner.queryId == "q-new" and log.lastDecided() is None

    results = world.runTasks(0, queryId="q-new")
    assert all(r.handle is not None for r in results)
    world.driver.coordinator.commitBatch(0, results)
    assert len(world.system.txnsIn("committed")) == 6
    assert world.system.violations == []


def test_prune_keeps_outstanding_decisions(tmp_path: Path) -> None:
    world = World(tmp_path, retentionBatches=2)
    stuck = world.runTasks(0)
    world.system.failures[txnOf(stuck[0])] = [PermissionError("not yet")]
    with pytest.raises(CommitFailedError):
        world.driver.coordinator.commitBatch(0, stuck)
    for batchId in range(1, 6):
        world.driver.coordinator.commitBatch(batchId, world.runTasks(batchId))
    log = DecisionLog(world.url)
    assert [b for b in range(6) if log.state(b) is not None] == [0, 4, 5]
    assert [s.batchId for s in log.outstanding()] == [0]
    world.driver.coordinator.recover(6)
    world.assertExactlyOnce(range(6))


def test_recovery_with_nothing_to_do_lists_the_log_once(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.runBatch(0)
    calls: list[str] = []
    fs = world.driver.log._storage.fs
    for name in ("ls", "cat_file", "pipe_file", "mv", "rm"):
        original = getattr(fs, name)

        def counted(*args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
            calls.append(_name)
            return _original(*args, **kw)

        monkeypatch.setattr(fs, name, counted)
    report = world.driver.coordinator.recover(1)
    assert report.idle and calls == ["ls"]


def test_status_describes_outstanding_handles(world: World, crashAt: CrashAt) -> None:
    world.driver.coordinator.claim(QUERY)
    world.runBatch(0)
    crashAt("driver.afterDecision", world)
    crashAndRestart(world, 1, world.runTasks(1))
    status = world.driver.coordinator.status()
    assert status["sinkId"] == SINK and status["owner"]["queryId"] == QUERY
    assert status["committedBatches"] == 1 and status["lastCommitted"] == 0
    assert [b["batchId"] for b in status["outstanding"]] == [1]
    descriptions = [h["description"] for h in status["outstanding"][0]["handles"]]
    assert all(d.startswith("fake transaction s1-b1-") for d in descriptions)
    assert world.driver.coordinator.isDecided(1) and not world.driver.coordinator.isDecided(2)


def test_results_of_another_sink_or_batch_are_refused(world: World) -> None:
    results = world.runTasks(0)
    with pytest.raises(ValueError, match="task result of batch 0"):
        world.driver.coordinator.commitBatch(1, results)
    foreign = [TaskResult("other", QUERY, 0, 0, 0, {"txn": "x"}, 1)]
    with pytest.raises(ValueError, match="of sink 'other'"):
        world.driver.coordinator.commitBatch(0, foreign)
    assert DecisionLog(world.url).state(0) is None


def assertNoCommitThreads(seconds: float = HELD_SECONDS) -> None:
    """Wait, at most ``seconds``, until no thread runs commit jobs (the kept threads are named
    ``twophase-commit`` only while they do); fail naming the ones left."""
    deadline = time.monotonic() + seconds

    def busy() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("twophase-commit")]

    while busy() and time.monotonic() < deadline:
        time.sleep(0.01)
    left = busy()
    assert left == [], f"commit threads still running after {seconds} s: {left}"


@pytest.fixture(autouse=True)
def _noLeakedThreads() -> Iterator[None]:
    """After each test, no commit thread of the coordinator is left running."""
    yield
    assertNoCommitThreads()


# ---------------------------------------------------------------------------- figures


def test_the_records_carry_each_batchs_figures(world: World) -> None:
    results = world.runBatch(0)
    figures = DecisionLog(world.url).figures(0)
    assert figures is not None and figures.outcome == "committed"
    assert (figures.rows, figures.bytes) == (6, sum(r.bytes for r in results))
    assert (figures.tasks, figures.prepared, figures.committed) == (3, 3, 3)
    assert (figures.alreadyCommitted, figures.aborted, figures.retries, figures.failed) == (
        0,
        0,
        0,
        0,
    )
    assert figures.prepareSeconds == 0.03, "the slowest task"
    assert figures.decisionSeconds is not None and figures.decisionSeconds >= 0
    assert figures.commitSeconds is not None and figures.committedBy == "commit"
    assert figures.recovery is None, "an idle recovery records nothing"


def test_the_committed_record_keeps_when_each_phase_of_the_batch_ran(
    world: World, crashAt: CrashAt
) -> None:
    world.driver.coordinator.recover(0)
    planned = (time.time() - 0.5, time.time() - 0.4)
    tasks = (time.time() - 0.3, time.time() - 0.2)
    world.driver.coordinator.commitBatch(0, world.runTasks(0), BatchTimes(planned, tasks))
    figures = DecisionLog(world.url).figures(0)
    assert figures is not None and figures.times is not None
    times = figures.times
    assert list(times) == list(TIMES), "every phase, in the order they ran"
    assert [times[k] for k in TIMES[:4]] == pytest.approx([*planned, *tasks], abs=1e-4)
    ours = [times[k] for k in TIMES[4:]]
    assert tasks[1] <= ours[0] and ours == sorted(ours) and ours[-1] <= time.time()

    world.runBatch(1)  # no times given: the coordinator's own instants only
    later = DecisionLog(world.url).figures(1)
    assert later is not None and later.times is not None and list(later.times) == list(TIMES[4:])

    crashAt("driver.afterDecision", world)
    crashAndRestart(world, 2, world.runTasks(2))
    world.runBatch(2)  # finished by the recovery: nothing is known of its phases
    recovered = DecisionLog(world.url).figures(2)
    assert recovered is not None and recovered.committedBy == "recovery" and recovered.times is None


def test_times_that_are_not_instants_read_as_unknown(world: World) -> None:
    world.runBatch(0)
    log = DecisionLog(world.url)
    name = recordName(0, BatchStatus.COMMITTED)
    body = log._storage.readRecord(log._storage.path(name))
    body["times"] = {"planStarted": "soon", "decided": True, "committed": 12.5, "other": 1.0}
    log._storage.publish(name, body, exclusive=False, what="a test's record")
    figures = log.figures(0)
    assert figures is not None and figures.times == {"committed": 12.5}
    body["times"] = [1.0, 2.0]
    log._storage.publish(name, body, exclusive=False, what="a test's record")
    figures = log.figures(0)
    assert figures is not None and figures.outcome == "committed" and figures.times is None


def test_commit_threads_are_kept_between_calls_and_named_busy_only_while_they_work() -> None:
    settings = CoordinatorSettings(maxParallelCommits=3)
    executor = CommitExecutor(SINK, settings, describe=str)
    seen: list[tuple[threading.Thread, str]] = []
    running = [0, 0]  # now, most at once
    lock = threading.Lock()

    def action(handle: Handle) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running)
            seen.append((threading.current_thread(), threading.current_thread().name))
        time.sleep(0.02)
        with lock:
            running[0] -= 1

    def jobs() -> list[CommitJob]:
        return [CommitJob(0, LoggedHandle(p, 0, {"txn": p}), action) for p in range(9)]

    first = executor.runAll(jobs(), deadline=time.monotonic() + 30)
    existing = set(threading.enumerate())
    seen.clear()
    second = executor.runAll(jobs(), deadline=time.monotonic() + 30)
    assert len(first) == len(second) == 9 and all(o.error is None for o in first + second)
    threads = {thread for thread, _ in seen}
    assert len(threads) == 3 and threads <= existing, "three threads, none started for it"
    assert running[1] == 3, "at most maxParallelCommits at once"
    assert {name for _, name in seen} == {"twophase-commit"}
    assertNoCommitThreads(0.0)  # idle now, under another name


def test_a_batch_finished_by_recovery_counts_as_already_committed(
    world: World, crashAt: CrashAt
) -> None:
    world.runBatch(0)
    crashAt("driver.afterDecision", world)
    crashAndRestart(world, 1, world.runTasks(1))
    world.runBatch(1)  # Spark's replay: the recovery before it commits batch 1
    figures = DecisionLog(world.url).figures(1)
    assert figures is not None and figures.committedBy == "recovery"
    assert (figures.committed, figures.alreadyCommitted, figures.decisionSeconds) == (0, 3, None)
    recovery = figures.recovery
    assert recovery is not None and recovery.runs == 1
    assert recovery.batchesFinished == (1,) and recovery.handlesCommitted == 3

    world.runTasks(2)  # prepared, then the driver died before deciding
    world.start()
    world.runBatch(2)
    lingering = DecisionLog(world.url).figures(2)
    assert lingering is not None and lingering.recovery is not None
    assert (lingering.recovery.transactionsAborted, lingering.recovery.batchesFinished) == (3, ())


def test_an_aborted_batch_records_what_it_aborted(world: World) -> None:
    reported = world.runTasks(0, partitions=2)
    world.runTasks(0, partitions=1, attempt=1)
    world.driver.coordinator.abortBatch(0, reported)
    figures = DecisionLog(world.url).figures(0)
    assert figures is not None and figures.outcome == "aborted"
    assert (figures.aborted, figures.retries, figures.rows) == (3, 0, None)
    world.runTasks(0, partitions=2, attempt=2)  # late: prepared after the abort
    world.driver.coordinator.sweepAbortedBatch(0)
    late = DecisionLog(world.url).figures(0)
    assert late is not None and late.aborted == 5


def test_the_cleanup_after_a_commit_and_the_retries_are_counted(world: World) -> None:
    world.runTasks(0, partitions=3, attempt=0)  # attempts Spark never reports
    results = world.runTasks(0, partitions=3, attempt=1)
    world.system.failures[txnOf(results[0])] = [TransientCommitError("busy")] * 2
    world.driver.coordinator.commitBatch(0, results)
    figures = DecisionLog(world.url).figures(0)
    assert figures is not None
    assert (figures.committed, figures.aborted, figures.retries) == (3, 3, 2)
