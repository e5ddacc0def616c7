"""The decision log: atomic, checksummed, human-readable records on any fsspec filesystem."""

from __future__ import annotations

import json
import logging
import pickle
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from twophase.coordinator import (
    BatchStatus,
    DecisionConflictError,
    DecisionLog,
    LoggedHandle,
    LogOwnershipError,
)
from twophase.coordinator.storage import LogStorage
from twophase.protocol import TaskResult


def result(
    batchId: int, partition: int, handle: dict[str, object] | None, rows: int = 5
) -> TaskResult:
    return TaskResult("s1", "q1", batchId, partition, 0, handle, rows)


def results(batchId: int, partitions: int = 2) -> list[TaskResult]:
    return [result(batchId, p, {"txn": f"b{batchId}-p{p}"}) for p in range(partitions)]


@pytest.fixture(params=["local", "file", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "local":
        yield str(tmp_path / "log")
    elif request.param == "file":
        yield f"file://{tmp_path}/log"
    else:
        root = f"memory://twophase-test-{uuid.uuid4().hex}"
        yield f"{root}/log"
        fs = fsspec.filesystem("memory")
        if fs.exists(root):
            fs.rm(root, recursive=True)


def files(url: str) -> dict[str, bytes]:
    fs, root = fsspec.core.url_to_fs(url)
    return {p.rsplit("/", 1)[-1]: fs.cat_file(p) for p in fs.ls(root, detail=False)}


def write(url: str, name: str, data: bytes) -> None:
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/{name}", data)


def test_round_trip_of_every_state(url: str) -> None:
    log = DecisionLog(url)
    assert log.state(0) is None and log.outstanding() == [] and log.lastDecided() is None

    decided = log.decide(0, results(0) + [result(0, 2, None, rows=0)])
    assert decided.status is BatchStatus.DECIDED
    assert [h.handle for h in decided.handles] == [{"txn": "b0-p0"}, {"txn": "b0-p1"}]

    again = DecisionLog(url)  # another process
    state = again.state(0)
    assert state is not None and state.status is BatchStatus.DECIDED
    assert state.handles == decided.handles and state.queryId == "q1" and state.rows == 10
    assert [s.batchId for s in again.outstanding()] == [0]
    assert again.isDecided(0) and again.lastDecided() == 0

    again.markCommitted(0, 0.25)
    state = DecisionLog(url).state(0)
    assert state is not None and state.status is BatchStatus.COMMITTED
    assert state.commitSeconds == 0.25 and state.committedAt is not None
    assert state.handles == decided.handles
    assert again.outstanding() == []

    again.markAborted(1)
    aborted = again.state(1)
    assert aborted is not None and aborted.status is BatchStatus.ABORTED
    assert not again.isDecided(1) and again.lastDecided() == 0


def test_records_are_human_readable_json(tmp_path: Path) -> None:
    log = DecisionLog(str(tmp_path))
    log.claim("s1", "q1")
    log.decide(7, results(7))
    log.markCommitted(7, 1.5)

    names = sorted(files(str(tmp_path)))
    assert names == [
        "batch-00000000000000000007.committed.json",
        "batch-00000000000000000007.decided.json",
        "owner.json",
    ]
    text = (tmp_path / "batch-00000000000000000007.decided.json").read_text()
    assert text.count("\n") > 10, "indented, one field per line"
    body = json.loads(text)
    assert body["state"] == "decided" and body["batchId"] == 7 and body["queryId"] == "q1"
    assert body["handles"][1] == {
        "partitionId": 1,
        "attemptNumber": 0,
        "rows": 5,
        "handle": {"txn": "b7-p1"},
    }
    assert body["checksum"].startswith("sha256:")
    owner = json.loads((tmp_path / "owner.json").read_text())
    assert owner["sinkId"] == "s1" and owner["queryId"] == "q1" and "createdAt" in owner


def test_leftover_tmp_file_is_never_read_and_is_cleaned(url: str) -> None:
    log = DecisionLog(url)
    log.decide(3, results(3))
    log.markCommitted(3, 0.1)
    # A writer crashed after writing its temporary file, before the rename.
    body = json.loads(files(url)["batch-00000000000000000003.decided.json"])
    body["batchId"] = 4
    write(url, "_tmp-deadbeef.json", json.dumps(body).encode())

    assert log.state(4) is None and log.lastDecided() == 3 and log.outstanding() == []
    assert log.prune(100) == 0, "a fresh temporary file may belong to a live writer"
    assert "_tmp-deadbeef.json" in files(url)
    assert log.prune(100, tmpGraceSeconds=0) == 1
    assert "_tmp-deadbeef.json" not in files(url)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: b"\x00\xff garbage", id="garbage"),
        pytest.param(lambda data: data.replace(b"b5-p1", b"b5-p9"), id="edited"),
        pytest.param(lambda data: b"[1, 2]", id="not-an-object"),
    ],
)
def test_torn_or_garbage_record_is_ignored_with_a_warning(
    url: str, damage: object, caplog: pytest.LogCaptureFixture
) -> None:
    assert callable(damage)
    log = DecisionLog(url)
    log.decide(5, results(5))
    name = "batch-00000000000000000005.decided.json"
    write(url, name, damage(files(url)[name]))

    with caplog.at_level(logging.WARNING, logger="twophase.coordinator.reading"):
        assert log.state(5) is None
        assert not log.isDecided(5)
        assert log.outstanding() == []
        assert log.lastDecided() is None
    assert any("ignoring record" in r.getMessage() for r in caplog.records)

    # The unreadable record does not block a new decision of the batch (Spark replays it).
    decided = log.decide(5, [result(5, 0, {"txn": "replay"})])
    assert [h.handle for h in decided.handles] == [{"txn": "replay"}]
    state = DecisionLog(url).state(5)
    assert state is not None and [h.handle for h in state.handles] == [{"txn": "replay"}]


def test_empty_record_is_ignored_in_listings(url: str, caplog: pytest.LogCaptureFixture) -> None:
    log = DecisionLog(url)
    log.decide(1, results(1))
    write(url, "batch-00000000000000000002.decided.json", b"")
    with caplog.at_level(logging.WARNING):
        assert log.lastDecided() == 1
        assert [s.batchId for s in log.outstanding()] == [1]
    assert any("empty record" in r.getMessage() for r in caplog.records)


def test_a_decision_is_never_replaced(url: str) -> None:
    log = DecisionLog(url)
    first = log.decide(2, results(2))
    second = DecisionLog(url).decide(2, [result(2, 0, {"txn": "other"})])
    assert second.handles == first.handles
    state = log.state(2)
    assert state is not None and state.handles == first.handles


def test_decided_batch_cannot_be_aborted_but_aborted_batch_can_be_decided(url: str) -> None:
    log = DecisionLog(url)
    log.markAborted(4)
    log.decide(4, results(4))  # Spark replays an aborted batch
    state = log.state(4)
    assert state is not None and state.status is BatchStatus.DECIDED
    with pytest.raises(DecisionConflictError, match="rolled forward, never aborted"):
        log.markAborted(4)
    with pytest.raises(DecisionConflictError, match="never decided"):
        log.markCommitted(9, 0.0)


def test_prune_keeps_newest_finished_and_every_outstanding_batch(url: str) -> None:
    log = DecisionLog(url)
    log.decide(0, results(0))  # decided long ago, never committed: must survive
    for batchId in range(1, 8):
        log.decide(batchId, results(batchId))
        log.markCommitted(batchId, 0.1)
    log.markAborted(8)

    removed = log.prune(3)
    assert removed == 2 * 5, "decided + committed records of batches 1..5"
    remaining = DecisionLog(url)
    assert remaining.state(1) is None and remaining.state(5) is None
    states = [remaining.state(b) for b in (6, 7, 8)]
    assert [s.status if s else None for s in states] == ["committed", "committed", "aborted"]
    assert [s.batchId for s in remaining.outstanding()] == [0]
    assert remaining.prune(0) == 5 and [s.batchId for s in remaining.outstanding()] == [0]


def test_claim_refuses_a_log_of_another_query_and_reset_takes_it_over(url: str) -> None:
    log = DecisionLog(url)
    assert log.claim("s1", "q1").queryId == "q1"
    assert log.claim("s1", "q1", reset=True).queryId == "q1", "reset of one's own log: no-op"
    log.decide(0, results(0))

    with pytest.raises(LogOwnershipError) as refused:
        DecisionLog(url).claim("s1", "q2")
    message = str(refused.value)
    assert "q1" in message and "q2" in message and "twophase.resetLog=true" in message
    assert "new checkpoint location" in message

    with pytest.raises(LogOwnershipError, match="decided but not committed"):
        DecisionLog(url).claim("s1", "q2", reset=True)

    log.markCommitted(0, 0.1)
    owner = DecisionLog(url).claim("s1", "q2", reset=True)
    assert owner.queryId == "q2"
    assert log.state(0) is None and log.lastDecided() is None
    owned = log.owner()
    assert owned is not None and owned.queryId == "q2"


def test_status_summarises_the_log(url: str) -> None:
    log = DecisionLog(url)
    log.claim("s1", "q1")
    for batchId in range(3):
        log.decide(batchId, results(batchId))
        log.markCommitted(batchId, 0.1)
    log.decide(3, results(3))
    log.markAborted(4)
    status = log.status()
    assert status["owner"]["queryId"] == "q1"
    assert status["committedBatches"] == 3 and status["lastCommitted"] == 2
    assert status["abortedBatches"] == 1 and status["lastDecided"] == 3
    assert [b["batchId"] for b in status["outstanding"]] == [3]
    assert status["outstanding"][0]["handles"][0]["handle"] == {"txn": "b3-p0"}
    json.dumps(status)  # JSON-ready


def test_log_pickles_as_its_url(url: str) -> None:
    log = DecisionLog(url)
    log.decide(1, results(1))
    clone = pickle.loads(pickle.dumps(log))
    assert clone.url == url and clone.isDecided(1)


def test_for_checkpoint_places_the_log_under_the_checkpoint(tmp_path: Path) -> None:
    log = DecisionLog.forCheckpoint(f"{tmp_path}/", "sink-1")
    assert log.url == f"{tmp_path}/twophase/sink-1"
    with pytest.raises(ValueError, match="cannot name a directory"):
        DecisionLog.forCheckpoint(str(tmp_path), "a/b")


def test_reading_creates_nothing(tmp_path: Path) -> None:
    log = DecisionLog(str(tmp_path / "absent"))
    assert log.state(0) is None and log.owner() is None and log.status()["outstanding"] == []
    assert not (tmp_path / "absent").exists()


def test_a_rewrite_record_names_lost_partitions_and_their_replacements(url: str) -> None:
    log = DecisionLog(url)
    with pytest.raises(DecisionConflictError, match="never decided"):
        log.recordRewrite(0, [1], [])
    log.decide(0, results(0, partitions=3))
    log.recordRewrite(0, [2, 1], [])
    state = log.state(0)
    assert state is not None and state.awaitingRewrite == (1, 2) and state.lostPartitions == (1, 2)
    assert [h.partitionId for h in state.liveHandles] == [0]
    replacement = LoggedHandle(2, 0, {"txn": "b0-p2-replay"}, 5)
    log.recordRewrite(0, [1, 2], [replacement])  # replaces the previous record
    state = log.outstanding()[0]
    assert state.awaitingRewrite == (1,) and state.replacements == (replacement,)
    assert [h.handle["txn"] for h in state.liveHandles] == ["b0-p0", "b0-p2-replay"]
    assert replacement.key in state.handleKeys and log.lastDecided() == 0
    log.markCommitted(0, 0.1)
    for batchId in (1, 2):
        log.decide(batchId, results(batchId))
        log.markCommitted(batchId, 0.1)
    log.prune(1)
    assert not any(".rewrite." in name for name in files(url))


def test_an_unreadable_rewrite_record_is_never_taken_for_nothing_lost(url: str) -> None:
    log = DecisionLog(url)
    log.decide(0, results(0))
    write(url, "batch-00000000000000000000.rewrite.json", b'{"torn": ')
    with pytest.raises(DecisionConflictError, match="rewrite record of decided batch 0"):
        log.outstanding()


def test_the_inputs_a_transaction_holds_are_kept_with_its_handle_and_its_replacement(
    url: str,
) -> None:
    log = DecisionLog(url)
    grouped = TaskResult("s1", "q1", 0, 0, 0, {"txn": "b0-p0"}, 5, inputs=(0, 3, 6))
    log.decide(0, [grouped, result(0, 1, {"txn": "b0-p1"})])
    state = DecisionLog(url).state(0)
    assert state is not None
    assert [h.inputs for h in state.handles] == [(0, 3, 6), None]
    assert state.inputsOf(0) == (0, 3, 6) and state.inputsOf(1) == (1,)
    replacement = LoggedHandle(0, 0, {"txn": "b0-p0-replay"}, 5, inputs=(0, 3, 6))
    log.recordRewrite(0, [0], [replacement])
    again = DecisionLog(url).state(0)
    assert again is not None and again.replacements == (replacement,)
    message = TaskResult.fromJson(json.loads(json.dumps(grouped.toJson())))
    assert message == grouped
    assert "inputs" not in result(0, 1, None).toJson(), "absent when the task held its own"


# ---------------------------------------------------------------------------- figures


def test_records_of_an_earlier_release_read_with_their_figures_unknown(url: str) -> None:
    storage = LogStorage(url, {})
    handles = [
        {"partitionId": p, "attemptNumber": 0, "rows": 5, "handle": {"txn": f"b3-p{p}"}}
        for p in range(2)
    ]
    old = {"format": 1, "batchId": 3, "queryId": "q1", "decidedAt": "2025-01-02T03:04:05.000+00:00"}
    storage.publish(
        "batch-00000000000000000003.decided.json",
        {**old, "state": "decided", "rows": 10, "handles": handles},
        exclusive=True,
        what="an old decision",
    )
    storage.publish(
        "batch-00000000000000000003.committed.json",
        {
            "format": 1,
            "batchId": 3,
            "state": "committed",
            "commitSeconds": 0.5,
            "committedAt": "2025-01-02T03:04:06.000+00:00",
        },  # fmt: skip
        exclusive=False,
        what="an old committed mark",
    )
    storage.publish(
        "batch-00000000000000000004.aborted.json",
        {"format": 1, "batchId": 4, "state": "aborted", "abortedAt": old["decidedAt"]},
        exclusive=False,
        what="an old aborted mark",
    )
    log = DecisionLog(url)
    state = log.state(3)
    assert state is not None and state.status is BatchStatus.COMMITTED and state.rows == 10
    figures = log.figures(3)
    assert figures is not None and figures.outcome == "committed"
    assert (figures.rows, figures.prepared, figures.committed, figures.commitSeconds) == (
        10,
        2,
        2,
        0.5,
    )
    assert figures.bytes is None and figures.prepareSeconds is None
    assert figures.decisionSeconds is None and figures.retries is None
    assert figures.committedBy is None and figures.alreadyCommitted == 0
    aborted = log.figures(4)
    assert aborted is not None and aborted.outcome == "aborted" and aborted.aborted is None
    assert [f.batchId for f in log.recentFigures(5)] == [3, 4]
    assert log.figures(5) is None


def test_a_task_result_of_an_older_executor_parses_without_its_figures() -> None:
    old = {
        "sinkId": "s1",
        "queryId": "q1",
        "batchId": 0,
        "partitionId": 2,
        "attemptNumber": 0,
        "handle": {"txn": "x"},
        "rows": 7,
    }
    parsed = TaskResult.fromJson(old)
    assert (parsed.rows, parsed.bytes, parsed.seconds) == (7, 0, None)
    assert "seconds" not in parsed.toJson() and parsed.toJson()["bytes"] == 0
    timed = TaskResult("s1", "q1", 0, 2, 0, {"txn": "x"}, 7, bytes=56, seconds=0.25)
    assert TaskResult.fromJson(timed.toJson()) == timed


def test_a_decision_records_bytes_and_the_slowest_task(url: str) -> None:
    log = DecisionLog(url)
    given = [
        TaskResult("s1", "q1", 0, p, 0, {"txn": f"p{p}"}, 5, bytes=100 + p, seconds=0.1 * p)
        for p in range(3)
    ]
    log.decide(0, [*given, given[2], result(0, 3, None, rows=0)])  # a duplicate, an empty task
    body = json.loads(files(url)["batch-00000000000000000000.decided.json"])
    assert (body["rows"], body["bytes"], body["tasks"]) == (15, 303, 5)
    assert body["prepareSeconds"] == 0.2
    assert "bytes" not in body["handles"][0], "figures are the batch's, not each handle's"


def test_the_recovery_record_keeps_the_newest_runs_and_is_pruned_with_its_batch(
    url: str,
) -> None:
    log = DecisionLog(url)
    for run in range(12):
        log.recordRecovery(2, recoveryEntry([1], run, aborted=1, rewrite={"1": [0]}, seconds=0.5))
    log.recordRecovery(0, recoveryEntry([], 0, aborted=1, rewrite={}, seconds=0.1))
    assert log.figures(2) is None, "no state of its own: not a batch of the log yet"
    for batchId in range(1, 6):
        log.decide(batchId, results(batchId))
        log.markCommitted(batchId, 0.1)
    figures = log.figures(2)
    assert figures is not None and figures.recovery is not None
    recovery = figures.recovery
    assert (recovery.runs, recovery.handlesCommitted) == (10, sum(range(2, 12)))
    assert (recovery.transactionsAborted, recovery.partitionsToRewrite) == (10, 10)
    assert recovery.batchesFinished == (1,) and recovery.seconds == 5.0
    assert log.state(2) is not None and [s.batchId for s in log.outstanding()] == []

    assert log.prune(2) == 3 * 2 + 1 + 1, "batches 1-3, 2's recovery, the orphan before 0"
    left = [n for n in files(url) if n.startswith("batch-")]
    assert not [n for n in left if int(n[6:26]) in (0, 2)], left


def recoveryEntry(
    finished: list[int],
    committed: int,
    *,
    aborted: int,
    rewrite: dict[str, list[int]],
    seconds: float,
) -> dict[str, object]:
    return {
        "at": None,
        "batchesFinished": finished,
        "handlesCommitted": committed,
        "transactionsAborted": aborted,
        "awaitingRewrite": rewrite,
        "seconds": seconds,
    }
