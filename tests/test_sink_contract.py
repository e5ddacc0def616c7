"""A user's sink that returns the wrong thing fails at the framework's edge, naming the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from twophase.coordinator import Coordinator, DecisionLog
from twophase.protocol import (
    Committer,
    Handle,
    RecoveryScope,
    SinkContractError,
    TransactionContext,
    TransactionWriter,
)
from twophase.spark.task import runTask

CTX = TransactionContext("s1", "q1", 0, 0, 0, "run1")
BATCH = pa.RecordBatch.from_pydict({"id": [1, 2]})


class ReturningWriter(TransactionWriter[list[Any]]):
    """A writer whose preCommit returns whatever the test gives it."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.aborted = False

    def beginTransaction(self, ctx: TransactionContext) -> list[Any]:
        return []

    def write(self, txn: list[Any], batch: pa.RecordBatch) -> None:
        txn.append(batch.num_rows)

    def preCommit(self, txn: list[Any]) -> Handle:
        return self.handle  # type: ignore[no-any-return]

    def abortTransaction(self, txn: list[Any]) -> None:
        self.aborted = True


@pytest.mark.parametrize(
    "handle, words",
    [
        (None, "returned NoneType None; it must return a dict"),
        ("txn-1", "returned str 'txn-1'; it must return a dict"),
        ({"files": {"a", "b"}}, "JSON cannot hold"),
        ({"range": (1, 2)}, "changes on its way through JSON"),
    ],
)
def test_a_handle_json_cannot_carry_is_refused_in_the_task(handle: Any, words: str) -> None:
    writer = ReturningWriter(handle)
    with pytest.raises(SinkContractError) as failure:
        runTask(lambda: writer, CTX, [BATCH], alreadyDecided=False)
    assert "test_sink_contract.ReturningWriter.preCommit" in str(failure.value)
    assert words in str(failure.value)
    assert writer.aborted


def test_a_good_handle_passes_unchanged() -> None:
    result = runTask(lambda: ReturningWriter({"txn": "t1"}), CTX, [BATCH], alreadyDecided=False)
    assert result.handle == {"txn": "t1"} and result.rows == 2


class ReturningCommitter(Committer):
    """A committer whose recoverAndAbort returns whatever the test gives it."""

    def __init__(self, swept: Any) -> None:
        self.swept = swept

    def commit(self, handle: Handle) -> None:
        pass

    def abort(self, handle: Handle) -> None:
        pass

    def recoverAndAbort(self, scope: RecoveryScope) -> Any:
        return self.swept


def test_recover_and_abort_returning_none_means_nothing_aborted(tmp_path: Path) -> None:
    coordinator = Coordinator(ReturningCommitter(None), DecisionLog(str(tmp_path)), "s1")
    report = coordinator.recover()
    assert report.transactionsAborted == 0 and report.idle


@pytest.mark.parametrize("swept", ["t1", [1, 2], {"txn": "t1"}])
def test_recover_and_abort_returning_no_list_names_the_sink_and_the_fix(
    tmp_path: Path, swept: Any
) -> None:
    coordinator = Coordinator(ReturningCommitter(swept), DecisionLog(str(tmp_path)), "s1")
    with pytest.raises(SinkContractError) as failure:
        coordinator.recover()
    text = str(failure.value)
    assert "test_sink_contract.ReturningCommitter.recoverAndAbort" in text
    assert "must return a list" in text
