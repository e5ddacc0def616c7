"""The persisted formats: every reader refuses a newer one and reads what the last release wrote.

The previous release (5fb8b11) wrote format 1: the records below are written byte for byte as
its code writes them (``json.dumps(body + checksum, indent=2)``, the same fields), with real
staged files of the files sink behind the decided batch. A record, ``owner.json``, a run claim,
``sink.json`` or a handle of a newer format stops its reader with ``LogFormatError``, never
passes for a torn record; the start of a query meets it before it commits, aborts or (when a
run claim or ``owner.json`` says it) writes anything. A restart with another sink id or sink
class while decided batches wait is refused with ``SinkChangedError``.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from twophase import cli
from twophase.coordinator import BatchStatus, DecisionLog
from twophase.coordinator.description import readSinkDescription, writeSinkDescription
from twophase.coordinator.errors import LogFormatError, SinkChangedError
from twophase.coordinator.formats import LOG_FORMAT
from twophase.coordinator.records import checksum
from twophase.protocol import Handle, TransactionContext, TransactionLostError
from twophase.settings import SinkSettings, TwoPhaseConfigError
from twophase.sinks.delta import DeltaCommitter, DeltaSettings
from twophase.sinks.files.handles import checkHandle as checkFilesHandle
from twophase.sinks.iceberg import IcebergCommitter, IcebergSettings
from twophase.sinks.iceberg.table import IcebergTableError
from twophase.sinks.kafka.handles import checkHandle as checkKafkaHandle
from twophase.sinks.multi import MultiCommitter, Target
from twophase.sinks.multi.targets import partOf
from twophase.sinks.postgres.handles import checkHandle as checkPostgresHandle
from twophase.sinks.sql.handles import checkHandle as checkSqlHandle
from twophase.spark.declared import DeltaSink, FilesSink
from twophase.spark.driver import beforeBatch
from twophase.version import __version__

QUERY = "q-previous"
SINK = "orders"
AT = "2026-11-29T10:00:00.000+00:00"
NEWER = "9.1.0"
"""The twophase version a newer record names."""


class PreviousRelease:
    """A checkpoint whose files sink ran under 5fb8b11: batch 0 committed by run 1, run 2
    fenced batch 1 and decided it one link further, then was killed; batch 2 aborted."""

    def __init__(self, tmp_path: Path) -> None:
        self.checkpoint = tmp_path / "ckpt"
        self.output = tmp_path / "out"
        self.sink = self.sinkOf(FilesSink, SINK)
        self.settings = SinkSettings.fromOptions(self.sink.options, self.sink.name())
        self.dir = Path(self.settings.logLocation)
        self.dir.mkdir(parents=True)
        handles = [self.prepared(1, p) for p in range(2)]
        self.put("owner.json", {"sinkId": SINK, "queryId": QUERY, "createdAt": AT})
        for epoch in (1, 2):
            driver = {"id": f"app-{epoch}", "host": "old-host", "pid": 100 + epoch, "kind": "d"}
            body = {"epoch": epoch, "driver": driver, "claimedAt": AT, "queryId": QUERY}
            self.put(f"run-{epoch:010d}.json", body)
        self.put(self.name(0, "decided"), self.decision(0, [], epoch=1))
        committed = {"committedBy": "commit", "committed": 0, "retries": 0, "aborted": 0}
        self.put(
            self.name(0, "committed"),
            {"batchId": 0, "state": "committed", "committedAt": AT, "commitSeconds": 0.01}
            | committed,
        )
        recovery = {"at": AT, "batchesFinished": [], "handlesCommitted": 0, "seconds": 0.1}
        recovery |= {"transactionsAborted": 1, "awaitingRewrite": {}}
        self.put(self.name(0, "recovery"), {"batchId": 0, "state": "recovery", "runs": [recovery]})
        fence = {"batchId": 1, "state": "fenced", "epoch": 2, "fencedAt": AT}
        self.put(self.name(1, "decided"), fence)
        self.put(f"batch-{1:020d}.decided-{2:010d}.json", self.decision(1, handles, epoch=2))
        rewrite = {"batchId": 1, "state": "rewrite", "updatedAt": AT, "lost": []}
        self.put(self.name(1, "rewrite"), rewrite | {"replacements": []})
        aborted = {"aborted": 2, "retries": 0, "abortSeconds": 0.01}
        self.put(
            self.name(2, "aborted"), {"batchId": 2, "state": "aborted", "abortedAt": AT} | aborted
        )
        options = {"path": str(self.output), "checkpointLocation": str(self.checkpoint)}
        description = {"class": "twophase.spark.declared:FilesSink", "options": options}
        (self.dir / "sink.json").write_text(
            json.dumps(description | {"sinkId": SINK}, indent=2, sort_keys=True)
        )

    def sinkOf(self, cls: Any, sinkId: str) -> Any:
        options = {"path": str(self.output), "checkpointLocation": str(self.checkpoint)}
        return cls({**options, "sinkId": sinkId})

    @staticmethod
    def name(batchId: int, status: str) -> str:
        return f"batch-{batchId:020d}.{status}.json"

    def put(self, name: str, body: dict[str, Any], fmt: int = 1) -> None:
        """A record as 5fb8b11's ``LogStorage.publish`` writes it (format 1)."""
        body = {"format": fmt, **{k: v for k, v in body.items() if k != "format"}}
        (self.dir / name).write_text(
            json.dumps({**body, "checksum": checksum(body)}, indent=2) + "\n"
        )

    def newer(self, name: str) -> None:
        """Rewrite ``name`` as a newer twophase would: format 3, its version named."""
        body = json.loads((self.dir / name).read_text())
        body.pop("checksum")
        self.put(name, {**body, "twophase": NEWER}, fmt=LOG_FORMAT + 1)

    def prepared(self, batchId: int, partition: int) -> dict[str, Any]:
        """A transaction the files sink really prepared, as a decision logs it."""
        writer = self.sink.createWriter()
        ctx = TransactionContext(SINK, QUERY, batchId, partition, 0, "run-old")
        txn = writer.beginTransaction(ctx)
        ids = pa.array(range(partition * 10, partition * 10 + 10), pa.int64())
        writer.write(txn, pa.RecordBatch.from_arrays([ids], names=["id"]))
        handle: Handle = writer.preCommit(txn)
        return {"partitionId": partition, "attemptNumber": 0, "rows": 10, "handle": handle}

    @staticmethod
    def decision(batchId: int, handles: list[dict[str, Any]], epoch: int) -> dict[str, Any]:
        return {
            "batchId": batchId,
            "state": "decided",
            "queryId": QUERY,
            "decidedAt": AT,
            "rows": sum(h["rows"] for h in handles),
            "bytes": 80 * len(handles),
            "tasks": len(handles),
            "handles": handles,
            "prepareSeconds": 0.05,
            "epoch": epoch,
        }

    def snapshot(self) -> dict[str, bytes]:
        """Every file of the checkpoint and the output (staged files included), with bytes."""
        roots = [self.checkpoint, self.output, self.output.parent / "_twophase-staging"]
        return {
            str(p): p.read_bytes() for r in roots if r.exists() for p in r.rglob("*") if p.is_file()
        }

    def start(self, sink: Any = None) -> None:
        """The start of a query as the binding plans its next batch (3)."""
        sink = sink or self.sink
        settings = SinkSettings.fromOptions(sink.options, sink.name())
        beforeBatch(sink, sink.createCommitter(), settings, QUERY, 3)

    def rows(self) -> int:
        return (
            ds.dataset(str(self.output), format="parquet").count_rows()
            if self.output.exists()
            else 0
        )


@pytest.fixture
def old(tmp_path: Path) -> PreviousRelease:
    return PreviousRelease(tmp_path)


# ---------------------------------------------------------------------------- format 1


def test_the_previous_releases_log_reads_as_it_did(old: PreviousRelease) -> None:
    log = DecisionLog(str(old.dir))
    owner = log.owner()
    assert owner is not None and (owner.sinkId, owner.queryId, owner.twophase) == (
        SINK,
        QUERY,
        None,
    )
    run = log.runs.read(2)
    assert run is not None and run.driver.id == "app-2" and run.twophase is None
    states = {b: log.state(b) for b in (0, 1, 2)}
    assert {b: s.status if s else None for b, s in states.items()} == {
        0: BatchStatus.COMMITTED,
        1: BatchStatus.DECIDED,
        2: BatchStatus.ABORTED,
    }
    decided = states[1]
    assert decided is not None and decided.epoch == 2 and decided.rows == 20
    assert [s.batchId for s in log.outstanding()] == [1] and log.lastDecided() == 1
    figures = log.figures(0)
    assert figures is not None and figures.recovery is not None
    summary = log.status()
    assert summary["lastDecided"] == 1 and summary["run"]["epoch"] == 2
    description = readSinkDescription(str(old.dir))
    assert description is not None and description.classQualName == "FilesSink"


def test_a_start_of_this_release_finishes_what_the_previous_one_decided(
    old: PreviousRelease,
) -> None:
    old.start()
    assert old.rows() == 20
    log = DecisionLog(str(old.dir))
    assert log.outstanding() == [] and log.runs.newest() == 3
    committed = json.loads((old.dir / old.name(1, "committed")).read_text())
    assert (committed["format"], committed["twophase"]) == (LOG_FORMAT, __version__)
    run = log.runs.read(3)
    assert run is not None and run.twophase == __version__
    assert json.loads((old.dir / "sink.json").read_text())["format"] == 1
    old.start()  # again: nothing twice
    assert old.rows() == 20


# ---------------------------------------------------------------------------- newer formats


LINK = f"batch-{1:020d}.decided-{2:010d}.json"

READERS: dict[str, tuple[str, Callable[[DecisionLog], object]]] = {
    "decision": (LINK, lambda log: log.state(1)),
    "decision, scanned": (LINK, lambda log: log.outstanding()),
    "fence": (PreviousRelease.name(1, "decided"), lambda log: log.state(1)),
    "rewrite": (PreviousRelease.name(1, "rewrite"), lambda log: log.state(1)),
    "committed": (PreviousRelease.name(0, "committed"), lambda log: log.state(0)),
    "aborted": (PreviousRelease.name(2, "aborted"), lambda log: log.state(2)),
    "recovery": (PreviousRelease.name(0, "recovery"), lambda log: log.figures(0)),
    "owner": ("owner.json", lambda log: log.owner()),
    "run claim": ("run-0000000002.json", lambda log: log.runs.read(2)),
    "run claim, status": ("run-0000000002.json", lambda log: log.status()),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_refuses_a_newer_record(old: PreviousRelease, reader: str) -> None:
    name, read = READERS[reader]
    old.newer(name)
    with pytest.raises(LogFormatError) as raised:
        read(DecisionLog(str(old.dir)))
    said = str(raised.value)
    assert name in said and f"format {LOG_FORMAT + 1}, written by twophase {NEWER}" in said
    assert f"this twophase {__version__} reads formats up to {LOG_FORMAT}" in said
    assert f"upgrade to twophase {NEWER} or later on the driver and on every executor" in said
    assert "new checkpoint location" in said
    assert raised.value.errorCode == "TWOPHASE_LOG_FORMAT"
    assert str(pickle.loads(pickle.dumps(raised.value))) == said  # crosses processes whole


def test_a_newer_record_is_never_taken_for_a_torn_one(old: PreviousRelease) -> None:
    """Summed another way by its release, it still stops the reader; a slot holding it is
    never decided over as an unreadable one would be."""
    body = json.loads((old.dir / LINK).read_text())
    body.update(format=LOG_FORMAT + 1, checksum="blake3:whatever-a-newer-release-uses")
    (old.dir / LINK).write_text(json.dumps(body))
    log = DecisionLog(str(old.dir))
    with pytest.raises(LogFormatError):
        log.state(1)
    with pytest.raises(LogFormatError):
        log.decide(1, [], epoch=2)
    assert json.loads((old.dir / LINK).read_text()) == body


def test_a_record_whose_format_is_no_number_is_skipped_as_garbage(old: PreviousRelease) -> None:
    path = old.dir / old.name(2, "aborted")
    body = json.loads(path.read_text())
    body.pop("checksum")
    body["format"] = "two"
    path.write_text(json.dumps({**body, "checksum": checksum(body)}))
    assert DecisionLog(str(old.dir)).state(2) is None


def test_a_newer_sink_json_is_refused_and_kept(old: PreviousRelease) -> None:
    path = old.dir / "sink.json"
    text = json.dumps(json.loads(path.read_text()) | {"format": 2, "twophase": NEWER})
    path.write_text(text)
    with pytest.raises(
        LogFormatError, match=f"sink.json is in format 2, written by twophase {NEWER}"
    ):
        readSinkDescription(str(old.dir))
    with pytest.raises(LogFormatError):  # the start's writer of sink.json reads it first
        old.start()
    assert path.read_text() == text


def _filesHandle(**extra: Any) -> Handle:
    return {
        "kind": "files",
        "path": "/data/out",
        "stagingPath": "/data/staging",
        "batchId": 4,
        "partitionId": 1,
        "attempt": 0,
        "staging": "tag/b4-p1-a0",
        "files": [{"staging": "tag/b4-p1-a0-f0000.staged", "final": "part-1.parquet", "rows": 3}],
        **extra,
    }


def _deltaCheck(tmp: Path) -> Callable[[Handle], object]:
    return DeltaCommitter(DeltaSettings.fromOptions({"path": str(tmp / "delta")})).dataFiles


def _icebergCheck(tmp: Path) -> Callable[[Handle], object]:
    options = {
        "table": "db.events",
        "catalog.type": "sql",
        "catalog.uri": f"sqlite:///{tmp}/catalog.db",
        "catalog.warehouse": f"file://{tmp}/warehouse",
    }
    return IcebergCommitter(IcebergSettings.fromOptions(options)).dataFiles


KAFKA = {"kind": "kafka", "transactionalId": "twophase-orders-1", "records": 0, "batchId": 4}
POSTGRES = {
    "kind": "postgres",
    "gid": None,
    "xid": None,
    "batchId": 4,
    "connection": {"host": "db"},
}
SQL = {"kind": "sql", "xid": None, "batchId": 4, "url": "mysql+pymysql://app@db/shop"}

HANDLES: dict[str, tuple[Handle, Callable[[Path], Callable[[Handle], object]]]] = {
    "files": (_filesHandle(), lambda tmp: checkFilesHandle),
    "files multipart": (
        {**_filesHandle(path="s3://bucket/out", commit="multipart"), "files": []},
        lambda tmp: checkFilesHandle,
    ),
    "delta": (_filesHandle(), _deltaCheck),
    "iceberg": (_filesHandle(), _icebergCheck),
    "kafka": (KAFKA, lambda tmp: checkKafkaHandle),
    "postgres": (POSTGRES, lambda tmp: checkPostgresHandle),
    "sql": (SQL, lambda tmp: checkSqlHandle),
    "multi": (
        {"kind": "multi", "batchId": 4, "partitionId": 1, "parts": {"events": KAFKA}},
        lambda tmp: lambda handle: partOf(handle, "events"),
    ),
}


@pytest.mark.parametrize("sink", sorted(HANDLES))
def test_every_sink_refuses_a_handle_of_a_newer_layout(sink: str, tmp_path: Path) -> None:
    handle, checkerOf = HANDLES[sink]
    check = checkerOf(tmp_path)
    for accepted in (handle, {**handle, "v": 1}):
        try:
            check(accepted)
        except (TransactionLostError, IcebergTableError):  # past the checks: no files, no table
            assert sink in ("delta", "iceberg")
    kind = handle["kind"]
    with pytest.raises(LogFormatError, match=f"a {kind} handle .* is in format 2"):
        check({**handle, "v": 2})
    with pytest.raises(ValueError, match="format 'two'"):
        check({**handle, "v": "two"})


# ---------------------------------------------------------------------------- the start


@pytest.mark.parametrize("newer", ["run-0000000002.json", "owner.json"])
def test_a_start_on_a_log_a_newer_twophase_holds_writes_nothing(
    old: PreviousRelease, newer: str
) -> None:
    old.newer(newer)
    before = old.snapshot()
    with pytest.raises(LogFormatError, match=f"{newer} is in format {LOG_FORMAT + 1}"):
        old.start()
    assert old.snapshot() == before  # no claim, no fence, no commit, no sweep of staged files


def test_a_start_stops_at_a_newer_decision_before_committing_or_aborting(
    old: PreviousRelease,
) -> None:
    """Run claims of the old format (a log a newer release only decided in): the claim is
    the start's one write; the decided batch is neither committed nor swept."""
    old.newer(LINK)
    before = old.snapshot()
    with pytest.raises(LogFormatError, match=LINK):
        old.start()
    after = old.snapshot()
    assert {Path(p).name for p in after.keys() - before.keys()} == {"run-0000000003.json"}
    assert all(after[p] == data for p, data in before.items())
    assert old.rows() == 0


@pytest.mark.parametrize("command", ["status", "recover", "doctor"])
def test_the_commands_say_a_newer_format_in_one_paragraph_and_change_nothing(
    old: PreviousRelease, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    old.newer("run-0000000002.json")
    old.newer(LINK)
    before = old.snapshot()
    status = cli.main([command, "--checkpoint", str(old.checkpoint)])
    captured = capsys.readouterr()
    said = " ".join((captured.err + captured.out).split())
    assert f"format {LOG_FORMAT + 1}" in said and NEWER in said and __version__ in said
    assert "Traceback" not in said
    if command != "doctor":  # doctor reports the log it cannot read among its findings
        assert status == 2 and "Nothing was committed or aborted" in said
        assert f"Fix: run this command with twophase {NEWER} or later" in said
    assert old.snapshot() == before


# ---------------------------------------------------------------------------- another sink


def test_a_start_with_another_sink_id_is_refused_while_the_old_one_has_decided_batches(
    old: PreviousRelease,
) -> None:
    moved = old.sinkOf(FilesSink, "orders-2")
    before = old.snapshot()
    with pytest.raises(SinkChangedError) as raised:
        old.start(moved)
    said = str(raised.value)
    assert "wrote through sink orders before and now starts sink orders-2" in said
    assert "batches 1 decided and not committed" in said and "option sinkId=orders" in said
    assert "twophase recover" in said and str(old.dir) in said
    assert str(pickle.loads(pickle.dumps(raised.value))) == said
    assert old.snapshot() == before  # not even the new sink's log
    old.start()  # the old sink once more: it commits batch 1
    old.start(moved)  # then the new one starts, with nothing in doubt
    assert old.rows() == 20


def test_a_start_with_another_sink_class_is_refused_while_decided_batches_wait(
    old: PreviousRelease,
) -> None:
    delta = old.sinkOf(DeltaSink, SINK)
    with pytest.raises(SinkChangedError) as raised:
        old.start(delta)
    said = str(raised.value)
    assert (
        "twophase.spark.declared:DeltaSink" in said
        and "names twophase.spark.declared:FilesSink" in said
    )
    assert "batches 1 decided and not committed" in said
    assert readSinkDescription(str(old.dir)).classQualName == "FilesSink"  # type: ignore[union-attr]
    assert old.rows() == 0 and [s.batchId for s in DecisionLog(str(old.dir)).outstanding()] == [1]


def test_another_sink_class_is_taken_once_nothing_waits(old: PreviousRelease) -> None:
    old.start()
    description = readSinkDescription(str(old.dir))
    assert description is not None
    moved = type(description)(SINK, "twophase.spark.declared:DeltaSink", description.options)
    writeSinkDescription(str(old.dir), moved)
    assert readSinkDescription(str(old.dir)) == moved


def test_a_class_moved_to_another_module_is_the_same_sink(old: PreviousRelease) -> None:
    """A built-in sink's binding moved between releases (``twophase.spark.files``): the same
    class name is the same sink."""
    path = old.dir / "sink.json"
    path.write_text(path.read_text().replace("twophase.spark.declared", "twophase.spark.files"))
    old.start()
    assert old.rows() == 20


def test_a_multi_batch_decided_with_a_target_the_query_dropped_is_not_committed(
    old: PreviousRelease,
) -> None:
    """Its part would never be committed, and the batch marked committed all the same."""
    entry = old.prepared(5, 0)
    parts: dict[str, Any] = {"lake": entry["handle"], "events": KAFKA}
    handle = {"kind": "multi", "batchId": 5, "partitionId": 0, "parts": parts}
    kept = MultiCommitter([(Target("lake", "files", "orders-lake"), old.sink.createCommitter())])
    for commit in (kept.commit, kept.recoverAndCommit):
        with pytest.raises(TwoPhaseConfigError, match="targets events, which option targets no"):
            commit(handle)
    with pytest.raises(TwoPhaseConfigError, match="targets events"):
        kept.commitReplacement(handle, handle)
    assert old.rows() == 0  # the lake's part was not committed either
    del parts["events"]
    kept.commit(handle)
    assert old.rows() == 10
