"""A sink a user would write: ``JsonDirSink``, a ``TwoPhaseCommitSink`` subclass from scratch.

The crash-window tests run it under real Spark next to the built-in files sink (the issue asks
for "a sink subclass defined in the test itself"). Spark's workers import it from here by
module path, so it must stay importable without side effects. The tests below check its
lifecycle without Spark, so a crash test that fails points at the protocol, not at this sink.

Layout under the ``path`` option::

    .pending/<sinkId>-<batch>-<partition>-<attempt>-<uuid>.jsonl   one per task attempt
    batch=<N>/part-<partition>.jsonl                               committed

Readers skip ``.``-prefixed paths, so only committed files are visible.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.json as pajson
import pytest

from integration_tests.sink_outputs import SinkUnderTest
from twophase import (
    RecoveryScope,
    TransactionContext,
    TransactionLostError,
    TwoPhaseCommitSink,
)
from twophase.settings import optionOf

PENDING = ".pending"


@dataclass
class JsonDirTxn:
    """One task attempt's open pending file."""

    ctx: TransactionContext
    pending: Path
    final: Path
    out: IO[str]
    rows: int = 0


def _fsyncDir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JsonDirSink(TwoPhaseCommitSink[JsonDirTxn]):
    """Exactly-once JSON lines by pending-file-rename; option ``path`` (a local directory)."""

    safeOptions = frozenset({"path"})

    @classmethod
    def name(cls) -> str:
        return "it.jsondir"

    @property
    def root(self) -> Path:
        path = optionOf(self.options, "path")
        if not path:
            raise ValueError("it.jsondir needs option path")
        return Path(path)

    # -- executor ---------------------------------------------------------------------------

    def beginTransaction(self, ctx: TransactionContext) -> JsonDirTxn:
        pendingDir = self.root / PENDING
        pendingDir.mkdir(parents=True, exist_ok=True)
        name = (
            f"{ctx.sinkId}-{ctx.batchId}-{ctx.partitionId}-{ctx.attemptNumber}-"
            f"{uuid.uuid4().hex}.jsonl"
        )
        pending = pendingDir / name
        final = self.root / f"batch={ctx.batchId}" / f"part-{ctx.partitionId}.jsonl"
        return JsonDirTxn(ctx, pending, final, pending.open("w"))

    def write(self, txn: JsonDirTxn, batch: pa.RecordBatch) -> None:
        for row in batch.to_pylist():
            txn.out.write(json.dumps(row) + "\n")
        txn.rows += batch.num_rows

    def preCommit(self, txn: JsonDirTxn) -> dict[str, Any]:
        txn.out.flush()
        os.fsync(txn.out.fileno())
        txn.out.close()
        _fsyncDir(txn.pending.parent)
        return {"pending": str(txn.pending), "final": str(txn.final), "rows": txn.rows}

    def abortTransaction(self, txn: JsonDirTxn) -> None:
        txn.out.close()
        txn.pending.unlink(missing_ok=True)

    # -- driver -----------------------------------------------------------------------------

    def commit(self, handle: dict[str, Any]) -> None:
        pending, final = Path(handle["pending"]), Path(handle["final"])
        if pending.exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(pending, final)
            _fsyncDir(final.parent)
        elif not final.exists():
            raise TransactionLostError(f"it.jsondir: neither {pending} nor {final} exists")

    def abort(self, handle: dict[str, Any]) -> None:
        Path(handle["pending"]).unlink(missing_ok=True)

    def recoverAndAbort(self, scope: RecoveryScope) -> list[dict[str, Any]]:
        pendingDir = self.root / PENDING
        if not pendingDir.exists():
            return []
        keep = {h.get("pending") for h in scope.keep}
        aborted = []
        for path in sorted(pendingDir.glob(f"{scope.sinkId}-*.jsonl")):
            sinkId, batch, _partition, _attempt, _rest = path.name.rsplit("-", 4)
            if sinkId != scope.sinkId or str(path) in keep:
                continue
            if scope.batchId is not None and int(batch) != scope.batchId:
                continue
            path.unlink(missing_ok=True)
            aborted.append({"pending": str(path)})
        return aborted


# -- how the tests read it ------------------------------------------------------------------


def jsonDirVisible(output: Path) -> list[Path]:
    return sorted(output.glob("batch=*/part-*.jsonl"))


def readJsonDir(output: Path) -> pa.Table:
    schema = pa.schema([("id", pa.int64()), ("payload", pa.string())])
    options = pajson.ParseOptions(explicit_schema=schema)
    tables = [pajson.read_json(p, parse_options=options) for p in jsonDirVisible(output)]
    tables = [t for t in tables if len(t)]
    return pa.concat_tables(tables).select(["id", "payload"]) if tables else schema.empty_table()


def jsonDirPending(output: Path, batch: int | None = None) -> list[Path]:
    """Pending files (prepared or open transactions), of one batch or all."""
    pending = output / PENDING
    if not pending.exists():
        return []
    return sorted(
        p for p in pending.iterdir() if batch is None or p.name.rsplit("-", 4)[1] == str(batch)
    )


USER_SINK = SinkUnderTest(
    "user",
    f"{__name__}:JsonDirSink",
    readJsonDir,
    jsonDirVisible,
    jsonDirPending,
)


# -- the sink's own contract, without Spark -------------------------------------------------


def _ctx(batch: int, partition: int, attempt: int = 0) -> TransactionContext:
    return TransactionContext("tp-test", "q", batch, partition, attempt)


def _prepare(sink: JsonDirSink, batch: int, partition: int, ids: range, attempt: int = 0):
    txn = sink.beginTransaction(_ctx(batch, partition, attempt))
    sink.write(
        txn,
        pa.RecordBatch.from_pydict({"id": list(ids), "payload": [f"row-{i}" for i in ids]}),
    )
    return sink.preCommit(txn)


def test_json_dir_sink_commit_is_idempotent_and_only_commit_makes_rows_visible(tmp_path: Path):
    sink = JsonDirSink({"path": str(tmp_path)})
    handle = _prepare(sink, 3, 1, range(5))
    assert readJsonDir(tmp_path).num_rows == 0
    assert jsonDirPending(tmp_path) == [Path(handle["pending"])]
    sink.commit(handle)
    sink.commit(handle)  # a second commit finds the final file and no pending: no-op
    assert jsonDirVisible(tmp_path) == [tmp_path / "batch=3" / "part-1.jsonl"]
    assert readJsonDir(tmp_path).column("id").to_pylist() == [0, 1, 2, 3, 4]
    assert jsonDirPending(tmp_path) == []


def test_json_dir_sink_abort_and_recover_and_abort_spare_kept_handles(tmp_path: Path):
    sink = JsonDirSink({"path": str(tmp_path)})
    kept = _prepare(sink, 1, 0, range(3))
    straggler = _prepare(sink, 1, 0, range(3), attempt=1)
    otherBatch = _prepare(sink, 2, 0, range(3))
    aborted = _prepare(sink, 2, 1, range(3))
    sink.abort(aborted)
    sink.abort(aborted)
    gone = sink.recoverAndAbort(RecoveryScope("tp-test", keep=(kept,), batchId=1))
    assert gone == [{"pending": straggler["pending"]}]
    assert jsonDirPending(tmp_path) == sorted([Path(kept["pending"]), Path(otherBatch["pending"])])
    sink.recoverAndAbort(RecoveryScope("tp-test", keep=(kept,)))
    assert jsonDirPending(tmp_path) == [Path(kept["pending"])]
    assert sink.recoverAndAbort(RecoveryScope("tp-other")) == []
    sink.commit(kept)
    assert readJsonDir(tmp_path).num_rows == 3


def test_json_dir_sink_commit_of_a_lost_transaction_fails_loudly(tmp_path: Path):
    sink = JsonDirSink({"path": str(tmp_path)})
    handle = _prepare(sink, 0, 0, range(2))
    sink.abort(handle)
    with pytest.raises(TransactionLostError, match=re.escape(handle["pending"])):
        sink.commit(handle)


# -- a user's sink that returns the wrong thing, under real Spark ----------------------------


class NoneSweepingJsonDirSink(JsonDirSink):
    """Returns ``None`` from ``recoverAndAbort``: accepted as "aborted nothing"."""

    @classmethod
    def name(cls) -> str:
        return "it.jsondirNoneSweep"

    def recoverAndAbort(self, scope: RecoveryScope) -> list[dict[str, Any]]:
        super().recoverAndAbort(scope)
        return None  # type: ignore[return-value]


class SetHandleJsonDirSink(JsonDirSink):
    """Puts a set into its handle, which the decision log (JSON) cannot hold."""

    @classmethod
    def name(cls) -> str:
        return "it.jsondirSetHandle"

    def preCommit(self, txn: JsonDirTxn) -> dict[str, Any]:
        handle = super().preCommit(txn)
        handle["ids"] = {1, 2}
        return handle


def test_a_sink_whose_recover_and_abort_returns_none_runs_exactly_once(tmp_path: Path) -> None:
    from integration_tests.spark_harness import Harness, assertExactlyOnce

    query = Harness(tmp_path, "local", sink=f"{__name__}:NoneSweepingJsonDirSink", rows=4000)
    run = query.run()
    assert run.succeeded, run.describe()
    assertExactlyOnce(USER_SINK, query)


def test_a_handle_json_cannot_hold_fails_the_query_naming_the_sink_and_the_fix(
    tmp_path: Path,
) -> None:
    from integration_tests.spark_harness import Harness

    query = Harness(
        tmp_path, "local", sink=f"{__name__}:SetHandleJsonDirSink", rows=2000, rowsPerBatch=2000
    )
    run = query.run()
    assert not run.succeeded
    text = run.error + run.tail(400)
    assert "SinkContractError" in text, run.describe()
    assert "SetHandleJsonDirSink.preCommit returned a handle that JSON cannot hold" in text
    assert readJsonDir(query.output).num_rows == 0
