"""A full or read-only disk at every write of the decision log, and under the files sink.

One test per write the coordinator makes (the owner record, ``sink.json``, a decision, the
committed mark, written by a commit and by recovery, the aborted mark, a rewrite record, the
prune, the records written for their figures alone), named after it. Each runs a query without
Spark over a size-limited tmpfs (``Disk`` of the chaos harness) that holds the checkpoint, the
files sink's output and its staging path: the planning of a batch as the Spark binding runs it
on every start (``beforeBatch``: claim, ``sink.json``, recovery), tasks through the executors'
``runTask`` with the files sink's writer, the driver's ``commitBatch`` and, when that raises,
Spark's ``abort``. The disk is filled right before the write; the write fails with
``DecisionLogWriteError`` naming the log, the record, the OS error and the fix, and leaves
neither a half record nor its temporary file. Then the disk is freed, the query starts again,
and the output holds every batch once; a write made for the figures alone is refused, logged,
and the batch goes on.

Mounting a tmpfs needs root; elsewhere those tests skip. The torn-record test needs no mount.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

import twophase.spark.driver as driverModule
from integration_tests.chaos.faultkinds import Disk
from twophase.coordinator import (
    BatchStatus,
    CommitFailedError,
    DecisionLog,
    DecisionLogWriteError,
    LoggedHandle,
)
from twophase.coordinator.description import SINK_DESCRIPTION
from twophase.coordinator.records import RECORD_NAME, BatchState, recordName
from twophase.coordinator.storage import TMP_PREFIX, LogStorage
from twophase.protocol import TaskResult, TransactionContext
from twophase.settings import SinkSettings
from twophase.sinks.files import FilesCommitter, FilesNotWritableError
from twophase.spark.declared import FilesSink
from twophase.spark.driver import BatchPlan, abortFailedBatch, beforeBatch, openCoordinator
from twophase.spark.task import runTask

SINK = "full-disk"
QUERY = "q-full-disk"
PARTITIONS = 2
ROWS = 5
OWNER = "owner.json"
PRUNE = "prune"
COMMIT = "commit"


# ---------------------------------------------------------------------------- the query


class Query:
    """One query's driver and tasks over a files sink, as Spark drives them, without Spark.

    ``start`` plans a batch as the binding does on every start and before every batch;
    ``commit`` is the driver's commit followed, when it raises, by Spark's ``abort`` (whose
    own error Spark only logs: kept in ``abortErrors``).
    """

    def __init__(self, output: Path, checkpoint: Path, **options: str) -> None:
        self.output = output
        self.staging = output.parent / "_twophase-staging" / output.name
        self.sink = FilesSink(
            {
                "path": str(output),
                "checkpointLocation": str(checkpoint),
                "sinkId": SINK,
                "commitRetries": "1",
                **options,
            }
        )
        self.settings = SinkSettings.fromOptions(self.sink.options, self.sink.name())
        self.url = self.settings.logLocation
        self.plan = BatchPlan()
        self.abortErrors: list[BaseException] = []

    @property
    def log(self) -> DecisionLog:
        return DecisionLog(self.url)

    def start(self, batchId: int) -> None:
        """Plan ``batchId``: claim the log, keep ``sink.json``, recover (a restart's path)."""
        self.plan = beforeBatch(
            self.sink, self.sink.createCommitter(), self.settings, QUERY, batchId
        )

    def tasks(self, batchId: int) -> list[TaskResult]:
        """The executors: each partition in one prepared transaction, unless decided."""
        results = []
        for p in range(PARTITIONS):
            first = batchId * 100 + p * 10
            rows = pa.record_batch({"id": pa.array(range(first, first + ROWS), pa.int64())})
            ctx = TransactionContext(SINK, QUERY, batchId, p, 0, "run1")
            decided = not self.plan.writes(batchId, p)
            results.append(runTask(self.sink.createWriter, ctx, [rows], alreadyDecided=decided))
        return results

    def commit(self, batchId: int, results: list[TaskResult]) -> None:
        coordinator = openCoordinator(self.sink.createCommitter(), self.settings)
        try:
            coordinator.commitBatch(batchId, results)
        except Exception:
            self.abort(batchId, results)
            raise

    def abort(self, batchId: int, results: list[TaskResult]) -> None:
        """Spark's ``abort`` of a failed batch; its error is kept, as Spark only logs it."""
        coordinator = openCoordinator(self.sink.createCommitter(), self.settings)
        try:
            abortFailedBatch(coordinator, batchId, results, unreported=False)
        except Exception as exc:
            self.abortErrors.append(exc)

    def runBatch(self, batchId: int) -> None:
        self.start(batchId)
        self.commit(batchId, self.tasks(batchId))

    def visibleIds(self) -> list[int]:
        if not self.output.exists():
            return []
        return sorted(ds.dataset(str(self.output), format="parquet").to_table()["id"].to_pylist())

    def assertExactlyOnce(self, batches: range) -> None:
        expected = [
            b * 100 + p * 10 + i for b in batches for p in range(PARTITIONS) for i in range(ROWS)
        ]
        assert self.visibleIds() == sorted(expected), "every batch's rows visible exactly once"
        staged = [p for p in self.staging.rglob("*") if p.is_file()]
        assert staged == [], "nothing left prepared"
        log = self.log
        assert log.outstanding() == [] and log.lastDecided() == batches[-1]
        for batchId in batches:  # committed, or pruned once committed
            state = log.state(batchId)
            assert state is None or state.status is BatchStatus.COMMITTED, batchId
        assertNoHalfRecord(self.url)


def assertNoHalfRecord(url: str) -> None:
    """No temporary file left, and every file under a record's name a complete record."""
    names = sorted(os.listdir(url)) if os.path.isdir(url) else []
    leftovers = [n for n in names if n.startswith(TMP_PREFIX) or n.endswith(".tmp")]
    assert leftovers == [], f"temporary files left in the log: {leftovers}"
    storage = LogStorage(url, {})
    for name in names:
        if name == OWNER or RECORD_NAME.match(name):
            storage.readRecord(storage.path(name))  # CorruptRecord if torn


def assertClear(error: BaseException, query: Query, record: str, code: int) -> None:
    """The error names the log, the record, the OS error and the fix, the OSError chained."""
    assert isinstance(error, DecisionLogWriteError), repr(error)
    text = str(error)
    assert text.startswith(f"twophase decision log {query.url}: could not write {record}: ")
    assert f": {errno.errorcode[code]} (" in text
    assert error.errno == code and error.record == record
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == code
    fixes = {
        errno.ENOSPC: "is full (or its quota used up): free space on it",
        errno.EROFS: "is read-only: make it writable again",
    }
    fix = fixes[code]
    assert f"The filesystem holding {query.url} {fix}." in text
    assert "restart the query; it recovers from the log" in text


# ---------------------------------------------------------------------------- the disk


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    if not Disk.possible():
        pytest.skip(
            "needs root to mount the size-limited tmpfs it fills (and the mount command); "
            "run as root, as CI does"
        )
    mounted = Disk(tmp_path / "disk", sizeMb=8)
    mounted.mount()
    try:
        yield mounted
    finally:
        writable(mounted)
        mounted.unmount()


def readOnly(disk: Disk) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(disk.path)], check=True, capture_output=True)


def writable(disk: Disk) -> None:
    subprocess.run(["mount", "-o", "remount,rw", str(disk.path)], check=True, capture_output=True)


@pytest.fixture
def query(disk: Disk) -> Query:
    """A query whose checkpoint, output and staging are all on the disk."""
    return Query(disk.path / "out", disk.path / "ckpt")


Before = Callable[[str, Callable[[], None]], None]


@pytest.fixture
def before(monkeypatch: pytest.MonkeyPatch) -> Before:
    """``before(write, action)``: run ``action`` once, right before ``write``: a record's
    name, ``sink.json``, ``PRUNE`` (the log's removal of old records) or ``COMMIT`` (the files
    committer's first commit of a handle). The writes themselves run unchanged."""
    armed: dict[str, Callable[[], None]] = {}

    def fire(write: str) -> None:
        action = armed.pop(write, None)
        if action is not None:
            action()

    publish, remove = LogStorage.publish, LogStorage.remove
    describe, commit = driverModule.writeSinkDescription, FilesCommitter.commit

    def publishing(self: LogStorage, name: str, body: Any, *, exclusive: bool, what: str) -> None:
        fire(name)
        publish(self, name, body, exclusive=exclusive, what=what)

    def removing(self: LogStorage, paths: Any, *, what: str) -> None:
        fire(PRUNE)
        remove(self, paths, what=what)

    def describing(location: str, description: Any) -> None:
        fire(SINK_DESCRIPTION)
        describe(location, description)

    def committing(self: FilesCommitter, handle: Any) -> None:
        fire(COMMIT)
        commit(self, handle)

    monkeypatch.setattr(LogStorage, "publish", publishing)
    monkeypatch.setattr(LogStorage, "remove", removing)
    monkeypatch.setattr(driverModule, "writeSinkDescription", describing)
    monkeypatch.setattr(FilesCommitter, "commit", committing)

    def arm(write: str, action: Callable[[], None]) -> None:
        armed[write] = action

    return arm


def decided(batchId: int) -> str:
    return recordName(batchId, BatchStatus.DECIDED)


def committed(batchId: int) -> str:
    return recordName(batchId, BatchStatus.COMMITTED)


def aborted(batchId: int) -> str:
    return recordName(batchId, BatchStatus.ABORTED)


# ---------------------------------------------------------------------------- the log's writes


def test_full_disk_at_the_owner_record(disk: Disk, query: Query, before: Before) -> None:
    before(OWNER, disk.fill)
    with pytest.raises(DecisionLogWriteError) as failure:
        query.start(0)
    assertClear(
        failure.value, query, f"the owner record (owner.json) of query {QUERY}", errno.ENOSPC
    )
    assertNoHalfRecord(query.url)
    assert query.log.owner() is None

    disk.free()
    query.runBatch(0)
    query.runBatch(1)
    query.assertExactlyOnce(range(2))


def test_full_disk_at_sink_json(disk: Disk, query: Query, before: Before) -> None:
    before(SINK_DESCRIPTION, disk.fill)
    with pytest.raises(DecisionLogWriteError) as failure:
        query.start(0)
    assertClear(failure.value, query, "the sink description (sink.json)", errno.ENOSPC)
    assertNoHalfRecord(query.url)
    assert not (Path(query.url) / SINK_DESCRIPTION).exists()

    disk.free()
    query.runBatch(0)
    query.assertExactlyOnce(range(1))
    assert (Path(query.url) / SINK_DESCRIPTION).exists()


def test_full_disk_at_the_decision(disk: Disk, query: Query, before: Before) -> None:
    query.runBatch(0)
    query.start(1)
    results = query.tasks(1)
    before(decided(1), disk.fill)
    with pytest.raises(DecisionLogWriteError) as failure:
        query.commit(1, results)
    assertClear(failure.value, query, "the decision of batch 1", errno.ENOSPC)
    # Spark's abort deleted the batch's staged files, which made room for its aborted mark.
    assert query.abortErrors == []
    assertNoHalfRecord(query.url)
    state = query.log.state(1)
    assert state is not None and state.status is BatchStatus.ABORTED, "batch 1 is not decided"
    assert all(i < 100 for i in query.visibleIds()), "nothing of batch 1 is visible"

    disk.free()
    query.runBatch(1)  # Spark replays batch 1: it never reached commits/1
    query.runBatch(2)
    query.assertExactlyOnce(range(3))


def test_full_disk_at_the_committed_mark_of_a_commit_and_of_recovery(
    disk: Disk, query: Query, before: Before
) -> None:
    query.runBatch(0)
    query.start(1)
    results = query.tasks(1)
    before(committed(1), disk.fill)
    with pytest.raises(DecisionLogWriteError) as failure:
        query.commit(1, results)
    assertClear(failure.value, query, "the committed mark of batch 1", errno.ENOSPC)
    [abortError] = query.abortErrors  # Spark's abort rolls the decided batch forward, again
    assertClear(abortError, query, "the committed mark of batch 1", errno.ENOSPC)
    assertNoHalfRecord(query.url)
    state = query.log.state(1)
    assert state is not None and state.status is BatchStatus.DECIDED

    # A restart while the disk is still full: recovery commits again, and fails as clearly.
    with pytest.raises(DecisionLogWriteError) as again:
        query.start(1)
    assertClear(again.value, query, "the committed mark of batch 1", errno.ENOSPC)
    assertNoHalfRecord(query.url)

    disk.free()
    query.runBatch(1)  # recovery marks it committed; the replay writes nothing
    query.runBatch(2)
    query.assertExactlyOnce(range(3))


def test_full_disk_at_the_aborted_mark(disk: Disk, query: Query, before: Before) -> None:
    query.runBatch(0)
    query.start(1)
    results = query.tasks(1)  # then another task of the batch failed: Spark aborts it
    before(aborted(1), disk.fill)
    query.abort(1, results)
    [failure] = query.abortErrors
    assertClear(failure, query, "the aborted mark of batch 1", errno.ENOSPC)
    assertNoHalfRecord(query.url)
    assert query.log.state(1) is None

    disk.free()
    query.runBatch(1)
    query.runBatch(2)
    query.assertExactlyOnce(range(3))


def test_full_disk_at_a_rewrite_record_keeps_the_previous_one(disk: Disk, query: Query) -> None:
    # Only a participant that loses decided transactions (Kafka, S3 multipart) writes one:
    # the log's own write, on the disk.
    log = query.log
    log.decide(0, [TaskResult(SINK, QUERY, 0, p, 0, {"txn": f"t{p}"}, ROWS) for p in range(3)])
    log.recordRewrite(0, [0], [])
    replacement = LoggedHandle(0, 1, {"txn": "replay"}, ROWS)
    disk.fill()
    with pytest.raises(DecisionLogWriteError) as failure:
        log.recordRewrite(0, [0, 1], [replacement])
    assertClear(
        failure.value, query, "the rewrite record (lost partitions [0, 1]) of batch 0", errno.ENOSPC
    )
    assertNoHalfRecord(query.url)
    state = log.state(0)
    assert state is not None and state.awaitingRewrite == (0,) and state.replacements == ()

    disk.free()
    log.recordRewrite(0, [0, 1], [replacement])
    state = log.state(0)
    assert state is not None and state.awaitingRewrite == (1,)
    assert state.replacements == (replacement,)


def test_full_disk_at_pruning_does_not_fail_the_batch(disk: Disk, before: Before) -> None:
    query = Query(disk.path / "out", disk.path / "ckpt", logRetentionBatches="1")
    query.runBatch(0)
    query.runBatch(1)
    query.start(2)
    results = query.tasks(2)
    before(PRUNE, disk.fill)
    query.commit(2, results)  # removing files takes no space
    assert query.log.committedBatchIds() == [2]
    disk.free()
    query.assertExactlyOnce(range(3))


def test_full_disk_at_the_figures_only_records_does_not_fail_the_batch(
    disk: Disk, query: Query, before: Before
) -> None:
    query.runBatch(0)
    query.start(1)
    query.tasks(1)  # prepared, then the driver died before deciding
    before(recordName(1, BatchStatus.RECOVERY), disk.fill)
    query.start(1)  # the recovery aborts them; its record is refused and left out
    disk.free()
    assert query.log.figures(1) is None
    query.tasks(1)  # a failed attempt: the commit's cleanup aborts it ...
    results = query.tasks(1)
    before(committed(1), lambda: before(committed(1), disk.fill))  # ... and its second mark
    query.commit(1, results)
    disk.free()
    figures = query.log.figures(1)
    assert figures is not None and figures.outcome == "committed" and figures.aborted == 0
    assertNoHalfRecord(query.url)
    query.runBatch(2)
    query.assertExactlyOnce(range(3))


def test_read_only_disk_at_the_decision(disk: Disk, query: Query, before: Before) -> None:
    query.runBatch(0)
    query.start(1)
    results = query.tasks(1)
    before(decided(1), lambda: readOnly(disk))
    with pytest.raises(DecisionLogWriteError) as failure:
        query.commit(1, results)
    assertClear(failure.value, query, "the decision of batch 1", errno.EROFS)
    [abortError] = query.abortErrors
    assertClear(abortError, query, "the aborted mark of batch 1", errno.EROFS)
    assertNoHalfRecord(query.url)
    assert query.log.state(1) is None

    writable(disk)
    query.runBatch(1)  # recovery removes what the abort could not; Spark replays batch 1
    query.assertExactlyOnce(range(2))


# ---------------------------------------------------------------------------- the files sink


def test_full_output_disk_fails_the_task_clearly(disk: Disk, tmp_path: Path) -> None:
    query = Query(disk.path / "out", tmp_path / "ckpt")  # the checkpoint elsewhere
    query.runBatch(0)
    query.start(1)
    disk.fill()
    with pytest.raises(FilesNotWritableError) as failure:
        query.tasks(1)
    text = str(failure.value)
    assert failure.value.errno == errno.ENOSPC
    assert text.startswith(f"files sink {SINK}, batch 1, partition 0 (attempt 0): ")
    assert f"cannot write its files under {query.staging}: ENOSPC (" in text
    assert f"The filesystem holding {query.staging} is full: free space on it." in text
    assert [p for p in query.staging.rglob("*") if p.is_file()] == [], "the task cleaned up"
    query.abort(1, [])  # the job failed: Spark aborts the batch
    assert query.abortErrors == []

    disk.free()
    query.runBatch(1)
    query.assertExactlyOnce(range(2))


def test_full_output_disk_at_the_commit_still_commits(
    disk: Disk, tmp_path: Path, before: Before
) -> None:
    query = Query(disk.path / "out", tmp_path / "ckpt")
    query.start(0)
    results = query.tasks(0)
    before(COMMIT, disk.fill)
    query.commit(0, results)  # a rename takes no space
    query.assertExactlyOnce(range(1))


def test_read_only_output_at_the_commit_keeps_the_decision(
    disk: Disk, tmp_path: Path, before: Before
) -> None:
    query = Query(disk.path / "out", tmp_path / "ckpt")
    query.runBatch(0)
    query.start(1)
    results = query.tasks(1)
    before(COMMIT, lambda: readOnly(disk))
    with pytest.raises(CommitFailedError) as failure:
        query.commit(1, results)
    text = str(failure.value)
    # The first commit made the disk read-only; the other may have renamed its file before.
    assert re.search(r"batch 1 is decided but [12] handle\(s\) could not be committed", text)
    assert (
        "Read-only file system" in text and "the next start of the query rolls it forward" in text
    )
    state = query.log.state(1)
    assert state is not None and state.status is BatchStatus.DECIDED

    writable(disk)
    query.runBatch(1)
    query.assertExactlyOnce(range(2))


# ---------------------------------------------------------------------------- torn records


@pytest.mark.parametrize("torn", ["decided", "committed"])
def test_a_torn_record_is_never_read_as_a_decision(tmp_path: Path, torn: str) -> None:
    """A record cut short under its final name (a writer without an atomic rename on a full
    disk) is never read as what it would have said: not a decision, not a committed mark."""
    query = Query(tmp_path / "out", tmp_path / "ckpt")
    query.runBatch(0)
    query.start(1)
    results = query.tasks(1)
    if torn == "committed":
        query.commit(1, results)
    scratch = DecisionLog(str(tmp_path / "scratch"))
    scratch.decide(1, results)
    if torn == "committed":
        scratch.markCommitted(1, 0.1)
    name = recordName(1, BatchStatus(torn))
    whole = (tmp_path / "scratch" / name).read_bytes()
    (Path(query.url) / name).write_bytes(whole[: len(whole) // 2])

    state: BatchState | None = query.log.state(1)
    if torn == "decided":
        assert state is None and not query.log.isDecided(1) and query.log.lastDecided() == 0
        assert query.log.outstanding() == []
    else:
        # Not read as committed; the scans trust the mark by its name (it is written only
        # after every commit returned), and the replay's commit writes it again.
        assert state is not None and state.status is BatchStatus.DECIDED
        assert query.log.lastDecided() == 1

    query.runBatch(1)  # the restart: recovery, then Spark's replay of batch 1
    query.runBatch(2)
    query.assertExactlyOnce(range(3))
