"""``status``, ``doctor`` and ``recover`` say what the next start will do, and the same thing.

On a files sink's real log and staged files (its system is the local disk): a decided batch
whose partition the system lost (the log's rewrite record), which only a restart can finish; a
batch stopped cleanly, one aborted and one planned by Spark with no record; and the batch
table's times from Spark's ``offsets/N`` and ``commits/N`` against the log's own figures.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from twophase import cli
from twophase.coordinator import DecisionLog
from twophase.coordinator.figures import AbortFigures
from twophase.doctor.nextstart import Unfinished
from twophase.protocol import TaskResult, TransactionContext
from twophase.settings import SinkSettings
from twophase.spark.declared import FilesSink
from twophase.spark.driver import describeSink, openCoordinator
from twophase.spark.task import runTask


class Query:
    """A files sink's checkpoint with a claimed log; tasks run as the executors run them."""

    def __init__(self, tmp_path: Path) -> None:
        self.checkpoint = tmp_path / "ckpt"
        self.sink = FilesSink(
            {"path": str(tmp_path / "out"), "checkpointLocation": str(self.checkpoint)}
        )
        self.settings = SinkSettings.fromOptions(self.sink.options, self.sink.name())
        describeSink(self.sink, self.settings)
        self.log = DecisionLog(self.settings.logLocation)
        self.log.claim(self.settings.sinkId, "q-1")

    def task(self, batchId: int, partition: int) -> TaskResult:
        ids = pa.array(range(partition * 10, partition * 10 + 10), pa.int64())
        ctx = TransactionContext(self.settings.sinkId, "q-1", batchId, partition, 0, "run1")
        batches = [pa.RecordBatch.from_arrays([ids], names=["id"])]
        return runTask(self.sink.createWriter, ctx, batches, alreadyDecided=False)

    def planned(self, batchId: int, at: datetime | None = None) -> None:
        """Spark's ``offsets/N``, dated ``at``."""
        self._sparkFile("offsets", batchId, at)

    def ended(self, batchId: int, at: datetime | None = None) -> None:
        """Spark's ``commits/N``, dated ``at``."""
        self._sparkFile("commits", batchId, at)

    def _sparkFile(self, folder: str, batchId: int, at: datetime | None) -> None:
        path = self.checkpoint / folder / str(batchId)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("v1\n{}\n")
        if at is not None:
            os.utime(path, (at.timestamp(), at.timestamp()))

    def run(self, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
        status = cli.main([*argv, "--checkpoint", str(self.checkpoint)])
        return status, capsys.readouterr().out


@pytest.fixture
def query(tmp_path: Path) -> Query:
    return Query(tmp_path)


def joined(text: str) -> str:
    return " ".join(text.split())


def test_a_batch_awaiting_its_rewrite_is_the_restarts_in_every_command(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    query.log.decide(4, [query.task(4, 0), query.task(4, 1)])
    query.log.recordRewrite(4, [1], [])  # the system aborted partition 1's transaction
    state = query.log.state(4)
    assert state is not None
    said = Unfinished.of(state).describe()
    fix = Unfinished.of(state).fix("")
    assert "only the next start of the query writes them again" in said
    assert (
        "twophase recover cannot, and commits only its other 1 transaction (partitions [0])" in said
    )

    status, text = query.run(capsys, "status")
    assert status == 1
    assert said in joined(text) and f"to finish batch 4: {fix}" in joined(text)
    assert "twophase recover --checkpoint" not in text  # not offered for this batch

    status, text = query.run(capsys, "doctor", "--json")
    assert status == 1
    [finding] = [
        f for f in json.loads(text)["sinks"][0]["findings"] if f["finding"] == "awaiting-rewrite"
    ]
    assert (finding["summary"], finding["fix"]) == (said, fix)

    for dryRun in (["--dry-run"], []):
        status, text = query.run(capsys, "recover", *dryRun)
        assert status == 1, (dryRun, text)
        assert f"{said}\n" in text and f"left for the next start of the query: {fix}\n" in text
    assert "would commit 1 transactions of 0 decided batches []" not in text
    assert query.log.outstanding()[0].batchId == 4  # still decided: the restart's to finish

    status, text = query.run(capsys, "status", "--json")
    info = json.loads(text)
    assert status == 1 and info["nextStart"] == [{"batchId": 4, "onlyRestart": True, "says": said}]


def test_a_decided_batch_is_said_alike_by_status_doctor_and_recover(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    query.log.decide(0, [query.task(0, 0), query.task(0, 1)])
    state = query.log.state(0)
    assert state is not None
    said = Unfinished.of(state).describe()
    recover = f"twophase recover --checkpoint {query.checkpoint} --sink-id {query.settings.sinkId}"
    status, text = query.run(capsys, "status")
    assert status == 1 and said in text
    assert f"to finish batch 0: {Unfinished.of(state).fix(recover)}" in text
    status, text = query.run(capsys, "doctor", "--json")
    [finding] = json.loads(text)["sinks"][0]["findings"]
    assert status == 1 and finding["summary"].startswith(said + "; ")
    assert finding["fix"] == Unfinished.of(state).fix(recover)
    status, text = query.run(capsys, "recover", "--dry-run")
    assert status == 0 and f"{said}\n" in text
    assert query.run(capsys, "recover")[0] == 0


def test_a_clean_stop_is_not_in_doubt_and_status_exits_0(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    coordinator = openCoordinator(query.sink.createCommitter(), query.settings)
    coordinator.commitBatch(0, [query.task(0, 0)])
    query.planned(0)
    query.ended(0)
    query.planned(1)
    query.log.markAborted(1, AbortFigures(0, stopped=True))  # the clean stop, before any task
    status, text = query.run(capsys, "status")
    assert status == 0, text
    assert "in doubt              nothing\n" in text
    assert (
        "to run again          batch 1: stopped cleanly before any of its tasks began, nothing "
        "of it was prepared; the next start runs it\n"
    ) in text
    assert "may be prepared" not in text
    row = next(line.split() for line in text.splitlines() if line.startswith("         1 "))
    assert row[:2] == ["1", "stopped"]
    status, text = query.run(capsys, "status", "--json")
    doubt = json.loads(text)["inDoubt"]
    assert doubt["oldest"] is None and doubt["toRunAgain"]["outcome"] == "stopped"


def test_an_aborted_batch_shows_its_figures_and_one_without_a_record_names_doctor(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    coordinator = openCoordinator(query.sink.createCommitter(), query.settings)
    coordinator.abortBatch(0, [query.task(0, 0), query.task(0, 1)])  # its job failed
    query.planned(0)
    status, text = query.run(capsys, "status")
    assert status == 0 and "in doubt              nothing\n" in text
    assert "to run again          batch 0: aborted (2 transactions aborted in " in text
    assert "0 retries), nothing of it decided; the next start runs it again" in text

    query.ended(0)  # Spark ran batch 0 again and it wrote nothing: then it planned batch 1
    query.planned(1)
    status, text = query.run(capsys, "status")
    assert status == 0
    doctor = f"twophase doctor --checkpoint {query.checkpoint} --sink-id {query.settings.sinkId}"
    assert (
        "batch 1: planned by Spark (offsets/1) " in text
        and "ago, and the log holds neither a decision nor an abort of it: whether any of its "
        f"transactions are prepared only the system can tell ({doctor})"
        in text
    ), text
    assert "to run again" not in text


def test_the_batch_table_shows_where_a_slow_batchs_time_went(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    coordinator = openCoordinator(query.sink.createCommitter(), query.settings)
    coordinator.commitBatch(0, [query.task(0, 0)])
    coordinator.commitBatch(1, [query.task(1, 0)])
    figures = {f.batchId: f for f in query.log.recentFigures(2)}
    for batchId, before in ((0, 0.5), (1, 66.0)):  # batch 1 stalled before its decision
        decided = figures[batchId].decidedAt
        assert decided is not None
        query.planned(batchId, decided - timedelta(seconds=before))
        query.ended(batchId, decided + timedelta(seconds=0.2))
    status, text = query.run(capsys, "status")
    lines = text.splitlines()
    header = next(line for line in lines if line.strip().startswith("batch  outcome"))
    assert "batch s  to decide s  prepare ms" in header
    cells: dict[str, list[str]] = {}
    for line in lines:
        if line.startswith("         ") and line.split()[0] in ("0", "1"):
            cells[line.split()[0]] = line.split()
    assert cells["1"][10:12] == ["66.2", "66.0"], cells  # "bytes" is two words
    assert cells["0"][10:12] == ["0.7", "0.5"], cells
    notes = [line.strip() for line in lines if "passed before its decision" in line]
    assert len(notes) == 1 and notes[0].startswith("66.0 s of its 66.2 s passed before"), notes
    assert "the sink's recovery before it (retrying a system that did not answer)" in joined(text)
    status, text = query.run(capsys, "status", "--json")
    batches: dict[int, dict[str, Any]] = {
        b["batchId"]: b for b in json.loads(text)["recentBatches"]
    }
    assert batches[1]["batchSeconds"] == 66.2 and batches[1]["toDecisionSeconds"] == 66.0
    assert batches[0]["plannedAt"] is not None and batches[0]["sparkCommittedAt"] is not None


def test_a_batch_without_spark_files_shows_dashes(
    query: Query, capsys: pytest.CaptureFixture[str]
) -> None:
    coordinator = openCoordinator(query.sink.createCommitter(), query.settings)
    coordinator.commitBatch(0, [query.task(0, 0)])
    status, text = query.run(capsys, "status")
    row = next(line.split() for line in text.splitlines() if line.startswith("         0 "))
    assert status == 0 and row[10:12] == ["-", "-"], row
