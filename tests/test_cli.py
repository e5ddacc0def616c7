"""``twophase status`` and ``twophase recover`` on a real decision log and real staged files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from twophase import cli
from twophase.coordinator import DecisionLog
from twophase.coordinator.description import readSinkDescription
from twophase.protocol import TaskResult, TransactionContext
from twophase.settings import SinkSettings
from twophase.spark.driver import describeSink
from twophase.spark.files import FilesSink


def _prepareBatch(sink: FilesSink, settings: SinkSettings, batchId: int) -> list[TaskResult]:
    results = []
    writer = sink.createWriter()
    for partition in range(2):
        ctx = TransactionContext(settings.sinkId, "q-1", batchId, partition, 0, "run1")
        txn = writer.beginTransaction(ctx)
        ids = pa.array(range(partition * 10, partition * 10 + 10), pa.int64())
        writer.write(txn, pa.RecordBatch.from_arrays([ids], names=["id"]))
        handle = writer.preCommit(txn)
        results.append(TaskResult(settings.sinkId, "q-1", batchId, partition, 0, handle, 10))
    return results


@pytest.fixture
def crashedQuery(tmp_path: Path) -> tuple[Path, Path]:
    """A checkpoint whose log decided batch 0 and crashed before committing it."""
    checkpoint, output = tmp_path / "ckpt", tmp_path / "out"
    sink = FilesSink({"path": str(output), "checkpointLocation": str(checkpoint)})
    settings = SinkSettings.fromOptions(sink.options, sink.name())
    describeSink(sink, settings)
    decisionLog = DecisionLog(settings.logLocation)
    decisionLog.claim(settings.sinkId, "q-1")
    decisionLog.decide(0, _prepareBatch(sink, settings, 0))
    return checkpoint, output


def test_status_shows_the_decided_but_unfinished_batch(
    crashedQuery: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, _ = crashedQuery
    assert cli.main(["status", "--checkpoint", str(checkpoint), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["committedBatches"] == 0
    assert [b["batchId"] for b in info["outstanding"]] == [0]
    assert len(info["outstanding"][0]["handles"]) == 2


def test_recover_dry_run_changes_nothing(
    crashedQuery: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, output = crashedQuery
    assert cli.main(["recover", "--checkpoint", str(checkpoint), "--dry-run"]) == 0
    assert "would commit 1 decided batches" in capsys.readouterr().out
    assert ds.dataset(str(output), format="parquet").count_rows() == 0


def test_recover_commits_the_decided_batch_from_sink_json(
    crashedQuery: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, output = crashedQuery
    assert cli.main(["recover", "--checkpoint", str(checkpoint)]) == 0
    assert "committed 2 transactions of 1 decided batches [0]" in capsys.readouterr().out
    table = ds.dataset(str(output), format="parquet").to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(20))
    assert cli.main(["status", "--checkpoint", str(checkpoint), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["committedBatches"] == 1 and info["outstanding"] == []
    assert info["commitMillis"]["batches"] == 1


def test_status_without_a_log_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--checkpoint", str(tmp_path)]) == 1
    assert "no twophase decision log" in capsys.readouterr().out


def test_sink_description_keeps_only_allowed_options(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    sink = FilesSink(
        {
            "path": str(tmp_path / "out"),
            "checkpointLocation": str(checkpoint),
            "commitRetries": "3",
            "fs.secret": "s3cret-storage-key",
            "userToken": "opaque-user-value",
        }
    )
    settings = SinkSettings.fromOptions(sink.options, sink.name())
    describeSink(sink, settings)
    description = readSinkDescription(settings.logLocation)
    assert description is not None
    assert description.className == "twophase.spark.files:FilesSink"
    assert set(description.options) == {"checkpointLocation", "commitRetries", "path"}
    text = (Path(settings.logLocation) / "sink.json").read_text()
    assert "s3cret" not in text and "opaque-user-value" not in text


def test_recover_takes_options_sink_json_does_not_keep(
    crashedQuery: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, output = crashedQuery
    argv = ["recover", "--checkpoint", str(checkpoint), "--option", "commitRetries=2"]
    assert cli.main(argv) == 0
    assert "committed 2 transactions" in capsys.readouterr().out
    assert ds.dataset(str(output), format="parquet").count_rows() == 20


def test_recover_finds_built_in_sinks_named_by_their_old_module(
    crashedQuery: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, output = crashedQuery
    (sinkJson,) = checkpoint.glob("twophase/*/sink.json")
    body = json.loads(sinkJson.read_text())
    body["class"] = "twophase.sinks.files:FilesSink"  # as versions before the split wrote it
    sinkJson.write_text(json.dumps(body))
    assert cli.main(["recover", "--checkpoint", str(checkpoint)]) == 0
    assert ds.dataset(str(output), format="parquet").count_rows() == 20
