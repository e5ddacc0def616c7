"""``twophase doctor`` on a files sink: each kind of leftover left on purpose, then found.

The files sink's system is the local filesystem, so every finding the log comparison makes
can be checked here without a server: a decided batch not committed, a prepared attempt no
decision names, an attempt of a batch the log cannot explain, a stray file in the sink's
staging, the earlier layout's staging, partitions awaiting a rewrite, and the exit statuses.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from twophase import cli
from twophase.coordinator import DecisionLog
from twophase.coordinator.description import SinkDescription, writeSinkDescription
from twophase.doctor import Held, Inspection, Kind, Stall
from twophase.doctor.classify import Commands, classify
from twophase.doctor.run import checkSink
from twophase.protocol import (
    Committer,
    Handle,
    Prepared,
    RecoveryScope,
    TaskResult,
    TransactionContext,
)
from twophase.settings import SinkSettings
from twophase.sinks.files.layout import legacySinkStagingDir, sinkStagingDir
from twophase.spark.declared import FilesSink
from twophase.spark.driver import describeSink


class Query:
    """A files sink's checkpoint with a claimed log, and a way to prepare task attempts."""

    def __init__(self, tmp_path: Path) -> None:
        self.checkpoint = tmp_path / "ckpt"
        self.output = tmp_path / "out"
        self.sink = FilesSink(
            {"path": str(self.output), "checkpointLocation": str(self.checkpoint)}
        )
        self.settings = SinkSettings.fromOptions(self.sink.options, self.sink.name())
        describeSink(self.sink, self.settings)
        self.log = DecisionLog(self.settings.logLocation)
        self.log.claim(self.settings.sinkId, "q-1")
        self.writer = self.sink.createWriter()

    @property
    def sinkId(self) -> str:
        return self.settings.sinkId

    @property
    def staging(self) -> Path:
        return self.output.parent / "_twophase-staging" / self.output.name

    def prepare(self, batchId: int, partition: int = 0) -> TaskResult:
        ctx = TransactionContext(self.sinkId, "q-1", batchId, partition, 0, "run1")
        txn = self.writer.beginTransaction(ctx)
        ids = pa.array(range(10), pa.int64())
        self.writer.write(txn, pa.RecordBatch.from_arrays([ids], names=["id"]))
        handle = self.writer.preCommit(txn)
        return TaskResult(self.sinkId, "q-1", batchId, partition, 0, handle, 10)


@pytest.fixture
def query(tmp_path: Path) -> Query:
    return Query(tmp_path)


def doctor(
    query: Query, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, Any]]:
    """Run ``twophase doctor --json``; the exit status and the sink's JSON entry."""
    status = cli.main(["doctor", "--checkpoint", str(query.checkpoint), "--json", *extra])
    document = json.loads(capsys.readouterr().out)
    assert document["exitStatus"] == status
    [sink] = document["sinks"]
    return status, sink


def kinds(sink: dict[str, Any]) -> list[str]:
    return [f["finding"] for f in sink["findings"]]


def test_a_fresh_query_is_clean(query: Query, capsys: pytest.CaptureFixture[str]) -> None:
    status, sink = doctor(query, capsys)
    assert status == 0 and kinds(sink) == ["clean"] and sink["status"] == "clean"
    assert sink["system"] == "files"


def test_a_decided_batch_not_committed_is_found_and_recover_settles_it(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    query.log.decide(0, [query.prepare(0, 0), query.prepare(0, 1)])
    status, sink = doctor(query, capsys)
    assert status == 1 and kinds(sink) == ["decided-unfinished"]
    [finding] = sink["findings"]
    assert finding["batchId"] == 0 and finding["stillHeld"] == 2 and finding["transactions"] == 2
    assert finding["fix"].startswith(
        f"twophase recover --checkpoint {query.checkpoint} --sink-id {query.sinkId}"
    )
    assert {h["id"].split("/")[0] for h in finding["held"]} == {sinkStagingDir(query.sinkId)}
    assert cli.main(["recover", "--checkpoint", str(query.checkpoint)]) == 0
    capsys.readouterr()
    status, sink = doctor(query, capsys)
    assert status == 0 and kinds(sink) == ["clean"]


def test_a_prepared_attempt_no_decision_names_is_an_orphan_the_next_start_aborts(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    query.log.decide(0, [query.prepare(0)])
    assert cli.main(["recover", "--checkpoint", str(query.checkpoint)]) == 0
    query.prepare(1, 3)  # the next batch, prepared, then the query died before deciding
    capsys.readouterr()
    status, sink = doctor(query, capsys)
    assert status == 1 and kinds(sink) == ["undecided"]
    [finding] = sink["findings"]
    assert finding["batchId"] == 1 and finding["held"][0]["partitionId"] == 3
    assert finding["ageSeconds"] is not None and finding["ageSeconds"] < 600
    assert "twophase recover" in finding["fix"]
    # A probe of a running query may call young ones its current batch.
    status, sink = doctor(query, capsys, "--in-flight-seconds", "600")
    assert status == 0 and kinds(sink) == ["in-flight"]
    assert cli.main(["recover", "--checkpoint", str(query.checkpoint)]) == 0
    capsys.readouterr()
    assert doctor(query, capsys)[0] == 0


def test_a_failed_attempt_of_a_decided_batch_is_an_orphan_too(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    query.prepare(0, 0)  # the first attempt, never reported
    query.log.decide(0, [query.prepare(0, 0)])
    status, sink = doctor(query, capsys)
    assert status == 1 and sorted(kinds(sink)) == ["decided-unfinished", "undecided"]


def test_an_attempt_of_a_batch_beyond_the_log_is_unknown_to_it(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    query.prepare(57)  # another query with this sink id: its batch 57, this log is empty
    status, sink = doctor(query, capsys)
    assert status == 1 and kinds(sink) == ["unknown-to-log"]
    [finding] = sink["findings"]
    assert "beyond the next one this query can run (0)" in finding["summary"]
    assert "give one of the queries its own sinkId" in finding["fix"]


def test_a_stray_file_in_the_sink_staging_is_foreign(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = query.staging / sinkStagingDir(query.sinkId)
    directory.mkdir(parents=True)
    (directory / "notes.txt").write_text("left by hand")
    status, sink = doctor(query, capsys)
    assert status == 1 and kinds(sink) == ["foreign"]
    assert "recovery never deletes it" in sink["findings"][0]["summary"]


def test_the_earlier_layout_s_staging_is_found(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    old = query.output / legacySinkStagingDir(query.sinkId) / "0" / "p00002-a0-0123456789ab"
    old.mkdir(parents=True)
    (old / "part-0000.parquet").write_bytes(b"x")
    status, sink = doctor(query, capsys)
    assert status == 1 and kinds(sink) == ["undecided"]
    held = sink["findings"][0]["held"][0]
    assert held["what"] == "staged files (earlier layout)"
    assert held["batchId"] == 0 and held["partitionId"] == 2


def test_partitions_awaiting_a_rewrite_say_the_restart_writes_them(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    results = [query.prepare(4, 0), query.prepare(4, 1)]
    query.log.decide(4, results)
    query.log.recordRewrite(4, [1], [])
    status, sink = doctor(query, capsys)
    assert status == 1 and "awaiting-rewrite" in kinds(sink)
    finding = next(f for f in sink["findings"] if f["finding"] == "awaiting-rewrite")
    assert finding["awaitingRewrite"] == [1] and finding["batchId"] == 4
    assert finding["fix"].startswith("restart the query")


def test_the_table_names_each_finding_and_its_fix(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    query.log.decide(0, [query.prepare(0)])
    query.prepare(1)
    assert cli.main(["doctor", "--checkpoint", str(query.checkpoint)]) == 1
    text = capsys.readouterr().out
    assert f"sink {query.sinkId}: files at staging {query.staging}" in text
    assert "decided-unfinished" in text and "undecided" in text
    assert text.count("fix: twophase recover --checkpoint") == 2
    assert text.rstrip().endswith(
        "exit 1: findings that need action or that the next start acts on"
    )


def test_no_checkpoint_or_no_log_cannot_be_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    assert cli.main(["doctor", "--checkpoint", str(missing)]) == 2
    assert capsys.readouterr().out == (
        f"twophase doctor: no checkpoint at {missing}; give the query's checkpointLocation\n"
    )
    assert cli.main(["doctor", "--checkpoint", str(tmp_path)]) == 2
    assert "no twophase decision log under" in capsys.readouterr().out
    assert cli.main(["doctor", "--checkpoint", str(tmp_path), "--json"]) == 2
    document = json.loads(capsys.readouterr().out)
    assert document["exitStatus"] == 2 and document["sinks"] == []
    assert "no twophase decision log under" in document["cannotCheck"]


def test_a_log_without_sink_json_cannot_be_checked_but_its_decisions_are_shown(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    query.log.decide(0, [query.prepare(0)])
    os.remove(Path(query.settings.logLocation) / "sink.json")
    status, sink = doctor(query, capsys)
    assert status == 2 and sink["status"] == "cannot-check"
    assert "has no sink.json" in sink["cannotCheck"]
    assert kinds(sink) == ["decided-unfinished"]


def test_classify_keeps_what_recovery_never_touches_apart_and_counts_down_kafka_timeouts(
    tmp_path: Path,
) -> None:
    log = DecisionLog(str(tmp_path / "log"))
    log.claim("s1", "q-1")
    now = datetime.now(UTC)
    elsewhere = Held(
        "postgres",
        "tp1:s1:b0:p0:a0:rrun1:0a",
        "prepared transaction",
        batchId=0,
        since=now,
        foreign="it is prepared in database other",
    )
    soon = Held(
        "kafka",
        "tp-s1-w0123456789ab-0",
        "open transaction",
        since=now - timedelta(seconds=50),
        abortsAt=now + timedelta(seconds=10),
    )
    stall = Stall("t", 0, 3, 5)
    found = classify(
        "s1",
        log,
        Inspection("kafka", "here", [elsewhere, soon], otherStalls=[stall]),
        None,
        Commands("ckpt", "s1"),
        now,
    )
    assert [f.kind for f in found] == [Kind.FOREIGN, Kind.UNDECIDED, Kind.STALLED_ELSEWHERE]
    assert "database other" in found[0].summary and "ROLLBACK PREPARED" in found[0].fix
    assert found[1].facts["abortsInSeconds"] == 10.0
    assert "the broker aborts it in 10 s" in found[1].summary
    assert not found[2].needsAction


def test_a_multi_sink_is_checked_target_by_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from twophase.spark.multi import MultiSink

    checkpoint = tmp_path / "ckpt"
    sink = MultiSink(
        {
            "targets": "a=files,b=files",
            "a.path": str(tmp_path / "out-a"),
            "b.path": str(tmp_path / "out-b"),
            "checkpointLocation": str(checkpoint),
        }
    )
    settings = SinkSettings.fromOptions(sink.options, sink.name())
    describeSink(sink, settings)
    log = DecisionLog(settings.logLocation)
    log.claim(settings.sinkId, "q-1")
    writer = sink.createWriter()

    def prepare(batchId: int) -> TaskResult:
        txn = writer.beginTransaction(TransactionContext(settings.sinkId, "q-1", batchId, 0, 0))
        ids = pa.array(range(5), pa.int64())
        part = pa.StructArray.from_arrays([ids], names=["id"])
        writer.write(txn, pa.RecordBatch.from_arrays([part, part], names=["a", "b"]))
        return TaskResult(settings.sinkId, "q-1", batchId, 0, 0, writer.preCommit(txn), 5)

    log.decide(0, [prepare(0)])  # decided, the driver died before its commits
    prepare(1)  # prepared, never decided
    status = cli.main(["doctor", "--checkpoint", str(checkpoint), "--json"])
    [entry] = json.loads(capsys.readouterr().out)["sinks"]
    assert status == 1 and entry["system"] == "multi"
    found = {f["finding"]: f for f in entry["findings"]}
    assert found["decided-unfinished"]["stillHeld"] == 2  # one staged attempt per target
    orphans = [f for f in entry["findings"] if f["finding"] == "undecided"]
    assert sorted(h["what"].split(":")[0] for f in orphans for h in f["held"]) == ["a", "b"]
    assert cli.main(["recover", "--checkpoint", str(checkpoint)]) == 0
    capsys.readouterr()
    assert cli.main(["doctor", "--checkpoint", str(checkpoint)]) == 0


class DirectoryCommitter(Committer):
    """A user's sink in the narrow form over a real directory: one file per prepared attempt,
    ``<sinkId>.<batch>.<partition>``; committing or aborting removes it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def commit(self, handle: Handle) -> None:
        (self.root / handle["name"]).unlink(missing_ok=True)

    def abort(self, handle: Handle) -> None:
        (self.root / handle["name"]).unlink(missing_ok=True)

    def listPrepared(self, scope: RecoveryScope) -> Iterable[Prepared]:
        for path in sorted(self.root.glob(f"{scope.sinkId}.*.*")):
            batch, partition = path.name.rsplit(".", 2)[1:]
            yield Prepared(
                path.name, {"name": path.name}, batchId=int(batch), partitionId=int(partition)
            )

    def abortPrepared(self, item: Prepared) -> bool:
        path = self.root / item.name
        gone = not path.exists()
        path.unlink(missing_ok=True)
        return not gone


def test_a_sink_of_a_users_own_in_the_narrow_form_is_asked_through_its_listing(
    tmp_path: Path,
) -> None:
    system = tmp_path / "system"
    system.mkdir()
    url = str(tmp_path / "log")
    writeSinkDescription(url, SinkDescription("s1", "my.module:MySink", {}))
    log = DecisionLog(url)
    log.claim("s1", "q-1")
    handles = {b: {"name": f"s1.{b}.0"} for b in (0, 1)}
    for name in ("s1.0.0", "s1.1.0", "other.0.0"):
        (system / name).write_text("rows")
    log.decide(0, [TaskResult("s1", "q-1", 0, 0, 0, handles[0], 2)])
    committer = DirectoryCommitter(system)

    def loadSink(_url: str, _options: Any) -> tuple[Committer, dict[str, str]]:
        return committer, {}

    now = datetime.now(UTC)
    report = checkSink("s1", url, str(tmp_path), loadSink, {}, now, 0.0)
    assert report.cannotCheck is None
    assert report.system == "DirectoryCommitter" and "listPrepared" in report.where
    found = {f.kind.value: f for f in report.findings}
    assert found["decided-unfinished"].facts["stillHeld"] == 1
    [orphan] = [f for f in report.findings if f.kind.value == "undecided"]
    assert [h.key for h in orphan.held] == ["s1.1.0"], "another sink's file is not listed"
    assert committer.recoverAndAbort(RecoveryScope("s1", keep=(handles[0],))) == [handles[1]]
    assert sorted(p.name for p in system.iterdir()) == ["other.0.0", "s1.0.0"]
