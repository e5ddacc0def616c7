"""Every crash window of PROTOCOL.md section 5, under real Spark, with a real SIGKILL.

One test per window, named after it. Each starts ``twophase.sequence`` -> sink in a child
process (``spark_harness``) with the crash point armed for batch ``CRASH_BATCH``, checks the
state of the world the table describes right after the crash (what the decision log says,
what a reader sees, what is still prepared), restarts the query from its checkpoint until
the source is drained, and checks that a reader sees every id exactly once and that no
prepared transaction is left.

``task.*`` points kill the task's Python worker: Spark retries the attempt in the same run
(the once-file disarms the retry) and the query completes, so the checkpoint is already
drained and no restart is needed. ``driver.*`` points kill the whole driver (exit -9).

Cases: mode (``local[2,4]``, ``local-cluster[2,1,1024]``) x sink (the built-in files sink,
``JsonDirSink``: the user sink defined in ``test_spark_user_sink``). By default each window
runs in one case of a rotation (``ROTATION``) to keep the file within a few minutes on a
2-core machine; ``TWOPHASE_SPARK_MATRIX=full`` runs every window in all four cases. The files
sink's cases are marked ``windows`` (``make test-windows``): ``make test`` fires its windows in
the chaos bounded profile instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from integration_tests.sink_outputs import FILES, SinkUnderTest, visibleIds
from integration_tests.spark_harness import Harness, assertExactlyOnce
from integration_tests.test_spark_user_sink import USER_SINK
from twophase.coordinator.records import BatchStatus

ROWS_PER_BATCH = 2000
BATCHES = 4
PARTITIONS = 2
CRASH_BATCH = 2
PARTITION_ROWS = ROWS_PER_BATCH // PARTITIONS


@dataclass(frozen=True)
class Case:
    mode: str
    sink: SinkUnderTest

    def __str__(self) -> str:
        return f"{self.mode}-{self.sink}"


FULL = [Case(m, s) for m in ("local", "local-cluster") for s in (FILES, USER_SINK)]
ROTATION = {
    "task.afterBegin": Case("local", USER_SINK),
    "task.afterWrite": Case("local-cluster", FILES),
    "task.afterPreCommit": Case("local-cluster", USER_SINK),
    "driver.beforeDecision": Case("local", FILES),
    "driver.afterDecision": Case("local-cluster", USER_SINK),
    "driver.betweenCommits": Case("local", FILES),
    "driver.afterCommits": Case("local", USER_SINK),
    "driver.afterCommitted": Case("local-cluster", FILES),
    "driver.duringRecovery": Case("local", FILES),
}
"""The default: every window once, sinks and modes rotated so that each sink meets task and
driver windows in both modes. A window costs 30-70 s of Spark start-ups here, so the full
matrix (36 tests) takes about half an hour on 2 cores; ``TWOPHASE_SPARK_MATRIX=full`` runs it."""


def cases(window: str) -> list[Any]:
    """The window's cases; the files sink's are marked ``windows``: the chaos bounded profile
    of ``make test`` fires every window on the files sink too (the ``archive`` target of its
    ``multi`` pipeline), so ``make test`` runs the user sink's here and ``make test-windows``
    both."""
    chosen = FULL if os.environ.get("TWOPHASE_SPARK_MATRIX") == "full" else [ROTATION[window]]
    return [
        pytest.param(case, marks=pytest.mark.windows) if case.sink is FILES else case
        for case in chosen
    ]


pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def query(case: Case, tmp_path: Path) -> Harness:
    return Harness(
        tmp_path / "query",
        case.mode,
        sink=case.sink.spec,
        rows=BATCHES * ROWS_PER_BATCH,
        rowsPerBatch=ROWS_PER_BATCH,
        partitions=PARTITIONS,
    )


def at(point: str) -> str:
    return f"{point}:{CRASH_BATCH}"


def batchesBefore(batchId: int) -> np.ndarray:
    return np.arange(batchId * ROWS_PER_BATCH, dtype=np.int64)


def assertVisible(case: Case, query: Harness, expected: np.ndarray, why: str) -> None:
    seen = visibleIds(case.sink, query.output)
    assert np.array_equal(seen, expected), (
        f"{why}: a reader sees {len(seen)} rows {seen[:3]}..{seen[-3:]}, expected "
        f"{len(expected)}\n" + query.describeRuns()
    )


def assertPrepared(case: Case, query: Harness, count: int, why: str) -> None:
    prepared = case.sink.prepared(query.output, CRASH_BATCH)
    assert len(prepared) == count, f"{why}: batch {CRASH_BATCH} has prepared {prepared}"


def assertTaskRetried(query: Harness) -> None:
    """The batch was decided with the retried attempt's handle, never the killed one's."""
    state = query.decisionLog().state(CRASH_BATCH)
    assert state is not None and state.status is BatchStatus.COMMITTED
    attempts = sorted((h.partitionId, h.attemptNumber) for h in state.handles)
    assert len(attempts) == PARTITIONS and any(a > 0 for _, a in attempts), (
        f"batch {CRASH_BATCH} decided with attempts {attempts}: no retried attempt"
    )


def restartAndVerify(case: Case, query: Harness, *, replays: bool = True) -> None:
    """Restart until drained; a reader then sees every id once, nothing stays prepared."""
    restarts = query.restartUntilExhausted()
    if replays:
        assert restarts, "the crash left nothing to replay"
        first = restarts[0].result["batches"][0]["batchId"]  # type: ignore[index]
        assert first == CRASH_BATCH, f"the restart began at batch {first}, not a replay"
    assertExactlyOnce(case.sink, query)
    files = case.sink.visibleFiles(query.output)
    assert len(files) == BATCHES * PARTITIONS, f"extra or missing visible files: {files}"


def crashInTask(case: Case, query: Harness, point: str) -> None:
    query.crashRun(at(point))
    assert query.exhausted(), "Spark retried the task, so the first run must drain the source"
    assertTaskRetried(query)
    restartAndVerify(case, query, replays=False)


# -- task side: the attempt dies, Spark retries it, the debris is swept after the decision ---


@pytest.mark.parametrize("case", cases("task.afterBegin"), ids=str)
def test_task_afterBegin(case: Case, query: Harness) -> None:
    """A task began, before preCommit: its open transaction is orphaned and swept."""
    crashInTask(case, query, "task.afterBegin")


@pytest.mark.parametrize("case", cases("task.afterWrite"), ids=str)
def test_task_afterWrite(case: Case, query: Harness) -> None:
    """A task wrote rows, before preCommit: its unprepared staging is orphaned and swept."""
    crashInTask(case, query, "task.afterWrite")


@pytest.mark.parametrize("case", cases("task.afterPreCommit"), ids=str)
def test_task_afterPreCommit(case: Case, query: Harness) -> None:
    """A task prepared but died before reporting: a prepared transaction nobody decides."""
    crashInTask(case, query, "task.afterPreCommit")


# -- driver side: the whole driver dies; the restart recovers, Spark replays the batch --------


@pytest.mark.parametrize("case", cases("driver.beforeDecision"), ids=str)
def test_driver_beforeDecision(case: Case, query: Harness) -> None:
    """Prepared transactions nobody decided: recoverAndAbort aborts them, Spark replays N."""
    query.crashRun(at("driver.beforeDecision"))
    assert query.decisionLog().state(CRASH_BATCH) is None
    assertVisible(case, query, batchesBefore(CRASH_BATCH), "nothing of N before its decision")
    assertPrepared(case, query, PARTITIONS, "every task of N prepared")
    restartAndVerify(case, query)
    state = query.decisionLog().state(CRASH_BATCH)
    assert state is not None and state.status is BatchStatus.COMMITTED


@pytest.mark.parametrize("case", cases("driver.afterDecision"), ids=str)
def test_driver_afterDecision(case: Case, query: Harness) -> None:
    """Decided, nothing committed: recoverAndCommit every handle; the replay of N is skipped."""
    query.crashRun(at("driver.afterDecision"))
    decided = query.decisionLog().state(CRASH_BATCH)
    assert decided is not None and decided.status is BatchStatus.DECIDED
    assertVisible(case, query, batchesBefore(CRASH_BATCH), "decided is not yet committed")
    assertPrepared(case, query, PARTITIONS, "the decided transactions wait for their commit")
    restartAndVerify(case, query)
    assertCommittedWith(query, decided.handleKeys)


@pytest.mark.parametrize("case", cases("driver.betweenCommits"), ids=str)
def test_driver_betweenCommits(case: Case, query: Harness) -> None:
    """Decided, partly committed: the rest is committed on restart, the first not twice."""
    query.crashRun(at("driver.betweenCommits"))
    decided = query.decisionLog().state(CRASH_BATCH)
    assert decided is not None and decided.status is BatchStatus.DECIDED
    seen = visibleIds(case.sink, query.output)
    ofBatch = seen[seen >= CRASH_BATCH * ROWS_PER_BATCH]
    assert len(seen) == CRASH_BATCH * ROWS_PER_BATCH + PARTITION_ROWS, len(seen)
    assert len(ofBatch) == PARTITION_ROWS and ofBatch[-1] - ofBatch[0] == PARTITION_ROWS - 1, (
        f"expected exactly one committed partition of batch {CRASH_BATCH}, saw {len(ofBatch)}"
    )
    assertPrepared(case, query, PARTITIONS - 1, "one decided transaction still to commit")
    restartAndVerify(case, query)
    assertCommittedWith(query, decided.handleKeys)


@pytest.mark.parametrize("case", cases("driver.afterCommits"), ids=str)
def test_driver_afterCommits(case: Case, query: Harness) -> None:
    """All committed, committed(N) missing: recovery commits again (idempotent), marks N."""
    query.crashRun(at("driver.afterCommits"))
    decided = query.decisionLog().state(CRASH_BATCH)
    assert decided is not None and decided.status is BatchStatus.DECIDED
    assertVisible(case, query, batchesBefore(CRASH_BATCH + 1), "every handle of N committed")
    assertPrepared(case, query, 0, "nothing of N left to commit")
    restartAndVerify(case, query)
    assertCommittedWith(query, decided.handleKeys)


@pytest.mark.parametrize("case", cases("driver.afterCommitted"), ids=str)
def test_driver_afterCommitted(case: Case, query: Harness) -> None:
    """committed(N) written, Spark's commits/N not: Spark replays N, the sink writes nothing."""
    query.crashRun(at("driver.afterCommitted"))
    committed = query.decisionLog().state(CRASH_BATCH)
    assert committed is not None and committed.status is BatchStatus.COMMITTED
    assert not query.sparkCommitted(CRASH_BATCH), "Spark's commits/N exists: wrong window"
    assertVisible(case, query, batchesBefore(CRASH_BATCH + 1), "N is done")
    restartAndVerify(case, query)
    assertCommittedWith(query, committed.handleKeys)


@pytest.mark.parametrize("case", cases("driver.duringRecovery"), ids=str)
def test_driver_duringRecovery(case: Case, query: Harness) -> None:
    """A crash in the restart's own recovery: the next start finishes it."""
    query.crashRun(at("driver.afterDecision"))
    # Recovery runs while Spark plans the first batch (streamWriter()), before the batch id
    # reaches us: the point is armed without one, with a second once-file.
    query.crashRun("driver.duringRecovery", onceFile=query.onceFile("-recovery"))
    state = query.decisionLog().state(CRASH_BATCH)
    assert state is not None and state.status is BatchStatus.COMMITTED, (
        "the decided batch is rolled forward before the crash point of the sweep"
    )
    assert not query.sparkCommitted(CRASH_BATCH)
    restartAndVerify(case, query)


def assertCommittedWith(query: Harness, handleKeys: frozenset[str]) -> None:
    """N ends committed with the handles decided before the crash: the replay wrote nothing."""
    state = query.decisionLog().state(CRASH_BATCH)
    assert state is not None and state.status is BatchStatus.COMMITTED
    assert state.handleKeys == handleKeys, "the replay of a decided batch made a new decision"
