"""A commit that says how it ended (``twophase.protocol.outcomes``), and the coordinator acting
on it: committed, already committed, retry later, lost, unknown; ``None`` as before.

The participant is a small in-memory system whose commit answers what each test scripts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from twophase.coordinator import Coordinator, CoordinatorSettings, DecisionLog
from twophase.coordinator.errors import CommitFailedError
from twophase.protocol import (
    CommitResult,
    CommitStatus,
    Handle,
    Prepared,
    RecoveryScope,
    TaskResult,
    TransactionContext,
    TransactionLostError,
    TwoPhaseParticipant,
)

SINK = "outcomes"


class Scripted(TwoPhaseParticipant[str]):
    """Prepared transactions by name; ``answers`` lists what each next commit returns."""

    def __init__(self, answers: Iterable[Any] = ()) -> None:
        self.prepared: set[str] = set()
        self.visible: list[str] = []
        self.answers = list(answers)
        self.calls = 0

    def beginTransaction(self, ctx: TransactionContext) -> str:
        return f"{ctx.sinkId}-{ctx.batchId}-{ctx.partitionId}"

    def write(self, txn: str, batch: pa.RecordBatch) -> None: ...

    def preCommit(self, txn: str) -> Handle:
        self.prepared.add(txn)
        return {"name": txn}

    def commit(self, handle: Handle) -> Any:
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else None
        status = answer.status if isinstance(answer, CommitResult) else answer
        if status in (None, CommitStatus.COMMITTED) and handle["name"] in self.prepared:
            self.prepared.discard(handle["name"])
            self.visible.append(handle["name"])
        return answer

    def abort(self, handle: Handle) -> None:
        self.prepared.discard(handle["name"])

    def listPrepared(self, scope: RecoveryScope) -> Iterable[Prepared]:
        return [Prepared(n, {"name": n}) for n in sorted(self.prepared)]

    def abortPrepared(self, item: Prepared) -> None:
        self.prepared.discard(item.name)


def commitOne(tmp_path: Path, sink: Scripted) -> Any:
    log = DecisionLog(str(tmp_path / "log"))
    settings = CoordinatorSettings(retryInitialSeconds=0.001, retryMaxSeconds=0.01)
    coordinator = Coordinator(sink, log, SINK, settings)
    coordinator.recover(0)
    ctx = TransactionContext(SINK, "q", 0, 0, 0)
    handle = sink.preCommit(sink.beginTransaction(ctx))
    return coordinator.commitBatch(0, [TaskResult(SINK, "q", 0, 0, 0, handle, 1)]), log


def test_none_and_committed_mean_committed(tmp_path: Path) -> None:
    answers = (None, CommitStatus.COMMITTED, CommitResult(CommitStatus.COMMITTED))
    for index, answer in enumerate(answers):
        sink = Scripted([answer])
        report, log = commitOne(tmp_path / str(index), sink)
        assert sink.visible == ["outcomes-0-0"] and log.outstanding() == []


def test_already_committed_is_a_success_the_log_names(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = Scripted([CommitStatus.ALREADY_COMMITTED])
    with caplog.at_level(logging.INFO, logger="twophase.coordinator"):
        _, log = commitOne(tmp_path, sink)
    assert log.outstanding() == [] and "were committed before" in caplog.text


def test_retry_later_is_retried_with_backoff_until_it_commits(tmp_path: Path) -> None:
    sink = Scripted([CommitStatus.RETRY_LATER, CommitResult(CommitStatus.RETRY_LATER, "busy")])
    report, log = commitOne(tmp_path, sink)
    assert sink.calls == 3 and report.retries == 2 and sink.visible == ["outcomes-0-0"]


def test_lost_stops_the_batch_as_a_lost_transaction_and_keeps_the_decision(
    tmp_path: Path,
) -> None:
    sink = Scripted([CommitResult(CommitStatus.LOST, "the system expired it")])
    with pytest.raises(TransactionLostError, match="the system expired it"):
        commitOne(tmp_path, sink)
    assert [s.batchId for s in DecisionLog(str(tmp_path / "log")).outstanding()] == [0]


def test_unknown_and_a_bad_answer_fail_the_batch_and_keep_the_decision(tmp_path: Path) -> None:
    with pytest.raises(CommitFailedError, match="the sink answered unknown"):
        commitOne(tmp_path / "unknown", Scripted([CommitStatus.UNKNOWN]))
    with pytest.raises(CommitFailedError, match=r"Scripted.commit returned 'yes'"):
        commitOne(tmp_path / "bad", Scripted(["yes"]))
    for case in ("unknown", "bad"):
        assert len(DecisionLog(str(tmp_path / case / "log")).outstanding()) == 1
