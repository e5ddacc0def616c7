"""The files sink on S3 by multipart upload, participant by participant, against the S3 server.

No Spark: the writer and committer are driven as the coordinator drives them, and each crash
window is reproduced by stopping where a process would die (a writer abandoned without abort,
a handle logged but not committed, a commit stopped after some files, an upload a lifecycle
rule aborted, the server killed). Every reader a user has (pyarrow, pandas, DuckDB through
fsspec, polars natively) must see exactly the committed rows.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from integration_tests.conftest import (
    S3Service,
    ServiceControl,
    callsDuring,
    callsDuringAFreeze,
    failedWithin,
)
from integration_tests.toxiproxy import Toxiproxy, proxiedUrl
from twophase.protocol import (
    Handle,
    RecoveryScope,
    TransactionContext,
    TransactionLostError,
    TransientCommitError,
)
from twophase.sinks.files import FilesCommitter, FilesUnavailableError, FilesWriter
from twophase.sinks.files.inspect import handleKey, inspect
from twophase.sinks.files.multipart import sinkUploads
from twophase.sinks.files.s3 import MIN_PART_SIZE, S3Calls, splitKey

PART = MIN_PART_SIZE


@pytest.fixture
def prefix(s3: S3Service) -> Iterator[str]:
    """A fresh output prefix in the test bucket; its objects and uploads are removed after."""
    name = f"it-files-s3/{uuid.uuid4().hex[:10]}"
    yield name
    fs = s3.filesystem()
    calls = S3Calls(fs)
    for upload in calls.pendingUploads(s3.bucket, name + "/"):
        calls.abort(s3.bucket, upload.key, upload.uploadId)
    if fs.exists(f"{s3.bucket}/{name}"):
        fs.rm(f"{s3.bucket}/{name}", recursive=True)


def options(s3: S3Service, prefix: str, **extra: str) -> dict[str, str]:
    return {"path": s3.url(f"{prefix}/out"), **s3.options(), **extra}


def ctx(batchId: int, partitionId: int = 0, sinkId: str = "s3sink", attempt: int = 0) -> Any:
    return TransactionContext(
        sinkId=sinkId,
        queryId="q",
        batchId=batchId,
        partitionId=partitionId,
        attemptNumber=attempt,
        runId="run",
    )


def rows(start: int, count: int, pad: int = 0) -> pa.RecordBatch:
    """Rows ``id`` in [start, start + count), ``k = id % 2``, and ``pad`` random bytes each
    (incompressible, so a few rows make several parts)."""
    ids = list(range(start, start + count))
    return pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "k": pa.array([i % 2 for i in ids], pa.int64()),
            "pad": pa.array([os.urandom(pad) for _ in ids], pa.binary()),
        }
    )


def prepare(writer: FilesWriter, context: Any, *batches: pa.RecordBatch) -> Handle:
    txn = writer.beginTransaction(context)
    for batch in batches:
        writer.write(txn, batch)
    return writer.preCommit(txn)


def readAll(s3: S3Service, prefix: str) -> dict[str, list[int]]:
    """The ``id``s every reader sees at the output path, by reader (sorted)."""
    import duckdb
    import pandas as pd
    import polars as pl

    fs = s3.filesystem()
    fs.invalidate_cache()
    root = f"{s3.bucket}/{prefix}/out"
    url = f"s3://{root}"
    if not fs.exists(root):
        return {"pyarrow": [], "pandas": [], "duckdb": [], "polars": []}
    seen: dict[str, list[int]] = {}
    seen["pyarrow"] = sorted(pq.read_table(root, filesystem=fs).column("id").to_pylist())
    storage = {"endpoint_url": s3.endpoint, "key": s3.accessKey, "secret": s3.secretKey}
    seen["pandas"] = sorted(pd.read_parquet(url, storage_options=storage)["id"].tolist())
    con = duckdb.connect()
    try:
        con.register_filesystem(fs)
        seen["duckdb"] = sorted(
            r[0] for r in con.sql(f"SELECT id FROM read_parquet('{url}/**/*.parquet')").fetchall()
        )
    finally:
        con.close()
    polarsOptions = {
        "aws_endpoint_url": s3.endpoint,
        "aws_access_key_id": s3.accessKey,
        "aws_secret_access_key": s3.secretKey,
        "aws_region": "us-east-1",
        "aws_allow_http": "true",
    }
    seen["polars"] = sorted(
        pl.scan_parquet(f"{url}/**/*.parquet", storage_options=polarsOptions)
        .select("id")
        .collect()["id"]
        .to_list()
    )
    return seen


def assertEveryReaderSees(s3: S3Service, prefix: str, expected: list[int]) -> None:
    seen = readAll(s3, prefix)
    for reader, ids in seen.items():
        assert ids == sorted(expected), f"{reader} read {len(ids)} rows, not {len(expected)}"


def test_parts_stream_while_writing_and_nothing_is_visible_before_the_commit(
    s3: S3Service, prefix: str
) -> None:
    opts = options(s3, prefix, partSize=str(PART), partitionBy="k")
    writer, committer = FilesWriter.fromOptions(opts), FilesCommitter.fromOptions(opts)
    txn = writer.beginTransaction(ctx(0))
    for i in range(6):  # 6 x 2 MiB of incompressible rows: 2 partition files of ~6 MiB
        writer.write(txn, rows(i * 64, 64, pad=32 * 1024))
    # Parts went up while writing: memory holds at most one part per open file.
    raws: list[Any] = [p.raw for p in txn.openParts.values()]
    assert [len(r.partEtags) >= 1 for r in raws] == [True, True]
    assert all(len(r._buffer) < PART for r in raws)
    handle = writer.preCommit(txn)
    assert handle["commit"] == "multipart" and len(handle["files"]) == 2
    assert all(len(f["parts"]) == 2 for f in handle["files"])
    assert "secret" not in str(handle) and s3.secretKey not in str(handle)
    assert len(sinkUploads(writer.storage, "s3sink")) == 2
    assertEveryReaderSees(s3, prefix, [])

    committer.commit(handle)
    assertEveryReaderSees(s3, prefix, list(range(384)))
    assert sinkUploads(writer.storage, "s3sink") == []
    committer.commit(handle)  # again: recognised as done, not lost
    committer.abort(handle)  # an abort after the commit never deletes the object
    assertEveryReaderSees(s3, prefix, list(range(384)))


def test_readers_never_see_an_undecided_batch_after_a_crash(s3: S3Service, prefix: str) -> None:
    opts = options(s3, prefix)
    writer, committer = FilesWriter.fromOptions(opts), FilesCommitter.fromOptions(opts)
    committer.commit(prepare(writer, ctx(0, 0), rows(0, 100)))
    committer.commit(prepare(writer, ctx(0, 1), rows(100, 100)))
    # Batch 1: one task prepared (crash before the decision), one still writing (crash mid-task).
    prepare(writer, ctx(1, 0), rows(200, 100))
    crashed = writer.beginTransaction(ctx(1, 1))
    writer.write(crashed, rows(300, 100))
    assertEveryReaderSees(s3, prefix, list(range(200)))

    # Recovery (a fresh committer, as after a restart) aborts both; batch 0 stays.
    aborted = FilesCommitter.fromOptions(opts).recoverAndAbort(RecoveryScope("s3sink"))
    assert sorted((h["batchId"], h["partitionId"]) for h in aborted) == [(1, 0), (1, 1)]
    assert sinkUploads(writer.storage, "s3sink") == []
    assertEveryReaderSees(s3, prefix, list(range(200)))


def test_recovery_keeps_decided_uploads_and_touches_no_other_sink(
    s3: S3Service, prefix: str
) -> None:
    opts = options(s3, prefix)
    writer, committer = FilesWriter.fromOptions(opts), FilesCommitter.fromOptions(opts)
    decided = prepare(writer, ctx(3, 0), rows(0, 10))
    stray = prepare(writer, ctx(3, 0, attempt=1), rows(0, 10))  # a speculative duplicate
    other = prepare(writer, ctx(3, 1, sinkId="s3sink.x"), rows(10, 10))  # tag extends ours
    earlier = prepare(writer, ctx(2, 2), rows(20, 10))

    # Stragglers of batch 3 only: the decided upload is kept, batch 2 is not looked at.
    aborted = committer.recoverAndAbort(RecoveryScope("s3sink", keep=(decided,), batchId=3))
    assert [h["staging"] for h in aborted] == [stray["files"][0]["uploadId"]]
    left = {u.uploadId for u in sinkUploads(writer.storage, "s3sink")}
    assert left == {decided["files"][0]["uploadId"], earlier["files"][0]["uploadId"]}
    assert len(sinkUploads(writer.storage, "s3sink.x")) == 1

    committer.commit(decided)  # crash after the decision: a fresh commit still works
    committer.recoverAndAbort(RecoveryScope("s3sink"))
    assert sinkUploads(writer.storage, "s3sink") == []
    assert len(sinkUploads(writer.storage, "s3sink.x")) == 1
    FilesCommitter.fromOptions(opts).abort(other)
    assertEveryReaderSees(s3, prefix, list(range(10)))


def test_a_commit_stopped_midway_finishes_on_the_next_call(s3: S3Service, prefix: str) -> None:
    opts = options(s3, prefix, maxRecordsPerFile="10")
    writer, committer = FilesWriter.fromOptions(opts), FilesCommitter.fromOptions(opts)
    handle = prepare(writer, ctx(0), rows(0, 30))
    assert len(handle["files"]) == 3
    first = dict(handle, files=handle["files"][:1])
    committer.commit(first)  # the driver died after completing one of three uploads
    assertEveryReaderSees(s3, prefix, list(range(10)))
    FilesCommitter.fromOptions(opts).commit(handle)
    assertEveryReaderSees(s3, prefix, list(range(30)))


def test_an_upload_aborted_by_a_lifecycle_rule_is_written_again_from_the_replay(
    s3: S3Service, prefix: str
) -> None:
    opts = options(s3, prefix, maxRecordsPerFile="20")
    writer, committer = FilesWriter.fromOptions(opts), FilesCommitter.fromOptions(opts)
    handle = prepare(writer, ctx(5), rows(0, 50))  # 3 files
    assert len(handle["files"]) == 3
    # One file completed, then the rest were aborted by the bucket (a lifecycle rule).
    committer.commit(dict(handle, files=handle["files"][:1]))
    calls = S3Calls(writer.storage.fs)
    for entry in handle["files"][1:]:
        bucket, key = splitKey(writer.storage.full(entry["final"]))
        assert calls.abort(bucket, key, entry["uploadId"])
    with pytest.raises(TransactionLostError, match="lifecycle rule"):
        committer.commit(handle)
    expected = committer.fingerprint(handle)
    assert expected is not None

    # The replay gives the same rows in another order and fewer files: same fingerprint.
    replayOpts = options(s3, prefix, maxRecordsPerFile="25")
    replayWriter = FilesWriter.fromOptions(replayOpts)
    replacement = prepare(replayWriter, ctx(5, attempt=1), rows(25, 25), rows(0, 25))
    assert committer.fingerprint(replacement) == expected
    assert len(replacement["files"]) == 2
    different = prepare(replayWriter, ctx(5, attempt=2), rows(0, 49))
    assert committer.fingerprint(different) != expected
    committer.abort(different)

    committer.commitReplacement(handle, replacement)
    committer.commitReplacement(handle, replacement)  # idempotent
    assertEveryReaderSees(s3, prefix, list(range(50)))


def test_the_server_down_is_transient_and_the_commit_finishes_after(
    s3: S3Service, prefix: str, s3_server: ServiceControl
) -> None:
    # One attempt per call (botocore would retry a refused connection for a while).
    opts = options(s3, prefix, **{"fs.config_kwargs": '{"retries": {"max_attempts": 1}}'})
    writer, committer = FilesWriter.fromOptions(opts), FilesCommitter.fromOptions(opts)
    handle = prepare(writer, ctx(0), rows(0, 40))
    s3_server.kill()
    try:
        with pytest.raises(TransientCommitError):
            committer.commit(handle)
        with pytest.raises(TransientCommitError):
            committer.recoverAndAbort(RecoveryScope("s3sink", keep=(handle,)))
    finally:
        s3_server.start()
    committer.commit(handle)  # the upload survived the crash of the server
    assertEveryReaderSees(s3, prefix, list(range(40)))


def test_a_frozen_server_fails_the_upload_and_the_commit_in_bounded_time_then_commits_once(
    s3: S3Service, prefix: str, s3_server: ServiceControl
) -> None:
    """A frozen S3 server (its process stopped: connections open, nothing answered) must not
    hold a task's upload or the driver's CompleteMultipartUpload forever: botocore's timeouts
    (here 1 s, one attempt each, s3fs retrying a few times) end both, the task's with an error
    that names the batch and the timeouts; after the server resumes the decided batch commits
    once and the task's upload never shows."""
    config = '{"retries": {"max_attempts": 1}, "connect_timeout": 1, "read_timeout": 1}'
    opts = options(s3, prefix, **{"fs.config_kwargs": config})
    writer, committer = FilesWriter.fromOptions(opts), FilesCommitter.fromOptions(opts)
    committer.commit(prepare(writer, ctx(0), rows(0, 40)))
    decided = prepare(writer, ctx(1), rows(40, 40))
    txn = writer.beginTransaction(ctx(2))

    def writeAndPrepare() -> None:  # sent while the server is frozen
        writer.write(txn, rows(80, 40))
        writer.preCommit(txn)

    outcomes = callsDuringAFreeze(
        s3_server,
        {
            "preCommit": writeAndPrepare,
            "commit": lambda: committer.commit(decided),
        },
    )
    uploadError = failedWithin(outcomes, "preCommit", FilesUnavailableError, 25)
    assert "batch 2, partition 0" in str(uploadError) and "read_timeout" in str(uploadError)
    failedWithin(outcomes, "commit", TransientCommitError, 25)
    writer.abortTransaction(txn)
    committer.commit(decided)
    committer.commit(decided)  # again, as after a lost reply: a no-op
    assertEveryReaderSees(s3, prefix, list(range(80)))


def test_a_lost_reply_to_complete_multipart_fails_in_bounded_time_and_the_retry_finds_it_done(
    s3: S3Service, prefix: str, proxies: Toxiproxy
) -> None:
    """The network loses the server's answer to ``CompleteMultipartUpload`` (the request
    arrived and the object is complete): the driver's commit fails after botocore's read
    timeouts and s3fs's retries, retryably, and the coordinator's retry finds the upload gone
    and the object with the ETag its parts complete into, and succeeds; the rows are there
    once."""
    proxied = replace(s3, endpoint=proxiedUrl(s3.endpoint, proxies.proxy("s3")))
    config = '{"retries": {"max_attempts": 1}, "connect_timeout": 1, "read_timeout": 1}'
    opts = options(proxied, prefix, **{"fs.config_kwargs": config})
    writer, committer = FilesWriter.fromOptions(opts), FilesCommitter.fromOptions(opts)
    decided = prepare(writer, ctx(0), rows(0, 40))
    proxy = proxies.proxy("s3")
    outcomes = callsDuring(
        proxy.loseReplies, proxy.heal, {"commit": lambda: committer.commit(decided)}
    )
    failedWithin(outcomes, "commit", TransientCommitError, 15)
    # Read directly, not through the proxy: the request did reach the server.
    assertEveryReaderSees(s3, prefix, list(range(40)))
    committer.commit(decided)  # the coordinator's retry
    assertEveryReaderSees(s3, prefix, list(range(40)))


def test_doctor_lists_the_pending_uploads_of_the_sink(s3: S3Service, prefix: str) -> None:
    opts = options(s3, prefix)
    writer, committer = FilesWriter.fromOptions(opts), FilesCommitter.fromOptions(opts)
    handle = prepare(writer, ctx(7, 3), rows(0, 10))
    prepare(writer, ctx(7, 3, sinkId="another"), rows(0, 10))
    found = inspect(committer, "s3sink", datetime.now(UTC))
    uploads = [h for h in found.held if h.what == "multipart upload"]
    assert [(h.key, h.batchId, h.partitionId) for h in uploads] == [
        (handle["files"][0]["uploadId"], 7, 3)
    ]
    assert uploads[0].since is not None
    assert handleKey(handle) == (handle["files"][0]["uploadId"],)
    assert s3.secretKey not in repr(found)


def test_pending_uploads_are_listed_once_each_across_pages(s3: S3Service, prefix: str) -> None:
    """One upload per page, two uploads of one key: every upload comes back exactly once
    (versitygw refuses AWS's upload-id marker; the listing pages on by key instead)."""
    calls = S3Calls(s3.filesystem(), pageSize=1)
    keys = [f"{prefix}/out/a", f"{prefix}/out/a", f"{prefix}/out/b", f"{prefix}/out/c"]
    made = sorted((key, calls.create(s3.bucket, key)) for key in keys)
    listed = [(u.key, u.uploadId) for u in calls.pendingUploads(s3.bucket, f"{prefix}/out/")]
    assert sorted(listed) == made and len(listed) == len(set(listed))


def test_a_decided_batch_a_lifecycle_rule_aborted_is_written_again_by_the_restart(
    s3: S3Service, prefix: str, tmp_path: Any
) -> None:
    """Through Spark and the coordinator: the driver dies after batch 1's decision, the bucket
    aborts its uploads (as a lifecycle rule would), the restart records the loss, Spark's
    replay writes the partitions again, and every row is there once."""
    from integration_tests.spark_harness import Harness
    from twophase import verify

    path = s3.url(f"{prefix}/out")
    query = Harness(
        tmp_path / "query",
        "local",
        rows=400,
        rowsPerBatch=100,
        options={"path": path, **s3.options()},
    )
    crashed = query.run("driver.afterDecision:1")
    assert crashed.killed, crashed.describe()
    calls = S3Calls(s3.filesystem())
    pending = list(calls.pendingUploads(s3.bucket, f"{prefix}/out/"))
    assert {u.key.rsplit("/", 1)[-1][:13] for u in pending} == {"part-00000001"}
    for upload in pending:
        assert calls.abort(s3.bucket, upload.key, upload.uploadId)

    finished = query.run()
    assert finished.succeeded, finished.describe()
    assert list(query.checkpoint.rglob("batch-*.rewrite.json")), "no rewrite was recorded"
    ids = verify.actualFromFiles(path, "parquet", options=s3.options()).column("id").to_pylist()
    assert sorted(ids) == list(range(400))
