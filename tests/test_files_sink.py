"""The files sink against the crash table: real local disk and fsspec's memory filesystem.

No Spark here: the writer and the committer are plain Python. Each test is one window of
PROTOCOL.md section 5 (or one option), driving the writer's ``beginTransaction`` -> ``write`` ->
``preCommit`` and the committer's ``commit``/``abort``/``recoverAndAbort`` directly and reading
the output back the way users do (``pyarrow.dataset``, ``pandas``), which skip ``_``-prefixed
paths.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import pickle
import tracemalloc
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest

from twophase.protocol import (
    Handle,
    RecoveryScope,
    TransactionContext,
    TransactionLostError,
    dumpsHandle,
    loadsHandle,
)
from twophase.redaction import publicOptions
from twophase.sinks.files import (
    LEGACY_STAGING_ROOT,
    FilesCommitter,
    FilesSettings,
    FilesWriter,
    finalFileName,
)
from twophase.sinks.files.partitioning import escapePathName, partitionValueText
from twophase.spark.declared import FilesSink

SINK = "sink-1"
_POOLS: list[pa.MemoryPool] = []


# -- fixtures and helpers -----------------------------------------------------------------


@dataclass
class Target:
    """An output directory on one filesystem: the URL given to the sink and a reader's view.

    ``stagingRoot`` is the default staging path beside it, where handles' staging paths point.
    """

    url: str
    fs: fsspec.AbstractFileSystem
    root: str

    @property
    def stagingRoot(self) -> str:
        parent, name = self.root.rstrip("/").rsplit("/", 1)
        return f"{parent}/_twophase-staging/{name}"

    def files(self, root: str | None = None) -> list[str]:
        """Every file below the output root (or ``root``), relative; hidden ones included."""
        root = root or self.root
        if not self.fs.exists(root):
            return []
        return sorted(p[len(root) + 1 :] for p in self.fs.find(root))

    def visibleFiles(self) -> list[str]:
        """Every file below the output path: a DuckDB or polars ``**`` glob reads them all."""
        return self.files()

    def stagingFiles(self) -> list[str]:
        """Every file below the staging path, relative to it (as handles name them)."""
        return self.files(self.stagingRoot)

    def dataset(self, format: str = "parquet") -> ds.Dataset:
        return ds.dataset(self.root, filesystem=self.fs, format=format, partitioning="hive")


@pytest.fixture(params=["local", "memory"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "local":
        root = str(tmp_path / "out")
        yield Target(url=root, fs=fsspec.filesystem("file"), root=root)
    else:
        name = f"twophase-test-{uuid.uuid4().hex[:8]}"
        fs = fsspec.filesystem("memory")
        yield Target(url=f"memory://{name}", fs=fs, root=f"/{name}")
        for leftover in (f"/{name}", f"/_twophase-staging/{name}"):
            if fs.exists(leftover):
                fs.rm(leftover, recursive=True)


@pytest.fixture
def local(tmp_path: Path) -> Target:
    root = str(tmp_path / "out")
    return Target(url=root, fs=fsspec.filesystem("file"), root=root)


@dataclass
class Sink:
    """The files sink's two halves over one output: the tasks' writer, the driver's committer."""

    writer: FilesWriter
    committer: FilesCommitter


def sinkOf(target: Target, **options: Any) -> Sink:
    settings = FilesSettings.fromOptions(
        {"path": target.url, **{k: str(v) for k, v in options.items()}}
    )
    sink = Sink(FilesWriter(settings), FilesCommitter(settings))
    sink.committer.checkStagingArea()  # as the driver's first recoverAndAbort does at start
    return sink


def context(
    batchId: int = 0, partitionId: int = 0, attempt: int = 0, sinkId: str = SINK
) -> TransactionContext:
    return TransactionContext(
        sinkId=sinkId,
        queryId="query",
        batchId=batchId,
        partitionId=partitionId,
        attemptNumber=attempt,
        runId="run1",
    )


def rows(start: int, count: int) -> pa.RecordBatch:
    ids = np.arange(start, start + count, dtype=np.int64)
    return pa.record_batch(
        {
            "id": ids,
            "value": ids * 0.5,
            "name": pc.cast(pa.array(ids), pa.string()),
            "bucket": ids % 3,
        }
    )


def prepare(
    sink: FilesWriter, batches: list[pa.RecordBatch], ctx: TransactionContext | None = None
) -> Handle:
    txn = sink.beginTransaction(ctx or context())
    for batch in batches:
        sink.write(txn, batch)
    return sink.preCommit(txn)


def idsOf(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


# -- visibility and commit ------------------------------------------------------------------


def test_commit_makes_every_row_visible(target: Target) -> None:
    sink = sinkOf(target)
    handle = prepare(sink.writer, [rows(0, 100), rows(100, 50)], context(batchId=3, partitionId=7))

    sink.committer.commit(handle)

    assert idsOf(target.dataset().to_table()) == list(range(150))
    assert target.stagingFiles() == []
    assert target.visibleFiles() == [finalFileName(SINK, 3, 7, 0, ".snappy.parquet")]


def test_commit_is_visible_to_pandas(local: Target) -> None:
    sink = sinkOf(local, partitionBy="bucket")
    sink.committer.commit(prepare(sink.writer, [rows(0, 30)]))
    leftover = prepare(sink.writer, [rows(1000, 5)], context(batchId=1))  # prepared, never decided

    frame = pd.read_parquet(local.root)

    assert sorted(frame["id"]) == list(range(30))
    assert sorted(frame["bucket"].astype(int).unique()) == [0, 1, 2]
    assert leftover["files"]


def test_handle_is_small_json_with_the_documented_keys(local: Target) -> None:
    sink = sinkOf(local)
    handle = prepare(sink.writer, [rows(0, 10)], context(batchId=12, partitionId=3, attempt=1))

    assert loadsHandle(dumpsHandle(handle)) == handle
    assert set(handle) == {
        "kind",
        "path",
        "stagingPath",
        "batchId",
        "partitionId",
        "attempt",
        "staging",
        "files",
    }
    assert handle["stagingPath"] == local.stagingRoot
    assert handle["kind"] == "files"
    assert (handle["path"], handle["batchId"], handle["partitionId"], handle["attempt"]) == (
        local.root,
        12,
        3,
        1,
    )
    assert handle["staging"].startswith(f"{SINK}/12-run1-p00003-a1-")
    assert handle["files"] == [
        {
            "staging": f"{handle['staging']}-f0000.staged",
            "final": f"part-00000012-00003-0000-{SINK}.snappy.parquet",
            "rows": 10,
        }
    ]


def test_commit_from_another_process_needs_only_the_handle(target: Target) -> None:
    executor = sinkOf(target, maxRecordsPerFile=7)
    text = dumpsHandle(prepare(executor.writer, [rows(0, 20)]))

    driver = pickle.loads(pickle.dumps(sinkOf(target, maxRecordsPerFile=7).committer))
    driver.commit(loadsHandle(text))

    assert idsOf(target.dataset().to_table()) == list(range(20))


def test_crash_midway_through_commit_then_commit_again_completes(target: Target) -> None:
    sink = sinkOf(target, maxRecordsPerFile=10)
    handle = prepare(sink.writer, [rows(0, 45)])
    assert len(handle["files"]) == 5
    # The first commit renamed two files before the driver died.
    for entry in handle["files"][:2]:
        target.fs.mv(f"{target.stagingRoot}/{entry['staging']}", f"{target.root}/{entry['final']}")
    assert target.dataset().count_rows() == 20

    sink.committer.commit(handle)

    assert idsOf(target.dataset().to_table()) == list(range(45))
    assert target.stagingFiles() == []


def test_crash_after_copy_before_delete_on_object_store_drops_the_staged_copy(
    target: Target,
) -> None:
    sink = sinkOf(target)
    handle = prepare(sink.writer, [rows(0, 30)])
    entry = handle["files"][0]
    # Object-store rename is copy + delete: the copy landed, the delete did not.
    target.fs.copy(f"{target.stagingRoot}/{entry['staging']}", f"{target.root}/{entry['final']}")

    sink.committer.commit(handle)

    assert target.stagingFiles() == []
    assert idsOf(target.dataset().to_table()) == list(range(30))


def test_commit_of_a_handle_whose_files_vanished_fails_loudly(target: Target) -> None:
    sink = sinkOf(target)
    handle = prepare(sink.writer, [rows(0, 5)])
    for entry in handle["files"]:
        target.fs.rm(f"{target.stagingRoot}/{entry['staging']}")

    with pytest.raises(TransactionLostError, match="batch 0 partition 0"):
        sink.committer.commit(handle)


def test_permanent_errors_propagate_unchanged(local: Target) -> None:
    """A real refusal of the filesystem (the output path is a file, not a directory) is not
    retried as transient: it reaches the coordinator as it is. A transient one (the server
    down) is integration_tests/test_files_s3.py's."""
    sink = sinkOf(local)
    handle = prepare(sink.writer, [rows(0, 5)])
    if local.fs.exists(local.root):
        local.fs.rm(local.root, recursive=True)
    Path(local.root).write_text("not a directory")
    with pytest.raises(OSError) as info:
        sink.committer.commit(handle)
    assert isinstance(info.value, (NotADirectoryError, FileExistsError)), info.value


def test_empty_task_prepares_and_commits_nothing(target: Target) -> None:
    sink = sinkOf(target)
    handle = prepare(sink.writer, [rows(0, 0)])

    sink.committer.commit(handle)

    assert handle["files"] == []
    assert target.visibleFiles() == []
    assert target.stagingFiles() == []


# -- durability: every fsync the protocol needs -------------------------------------------


@dataclass
class Syncs:
    """The paths this process fsynced (files through ``fdatasync``/``fsync``, directories)."""

    paths: list[str]

    def since(self, mark: int) -> list[str]:
        return self.paths[mark:]


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Syncs:
    import os

    seen = Syncs([])
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def recording(fd: int, real: Any = real) -> None:
            seen.paths.append(os.readlink(f"/proc/self/fd/{fd}"))
            real(fd)

        monkeypatch.setattr(os, name, recording)
    return seen


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name descriptors")
def test_preCommit_syncs_each_staged_file_and_its_directory_and_what_is_above_once(
    local: Target, syncs: Syncs
) -> None:
    """Once preCommit returned, a machine crash cannot lose a staged file or its entry."""
    sink = sinkOf(local, partitionBy="bucket")
    first = prepare(sink.writer, [rows(0, 30)], context(partitionId=0))
    sinkDir = f"{local.stagingRoot}/{SINK}"
    stagedPaths = {f"{local.stagingRoot}/{f['staging']}" for f in first["files"]}
    above = [str(p) for p in Path(sinkDir).parents]

    assert stagedPaths <= set(syncs.paths)
    assert syncs.paths.index(sinkDir) > max(syncs.paths.index(p) for p in stagedPaths)
    assert set(above) <= set(syncs.paths), "the sink's staging directory's entry is not durable"

    mark = len(syncs.paths)
    second = prepare(sink.writer, [rows(30, 3)], context(partitionId=1))
    assert sorted(syncs.since(mark)) == sorted(
        [f"{local.stagingRoot}/{f['staging']}" for f in second["files"]] + [sinkDir]
    ), "a later task syncs its files and the sink's directory, nothing above it again"

    mark = len(syncs.paths)
    prepare(sink.writer, [rows(0, 0)], context(partitionId=2))
    assert syncs.since(mark) == [], "a task without rows synced something"


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name descriptors")
def test_commit_syncs_every_final_directory_before_it_returns(local: Target, syncs: Syncs) -> None:
    sink = sinkOf(local, partitionBy="bucket")
    handle = prepare(sink.writer, [rows(0, 30)])
    mark = len(syncs.paths)

    sink.committer.commit(handle)

    synced = syncs.since(mark)
    finals = {str(Path(local.root, f["final"]).parent) for f in handle["files"]}
    assert len(finals) == 3
    assert finals | {local.root} <= set(synced)
    assert max(synced.index(d) for d in finals) < synced.index(local.root), (
        "a new partition directory's entry must be synced after its contents"
    )


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name descriptors")
def test_a_resumed_commit_syncs_what_the_interrupted_one_renamed(
    local: Target, syncs: Syncs
) -> None:
    sink = sinkOf(local, partitionBy="bucket")
    handle = prepare(sink.writer, [rows(0, 30)])
    first = handle["files"][0]
    # The driver died after this rename, before it synced the directory.
    Path(local.root, first["final"]).parent.mkdir(parents=True)
    Path(local.stagingRoot, first["staging"]).rename(Path(local.root, first["final"]))
    mark = len(syncs.paths)

    sink.committer.commit(handle)

    assert str(Path(local.root, first["final"]).parent) in syncs.since(mark)
    assert idsOf(local.dataset().to_table()) == list(range(30))


def test_threads_syncing_one_directory_share_fsyncs_that_began_after_their_change(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import os
    import threading
    import time

    from twophase.sinks.files import durability

    runs: list[tuple[float, float]] = []
    realFsync = os.fsync

    def slowDiskFsync(fd: int) -> None:
        """The disk, not our code, is what is replaced: a tmp directory's fsync returns at
        once, a real disk's takes milliseconds, and only then do callers pile up behind it."""
        start = time.monotonic()
        time.sleep(0.01)
        realFsync(fd)
        runs.append((start, time.monotonic()))

    monkeypatch.setattr(os, "fsync", slowDiskFsync)
    syncer = durability.DirectorySyncer()
    calls: list[tuple[float, float]] = []
    lock = threading.Lock()

    def caller() -> None:
        for _ in range(5):
            entered = time.monotonic()
            syncer.sync(str(tmp_path))
            with lock:
                calls.append((entered, time.monotonic()))

    threads = [threading.Thread(target=caller) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert len(calls) == 80
    assert len(runs) < len(calls) / 2, "concurrent callers did not share fsyncs"
    for entered, returned in calls:
        assert any(entered <= start and end <= returned for start, end in runs), (
            "a caller returned without an fsync that began after its change"
        )


# -- attempts, abort and recovery -----------------------------------------------------------


def test_two_attempts_of_one_task_map_to_the_same_final_names(local: Target) -> None:
    sink = sinkOf(local, maxRecordsPerFile=8, partitionBy="bucket")
    first = prepare(sink.writer, [rows(0, 40)], context(batchId=5, partitionId=1, attempt=0))
    second = prepare(sink.writer, [rows(0, 40)], context(batchId=5, partitionId=1, attempt=1))

    assert first["staging"] != second["staging"]
    assert [f["final"] for f in first["files"]] == [f["final"] for f in second["files"]]

    sink.committer.commit(second)
    sink.committer.recoverAndAbort(RecoveryScope(sinkId=SINK, batchId=5))

    assert idsOf(local.dataset().to_table()) == list(range(40))
    assert local.stagingFiles() == []


def test_abort_removes_staging_and_never_touches_committed_files(target: Target) -> None:
    sink = sinkOf(target)
    committed = prepare(sink.writer, [rows(0, 10)], context(batchId=0))
    sink.committer.commit(committed)
    # A second attempt of the committed task (a speculative duplicate) and a later batch.
    duplicate = prepare(sink.writer, [rows(0, 10)], context(batchId=0, attempt=1))
    later = prepare(sink.writer, [rows(10, 10)], context(batchId=1))
    assert [f["final"] for f in duplicate["files"]] == [f["final"] for f in committed["files"]]

    sink.committer.abort(duplicate)
    sink.committer.abort(later)
    sink.committer.abort(later)  # idempotent

    assert target.stagingFiles() == []
    assert idsOf(target.dataset().to_table()) == list(range(10))


def test_task_failure_before_preCommit_cleans_its_staging(target: Target) -> None:
    sink = sinkOf(target, partitionBy="bucket")
    txn = sink.writer.beginTransaction(context())
    sink.writer.write(txn, rows(0, 30))
    assert target.stagingFiles()

    sink.writer.abortTransaction(txn)

    assert target.stagingFiles() == []
    assert target.visibleFiles() == []
    with pytest.raises(RuntimeError, match="aborted"):
        sink.writer.write(txn, rows(30, 1))


def test_recoverAndAbort_removes_an_attempt_that_never_prepared(target: Target) -> None:
    sink = sinkOf(target)
    crashed = sink.writer.beginTransaction(context(batchId=4, partitionId=0))
    sink.writer.write(crashed, rows(0, 10))  # the task's worker was killed here: files stay open
    kept = prepare(sink.writer, [rows(10, 10)], context(batchId=4, partitionId=1))
    undecided = prepare(sink.writer, [rows(20, 10)], context(batchId=3, partitionId=0))

    aborted = sink.committer.recoverAndAbort(RecoveryScope(sinkId=SINK, keep=(kept,)))

    assert sorted(h["staging"] for h in aborted) == sorted([crashed.staging, undecided["staging"]])
    assert {(h["batchId"], h.get("partitionId"), h.get("attempt")) for h in aborted} == {
        (4, 0, 0),
        (3, 0, 0),
    }
    assert all(h["kind"] == "files" for h in aborted)
    assert sorted(target.stagingFiles()) == sorted(f["staging"] for f in kept["files"])
    assert not [f for f in target.stagingFiles() if f.startswith(f"{SINK}/3-")]
    assert target.visibleFiles() == []

    sink.committer.commit(kept)  # the kept handle still commits
    assert idsOf(target.dataset().to_table()) == list(range(10, 20))
    assert sink.committer.recoverAndAbort(RecoveryScope(sinkId=SINK)) == []


def test_recoverAndAbort_of_one_batch_leaves_other_batches_and_other_sinks(target: Target) -> None:
    sink = sinkOf(target)
    straggler = prepare(sink.writer, [rows(0, 5)], context(batchId=8, attempt=1))
    nextBatch = prepare(sink.writer, [rows(5, 5)], context(batchId=9))
    otherSink = prepare(sink.writer, [rows(10, 5)], context(batchId=8, sinkId="other query"))

    aborted = sink.committer.recoverAndAbort(RecoveryScope(sinkId=SINK, batchId=8))

    assert [h["staging"] for h in aborted] == [straggler["staging"]]
    remaining = set(target.stagingFiles())
    assert {f["staging"] for f in nextBatch["files"]} <= remaining
    assert {f["staging"] for f in otherSink["files"]} <= remaining


def test_recoverAndAbort_with_nothing_to_do_is_cheap_and_empty(target: Target) -> None:
    sink = sinkOf(target)

    assert sink.committer.recoverAndAbort(RecoveryScope(sinkId=SINK)) == []
    assert sink.committer.recoverAndAbort(RecoveryScope(sinkId=SINK, batchId=0)) == []


def test_two_queries_on_one_path_never_share_file_names(local: Target) -> None:
    sink = sinkOf(local)
    first = prepare(sink.writer, [rows(0, 5)], context(batchId=0, sinkId="checkpoint-a"))
    second = prepare(sink.writer, [rows(5, 5)], context(batchId=0, sinkId="checkpoint-b"))

    sink.committer.commit(first)
    sink.committer.commit(second)

    assert idsOf(local.dataset().to_table()) == list(range(10))


def test_commit_refuses_handles_that_point_outside_staging(local: Target) -> None:
    sink = sinkOf(local)
    handle = prepare(sink.writer, [rows(0, 5)])

    with pytest.raises(ValueError, match="staging directory"):
        sink.committer.abort({**handle, "staging": "../elsewhere"})
    with pytest.raises(ValueError, match="not a files handle"):
        sink.committer.commit({**handle, "kind": "postgres"})


# -- the staging path: outside the output, seen by no reader ------------------------------


def readersSee(root: str) -> dict[str, list[int]]:
    """The ids each reader of an output directory sees, the way users point them at it."""
    import duckdb
    import polars as pl

    def duck(source: str) -> list[int]:
        with duckdb.connect() as con:
            return [
                r[0] for r in con.execute(f"select id from read_parquet('{source}')").fetchall()
            ]

    def polars(source: str) -> list[int]:
        return list(pl.scan_parquet(source).select("id").collect()["id"].to_list())

    seen = {
        "pyarrow": ds.dataset(root, format="parquet").to_table(columns=["id"])["id"].to_pylist(),
        "duckdb glob": duck(f"{root}/**/*.parquet"),
        "duckdb dir": duck(root),
        "polars glob": polars(f"{root}/**/*.parquet"),
        "polars dir": polars(root),
    }
    return {reader: sorted(ids) for reader, ids in seen.items()}


def test_prepared_and_crashed_attempts_are_invisible_to_duckdb_and_polars(local: Target) -> None:
    """Prepared-but-undecided and killed attempts stay outside the path every reader globs."""
    sink = sinkOf(local, maxRecordsPerFile=7)
    sink.committer.commit(prepare(sink.writer, [rows(0, 30)], context(batchId=0)))
    prepare(sink.writer, [rows(100, 20)], context(batchId=1))  # preCommit, then the query died
    crashed = sink.writer.beginTransaction(context(batchId=1, partitionId=1))
    sink.writer.write(crashed, rows(200, 20))  # killed mid-task: files open, never prepared
    assert len(local.stagingFiles()) == 6
    assert not local.stagingRoot.startswith(local.root + "/")

    assert readersSee(local.root) == dict.fromkeys(readersSee(local.root), list(range(30)))

    aborted = sink.committer.recoverAndAbort(RecoveryScope(sinkId=SINK))

    assert len(aborted) == 2
    assert local.stagingFiles() == []
    assert readersSee(local.root) == dict.fromkeys(readersSee(local.root), list(range(30)))


def legacyLeftover(local: Target, batchId: int, ids: pa.RecordBatch) -> Handle:
    """What an earlier release left: a prepared attempt under ``<path>/_twophase/staging``."""
    final = finalFileName(SINK, batchId, 0, 0, ".snappy.parquet")
    staging = f"{LEGACY_STAGING_ROOT}/{SINK}/{batchId}/run0-p00000-a0-0123456789ab"
    Path(local.root, staging).mkdir(parents=True)
    pq.write_table(pa.Table.from_batches([ids]), Path(local.root, staging, final))
    return {
        "kind": "files",
        "path": local.root,
        "batchId": batchId,
        "partitionId": 0,
        "attempt": 0,
        "staging": staging,
        "files": [{"staging": f"{staging}/{final}", "final": final, "rows": ids.num_rows}],
    }


def test_recovery_sweeps_what_the_earlier_layout_left_inside_the_output(local: Target) -> None:
    sink = sinkOf(local)
    sink.committer.commit(prepare(sink.writer, [rows(0, 10)], context(batchId=0)))
    leftover = legacyLeftover(local, 1, rows(50, 5))
    assert readersSee(local.root)["duckdb glob"] == [*range(10), *range(50, 55)]  # the defect

    aborted = sink.committer.recoverAndAbort(RecoveryScope(sinkId=SINK))

    assert [h["staging"] for h in aborted] == [leftover["staging"]]
    assert "stagingPath" not in aborted[0]
    assert not Path(local.root, "_twophase").exists()
    assert readersSee(local.root) == dict.fromkeys(readersSee(local.root), list(range(10)))


def test_a_handle_of_the_earlier_layout_decided_before_an_upgrade_still_commits(
    local: Target,
) -> None:
    sink = sinkOf(local)
    decided = legacyLeftover(local, 2, rows(0, 5))
    stray = legacyLeftover(local, 3, rows(5, 5))

    aborted = sink.committer.recoverAndAbort(RecoveryScope(sinkId=SINK, keep=(decided,)))
    sink.committer.recoverAndCommit(decided)
    sink.committer.commit(decided)  # idempotent

    assert [h["staging"] for h in aborted] == [stray["staging"]]
    assert readersSee(local.root) == dict.fromkeys(readersSee(local.root), list(range(5)))
    assert sink.committer.recoverAndAbort(RecoveryScope(sinkId=SINK)) == []
    assert not Path(local.root, "_twophase").exists()


def test_a_staging_path_option_beside_the_output_is_used(tmp_path: Path) -> None:
    local = Target(
        url=str(tmp_path / "out"), fs=fsspec.filesystem("file"), root=str(tmp_path / "out")
    )
    elsewhere = tmp_path / "scratch" / "stage"
    sink = sinkOf(local, stagingPath=str(elsewhere))
    handle = prepare(sink.writer, [rows(0, 5)])

    assert handle["stagingPath"] == str(elsewhere)
    assert list(elsewhere.rglob("*.staged"))
    sink.committer.commit(handle)
    assert idsOf(local.dataset().to_table()) == list(range(5))
    assert not list(elsewhere.rglob("*.staged"))


@pytest.mark.parametrize(
    ("path", "stagingPath", "message"),
    [
        ("/data/out", "/data/out/_stage", "overlap"),
        ("/data/out", "/data", "overlap"),
        ("memory://bucket/out", "/tmp/stage", "another filesystem"),
        ("/", "", "root of its filesystem"),
    ],
)
def test_a_staging_path_the_commit_cannot_use_is_refused(
    path: str, stagingPath: str, message: str
) -> None:
    options = {"path": path, **({"stagingPath": stagingPath} if stagingPath else {})}
    with pytest.raises(ValueError, match=message) as error:
        FilesSettings.fromOptions(options)
    assert "stagingPath" in str(error.value)


@pytest.mark.skipif(
    not Path("/dev/shm").is_dir() or Path("/dev/shm").stat().st_dev == Path("/tmp").stat().st_dev,
    reason="needs /dev/shm on another filesystem than /tmp",
)
def test_a_staging_path_on_another_device_is_refused_before_any_data_is_written(
    tmp_path: Path,
) -> None:
    stage = Path("/dev/shm") / f"twophase-test-{uuid.uuid4().hex[:8]}"
    settings = FilesSettings.fromOptions({"path": str(tmp_path / "out"), "stagingPath": str(stage)})
    try:
        with pytest.raises(ValueError, match="another filesystem or mount.*stagingPath"):
            FilesCommitter(settings).recoverAndAbort(RecoveryScope(sinkId=SINK))
    finally:
        if stage.exists():
            stage.rmdir()
    assert list((tmp_path / "out").iterdir()) == []


# -- layout: rolling, partitioning, open writers --------------------------------------------


def test_maxRecordsPerFile_rolls_to_the_right_number_of_files(target: Target) -> None:
    sink = sinkOf(target, maxRecordsPerFile=1000)
    handle = prepare(sink.writer, [rows(i * 700, 700) for i in range(10)])  # 7000 rows

    sink.committer.commit(handle)

    assert [f["rows"] for f in handle["files"]] == [1000] * 7
    assert len(target.visibleFiles()) == 7
    assert [
        ds.dataset(f"{target.root}/{f['final']}", filesystem=target.fs).count_rows()
        for f in handle["files"]
    ] == [1000] * 7
    assert idsOf(target.dataset().to_table()) == list(range(7000))


def test_partitionBy_writes_hive_directories_read_back_with_their_values(target: Target) -> None:
    sink = sinkOf(target, partitionBy="region,day")
    regions = ["eu/west", "us:east", None, "", "50% off", "a=b", "é ü"]
    count = 70
    batch = pa.record_batch(
        {
            "id": pa.array(range(count), pa.int64()),
            "region": pa.array([regions[i % len(regions)] for i in range(count)]),
            "day": pa.array([dt.date(2024, 1, 1 + i % 2) for i in range(count)]),
        }
    )
    handle = prepare(sink.writer, [batch])
    sink.committer.commit(handle)

    finals = {f["final"].rsplit("/", 1)[0] for f in handle["files"]}
    assert "region=eu%2Fwest/day=2024-01-01" in finals
    assert "region=us%3Aeast/day=2024-01-02" in finals
    assert "region=__HIVE_DEFAULT_PARTITION__/day=2024-01-01" in finals
    assert "region=50%25 off/day=2024-01-02" in finals
    assert "region=a%3Db/day=2024-01-01" in finals

    table = target.dataset().to_table()
    assert table.num_rows == count
    fileSchema = ds.dataset(
        f"{target.root}/{handle['files'][0]['final']}", filesystem=target.fs
    ).schema
    assert fileSchema.names == ["id"]  # partition columns are not in the files
    got = sorted(
        zip(
            table.column("id").to_pylist(),
            table.column("region").to_pylist(),
            [str(d) for d in table.column("day").to_pylist()],
            strict=True,
        )
    )
    expected = [
        (i, regions[i % len(regions)] or None, str(dt.date(2024, 1, 1 + i % 2)))
        for i in range(count)
    ]
    assert got == expected


def test_more_partitions_than_open_writers_closes_the_least_recently_used(local: Target) -> None:
    sink = sinkOf(local, partitionBy="bucket", maxOpenFiles=2)
    batches = [rows(i * 30, 30) for i in range(4)]  # every batch touches buckets 0, 1 and 2

    handle = prepare(sink.writer, batches)
    sink.committer.commit(handle)

    assert len(handle["files"]) > 3  # evicted writers reopen as new parts
    assert len({f["final"] for f in handle["files"]}) == len(handle["files"])
    assert idsOf(local.dataset().to_table()) == list(range(120))
    table = local.dataset().to_table()
    assert all(
        i % 3 == b
        for i, b in zip(table["id"].to_pylist(), table["bucket"].to_pylist(), strict=True)
    )


def test_partition_values_render_as_spark_renders_them() -> None:
    assert escapePathName("a/b:c=d%e#f") == "a%2Fb%3Ac%3Dd%25e%23f"
    assert escapePathName("plain value é") == "plain value é"
    assert escapePathName("tab\there") == "tab%09here"
    assert partitionValueText(None, pa.string()) == "__HIVE_DEFAULT_PARTITION__"
    assert partitionValueText("", pa.string()) == "__HIVE_DEFAULT_PARTITION__"
    assert partitionValueText(True, pa.bool_()) == "true"
    assert partitionValueText(1.0, pa.float64()) == "1.0"
    assert partitionValueText(1e20, pa.float64()) == "1.0E20"
    assert partitionValueText(0.0001, pa.float64()) == "1.0E-4"
    assert partitionValueText(1234.5, pa.float64()) == "1234.5"
    assert partitionValueText(float("nan"), pa.float64()) == "NaN"
    assert partitionValueText(0.1, pa.float32()) == "0.1"
    ts = dt.datetime(2024, 1, 2, 3, 4, 5, 120000)
    assert partitionValueText(ts, pa.timestamp("us")) == "2024-01-02 03:04:05.12"
    assert partitionValueText(dt.date(2024, 1, 2), pa.date32()) == "2024-01-02"


# -- formats --------------------------------------------------------------------------------


def mixedBatch() -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "score": pa.array([1.0, None, 2.5]),
            "text": pa.array(['say "hi"', "line\nbreak\\ and\ttab é", None]),
            "flag": pa.array([True, False, None]),
            "at": pa.array(
                [dt.datetime(2024, 1, 2, 3, 4, 5, 120000), None, dt.datetime(2024, 5, 6)],
                pa.timestamp("us"),
            ),
            "day": pa.array([dt.date(2024, 1, 2), dt.date(2024, 1, 3), None]),
            "tags": pa.array([["a", "b"], [], None], pa.list_(pa.string())),
        }
    )


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_json_lines_round_trip(target: Target, compression: str) -> None:
    sink = sinkOf(target, format="json", compression=compression)
    handle = prepare(sink.writer, [mixedBatch()])
    sink.committer.commit(handle)

    final = handle["files"][0]["final"]
    assert final.endswith(".json" if compression == "none" else ".json.gz")
    raw = target.fs.cat_file(f"{target.root}/{final}")
    text = (gzip.decompress(raw) if compression == "gzip" else raw).decode()
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines == [
        {
            "id": 1,
            "score": 1.0,
            "text": 'say "hi"',
            "flag": True,
            "at": "2024-01-02T03:04:05.120000",
            "day": "2024-01-02",
            "tags": ["a", "b"],
        },
        {
            "id": 2,
            "score": None,
            "text": "line\nbreak\\ and\ttab é",
            "flag": False,
            "at": None,
            "day": "2024-01-03",
            "tags": [],
        },
        {
            "id": 3,
            "score": 2.5,
            "text": None,
            "flag": None,
            "at": "2024-05-06T00:00:00.000000",
            "day": None,
            "tags": None,
        },
    ]
    assert '"score":1.0' in text  # floats stay floats for readers that infer types
    table = pajson.read_json(pa.BufferReader(text.encode()))
    assert table.column("id").to_pylist() == [1, 2, 3]
    assert table.column("score").type == pa.float64()


def test_json_lines_special_floats_and_zoned_timestamps(local: Target) -> None:
    sink = sinkOf(local, format="json")
    batch = pa.record_batch(
        {
            "x": pa.array([float("nan"), float("inf"), -float("inf"), -2.0, 1e20]),
            "at": pa.array(
                [dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)] * 5,
                pa.timestamp("us", tz="Europe/Berlin"),
            ),
        }
    )
    handle = prepare(sink.writer, [batch])
    sink.committer.commit(handle)

    text = Path(local.root, handle["files"][0]["final"]).read_text()
    assert [line.split(",")[0] for line in text.splitlines()] == [
        '{"x":NaN',
        '{"x":Infinity',
        '{"x":-Infinity',
        '{"x":-2.0',
        '{"x":1e+20',
    ]
    assert '"at":"2024-01-02T04:04:05.000000+01:00"' in text
    assert pd.read_json(Path(local.root, handle["files"][0]["final"]), lines=True).shape == (5, 2)


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_csv_round_trip(target: Target, compression: str) -> None:
    sink = sinkOf(target, format="csv", compression=compression, partitionBy="bucket")
    handle = prepare(sink.writer, [rows(0, 60)])
    sink.committer.commit(handle)

    assert all(
        f["final"].endswith(".csv" if compression == "none" else ".csv.gz") for f in handle["files"]
    )
    table = target.dataset("csv").to_table()
    assert idsOf(table) == list(range(60))
    byId = dict(zip(table["id"].to_pylist(), table["name"].to_pylist(), strict=True))
    assert byId[42] == 42  # the csv reader infers the digits back as integers
    assert table.schema.names == ["id", "value", "name", "bucket"]


def test_parquet_compression_codecs(local: Target) -> None:
    for codec, extension, expected in [
        ("zstd", ".zstd.parquet", "ZSTD"),
        ("none", ".parquet", "UNCOMPRESSED"),
        ("gzip", ".gz.parquet", "GZIP"),
    ]:
        sink = sinkOf(local, compression=codec)
        handle = prepare(
            sink.writer, [rows(0, 10)], context(batchId={"zstd": 0, "none": 1, "gzip": 2}[codec])
        )
        sink.committer.commit(handle)
        final = handle["files"][0]["final"]
        assert final.endswith(extension)
        meta = pq.ParquetFile(Path(local.root, final)).metadata
        assert meta.row_group(0).column(0).compression == expected


# -- options ------------------------------------------------------------------------------


def test_settings_defaults_and_case_insensitive_options() -> None:
    settings = FilesSettings.fromOptions(
        {
            "PATH": "/tmp/out",
            "maxrecordsperfile": "10",
            "partitionBy": "a, b",
            "checkpointLocation": "/tmp/cp",  # other options are ignored
            "fs.anon": "true",
            "fs.client_kwargs": '{"region_name": "eu-west-1"}',
            "fs.secret": "12345",
        }
    )

    assert settings == FilesSettings(
        path="/tmp/out",
        format="parquet",
        compression="snappy",
        maxRecordsPerFile=10,
        partitionBy=("a", "b"),
        storageOptions={
            "anon": True,
            "client_kwargs": {"region_name": "eu-west-1"},
            "secret": "12345",
        },
    )
    assert settings.extension == ".snappy.parquet"
    assert FilesSettings.fromOptions({"path": "p", "format": "JSON"}).compression == "none"
    assert (
        FilesSettings.fromOptions({"path": "p", "compression": "uncompressed"}).extension
        == ".parquet"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "option path is required"),
        ({"path": "  "}, "option path is required"),
        ({"path": "nosuchproto://x"}, "option path=.*protocol 'nosuchproto'"),
        (
            {"path": "p", "format": "avro"},
            "option format='avro' is not supported; use one of parquet",
        ),
        ({"path": "p", "compression": "lz77"}, "option compression='lz77' .* use one of snappy"),
        (
            {"path": "p", "format": "csv", "compression": "snappy"},
            "with format=csv; use one of none, gzip",
        ),
        (
            {"path": "p", "maxRecordsPerFile": "ten"},
            "option maxRecordsPerFile='ten' must be an integer",
        ),
        ({"path": "p", "maxRecordsPerFile": "-1"}, "option maxRecordsPerFile=-1 must be >= 0"),
        ({"path": "p", "maxOpenFiles": "0"}, "option maxOpenFiles=0 must be >= 1"),
        ({"path": "p", "partitionBy": "a,,b"}, "option partitionBy='a,,b' must list distinct"),
        ({"path": "p", "partitionBy": "a,a"}, "option partitionBy='a,a' must list distinct"),
        ({"path": "p", "header": "maybe"}, "option header='maybe' must be true or false"),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FilesSettings.fromOptions(options)


@pytest.mark.parametrize(
    ("options", "batch", "message"),
    [
        ({"partitionBy": "missing"}, rows(0, 3), "option partitionBy: column 'missing' is missing"),
        ({"partitionBy": "id,value,name,bucket"}, rows(0, 3), "names every column"),
        (
            {"partitionBy": "tags"},
            pa.record_batch({"id": [1], "tags": pa.array([["x"]])}),
            "has type list<item: string>",
        ),
        (
            {"format": "csv"},
            pa.record_batch({"id": [1], "tags": pa.array([["x"]])}),
            "option format=csv cannot write column 'tags'",
        ),
    ],
)
def test_data_the_options_cannot_write_is_refused_at_the_first_batch(
    local: Target, options: dict[str, str], batch: pa.RecordBatch, message: str
) -> None:
    sink = sinkOf(local, **options)
    txn = sink.writer.beginTransaction(context())
    with pytest.raises(ValueError, match=message):
        sink.writer.write(txn, batch)
    sink.writer.abortTransaction(txn)
    assert local.files() == []


def test_the_driver_refuses_a_schema_the_options_cannot_write_before_tasks_run() -> None:
    from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

    schema = StructType(
        [StructField("id", LongType()), StructField("tags", ArrayType(StringType()))]
    )
    base = {"path": "/tmp/out", "checkpointLocation": "/tmp/checkpoint"}
    FilesSink(base).validate(schema)
    with pytest.raises(ValueError, match="option partitionBy: column 'missing' is missing"):
        FilesSink({**base, "partitionBy": "missing"}).validate(schema)
    with pytest.raises(ValueError, match="option format=csv cannot write column 'tags'"):
        FilesSink({**base, "format": "csv"}).validate(schema)
    with pytest.raises(ValueError, match="option format='avro' is not supported"):
        FilesSink({"path": "/tmp/out", "format": "avro"}).validate(schema)


def test_schema_change_within_a_transaction_is_refused(local: Target) -> None:
    sink = sinkOf(local)
    txn = sink.writer.beginTransaction(context())
    sink.writer.write(txn, rows(0, 3))
    with pytest.raises(ValueError, match="schema changed"):
        sink.writer.write(txn, pa.record_batch({"id": [1]}))


# -- secrets ------------------------------------------------------------------------------

CREDENTIALS = {
    "fs.key": "AKIAEXAMPLEKEY",
    "fs.secret": "wJalrXUtnFEMIsecretvalue",
    "fs.token": "session-token-value",
    "fs.password": "hunter2hunter2",
    "fs.client_kwargs": '{"aws_secret_access_key": "clientkwargssecret"}',
    "fs.connection_string": "AccountKey=connectionstringsecret",
}
"""Storage options that can hold a credential: never in sink.json, never in a handle."""


def test_sink_json_keeps_what_recovery_needs_and_no_storage_credential(target: Target) -> None:
    shaping = {
        "path": target.url,
        "format": "json",
        "compression": "gzip",
        "partitionBy": "bucket",
        "maxRecordsPerFile": "7",
        "maxOpenFiles": "4",
        "header": "false",
        "fs.anon": "false",
        "checkpointLocation": "/tmp/cp",
        "sinkId": SINK,
    }
    # Spark hands a data source its options with lower-cased keys.
    options = {k.lower(): v for k, v in {**shaping, **CREDENTIALS}.items()}

    public = publicOptions(options, FilesSink.safeOptions)

    assert public == {k.lower(): v for k, v in shaping.items()}
    text = json.dumps(public)
    assert not any(secret in text for secret in CREDENTIALS.values())
    # A committer rebuilt from sink.json alone (`twophase recover`) has the writer's settings
    # but for the credentials, and finishes and sweeps the writer's transactions.
    full = FilesSettings.fromOptions(options)
    recovered = FilesSink(public).createCommitter()
    assert recovered.settings == FilesSettings(
        **{**full.__dict__, "storageOptions": {"anon": False}}
    )
    writer = FilesWriter(FilesSettings.fromOptions({**options, "fs.anon": "false"}))
    handle = prepare(writer, [rows(0, 20)])
    stray = prepare(writer, [rows(20, 5)], context(batchId=1))
    recovered.commit(handle)
    assert [h["staging"] for h in recovered.recoverAndAbort(RecoveryScope(sinkId=SINK))] == [
        stray["staging"]
    ]
    assert idsOf(target.dataset("json").to_table()) == list(range(20))


def test_no_handle_in_the_decision_log_holds_a_storage_credential() -> None:
    name = f"twophase-test-{uuid.uuid4().hex[:8]}"
    options = {"path": f"memory://{name}", "partitionBy": "bucket", **CREDENTIALS}
    sink = FilesSink(options)
    writer, committer = sink.createWriter(), sink.createCommitter()
    try:
        handles = [prepare(writer, [rows(0, 30)]), prepare(writer, [rows(30, 5)], context(1))]
        crashed = writer.beginTransaction(context(batchId=2))
        writer.write(crashed, rows(40, 5))
        handles += committer.recoverAndAbort(RecoveryScope(sinkId=SINK, keep=(handles[0],)))
        committer.commit(handles[0])
    finally:
        fsspec.filesystem("memory").rm(f"/{name}", recursive=True)

    assert len(handles) == 4
    for handle in handles:
        text = dumpsHandle(handle)
        assert not any(secret in text for secret in CREDENTIALS.values()), text
        described = committer.describe(handle)
        assert not any(secret in described for secret in CREDENTIALS.values()), described


# -- resources ------------------------------------------------------------------------------


@pytest.mark.parametrize(("format", "batches"), [("parquet", 200), ("json", 40), ("csv", 40)])
def test_memory_stays_bounded_by_one_batch(local: Target, format: str, batches: int) -> None:
    """Streaming many 50k-row batches never holds more than a few batches in memory."""
    pool = pa.proxy_memory_pool(pa.default_memory_pool())
    _POOLS.append(pool)  # buffers it allocated may outlive the test: never free the pool
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        sink = sinkOf(local, format=format)
        txn = sink.writer.beginTransaction(context())
        batchBytes = rows(0, 50_000).nbytes
        tracemalloc.start()
        try:
            for i in range(batches):
                sink.writer.write(txn, rows(i * 50_000, 50_000))
            handle = sink.writer.preCommit(txn)
            _, pythonPeak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        arrowPeak = pool.max_memory()
    finally:
        pa.set_memory_pool(previous)

    total = batches * batchBytes
    assert handle["files"][0]["rows"] == batches * 50_000
    assert arrowPeak < 6 * batchBytes, (arrowPeak, batchBytes, total)
    assert pythonPeak < 6 * batchBytes, (pythonPeak, batchBytes, total)
