"""``twophase status`` and ``twophase recover`` on a real decision log and real staged files.

Also how the commands fail: one paragraph on stderr with the fix, an exit status of 0/1/2,
a traceback only with ``--debug``, and sink options from ``--sink-option-file``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from twophase import cli
from twophase.cli import errors, options, recover
from twophase.clients.postgres import PostgresSinkError
from twophase.coordinator import CommitFailedError, DecisionLog, LogOwnershipError
from twophase.coordinator.description import readSinkDescription
from twophase.coordinator.errors import RewritePendingError
from twophase.protocol import SinkFailure, TaskResult, TransactionContext
from twophase.settings import SinkSettings
from twophase.spark.declared import FilesSink
from twophase.spark.driver import describeSink, openCoordinator
from twophase.spark.task import runTask


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
    assert cli.main(["status", "--checkpoint", str(checkpoint), "--json"]) == 1  # left to do
    info = json.loads(capsys.readouterr().out)
    assert info["committedBatches"] == 0
    assert [b["batchId"] for b in info["outstanding"]] == [0]
    assert len(info["outstanding"][0]["handles"]) == 2


def test_status_shows_the_recent_batches_and_what_is_in_doubt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, output = tmp_path / "ckpt", tmp_path / "out"
    sink = FilesSink({"path": str(output), "checkpointLocation": str(checkpoint)})
    settings = SinkSettings.fromOptions(sink.options, sink.name())
    describeSink(sink, settings)
    coordinator = openCoordinator(sink.createCommitter(), settings)
    tasks = [_runTask(sink, settings, 0, p) for p in range(2)]
    coordinator.commitBatch(0, tasks)
    coordinator.log.decide(1, [_runTask(sink, settings, 1, p) for p in range(2)])  # then died

    assert cli.main(["status", "--checkpoint", str(checkpoint), "--json"]) == 1
    info = json.loads(capsys.readouterr().out)
    first, second = info["recentBatches"]
    assert (first["batchId"], first["outcome"], first["committedBy"]) == (0, "committed", "commit")
    assert (first["rows"], first["bytes"], first["prepared"], first["committed"]) == (20, 160, 2, 2)
    assert first["prepareSeconds"] == round(max(t.seconds or 0 for t in tasks), 6)
    assert first["decisionSeconds"] > 0 and first["commitSeconds"] > 0
    assert (second["outcome"], second["committed"], second["commitSeconds"]) == (
        "decided",
        None,
        None,
    )
    doubt = info["inDoubt"]
    assert doubt["oldest"]["batchId"] == 1 and doubt["oldest"]["state"] == "decided"
    assert doubt["oldest"]["ageSeconds"] >= 0 and doubt["pendingCommittables"] == 2

    assert cli.main(["status", "--checkpoint", str(checkpoint), "--batches", "1"]) == 1
    text = capsys.readouterr().out
    assert "recent batches        the newest 1 in the log" in text
    header, row = [line.split() for line in text.splitlines() if line.startswith("    ")][:2]
    assert header[:4] == ["batch", "outcome", "by", "rows"] and row[:4] == [
        "1",
        "decided",
        "-",
        "20",
    ]
    assert "in doubt              batch 1: decided, not committed (2 handles), for " in text

    coordinator.recover(2)  # the restart finishes batch 1; Spark planned batch 2
    (checkpoint / "offsets").mkdir()
    (checkpoint / "offsets" / "2").write_text("v1\n{}\n")
    assert cli.main(["status", "--checkpoint", str(checkpoint), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["recentBatches"][-1]["committedBy"] == "recovery"
    assert info["inDoubt"]["oldest"]["batchId"] == 2
    assert info["inDoubt"]["oldest"]["state"] == "undecided"
    (checkpoint / "commits").mkdir()
    (checkpoint / "commits" / "2").write_text("v1\n{}\n")
    assert cli.main(["status", "--checkpoint", str(checkpoint)]) == 0
    assert "in doubt              nothing" in capsys.readouterr().out


def _runTask(sink: FilesSink, settings: SinkSettings, batchId: int, partition: int) -> TaskResult:
    ids = pa.array(range(partition * 10, partition * 10 + 10), pa.int64())
    ctx = TransactionContext(settings.sinkId, "q-1", batchId, partition, 0, "run1")
    batches = [pa.RecordBatch.from_arrays([ids], names=["id"])]
    return runTask(sink.createWriter, ctx, batches, alreadyDecided=False)


def test_recover_dry_run_changes_nothing(
    crashedQuery: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, output = crashedQuery
    assert cli.main(["recover", "--checkpoint", str(checkpoint), "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "would commit 2 transactions of 1 decided batches [0]" in said
    assert "the next start of the query commits its 2 transactions" in said
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
    assert cli.main(["status", "--checkpoint", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no twophase decision log" in captured.err and "Fix: give the" in captured.err


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
    assert description.className == "twophase.spark.declared:FilesSink"
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


# -- how the commands fail ---------------------------------------------------------------------


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Exit status, stdout, and stderr with its wrapped lines joined (checked: < 12 lines)."""
    status = cli.main(argv)
    captured = capsys.readouterr()
    assert len(captured.err.splitlines()) < 12, captured.err
    return status, captured.out, " ".join(captured.err.split())


def test_every_command_says_a_missing_checkpoint_in_one_paragraph(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nowhere")
    for command in ("status", "recover", "doctor"):
        status, out, err = _run([command, "--checkpoint", missing], capsys)
        assert status == 2, (command, out, err)
        text = " ".join((out + err).split())
        assert f"no checkpoint at {missing}" in text and "Traceback" not in text


def test_a_sink_of_another_query_is_named_with_the_sinks_that_are_here(
    crashedQuery: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, _ = crashedQuery
    (here,) = [p.name for p in (checkpoint / "twophase").iterdir()]
    for command in ("status", "recover"):
        status, _, err = _run([command, "--checkpoint", str(checkpoint), "--sink-id", "x"], capsys)
        assert status == 2
        assert "no decision log of sink x" in err and f"has the sinks {here}" in err


def test_recover_without_sink_json_exits_2_and_says_why(
    crashedQuery: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, _ = crashedQuery
    (sinkJson,) = checkpoint.glob("twophase/*/sink.json")
    sinkJson.unlink()
    status, _, err = _run(["recover", "--checkpoint", str(checkpoint)], capsys)
    assert status == 2 and "has no sink.json" in err and "Fix: restart the query" in err


def test_an_unexpected_error_is_one_line_and_its_traceback_needs_debug(
    crashedQuery: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checkpoint, _ = crashedQuery

    def broken(url: str, options: object) -> None:
        raise RuntimeError("token=opaque-Secret-42 went missing")

    monkeypatch.setattr(recover, "loadSink", broken)
    argv = ["recover", "--checkpoint", str(checkpoint)]
    status, _, err = _run(argv, capsys)
    assert status == 1 and "Traceback" not in err and "--debug" in err
    assert "opaque-Secret-42" not in err
    assert cli.main([*argv, "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError" in err and "opaque-Secret-42" not in err
    monkeypatch.setenv("TWOPHASE_DEBUG", "1")
    assert cli.main(argv) == 1
    assert "Traceback" in capsys.readouterr().err


def test_recover_takes_a_sink_option_file_only_its_owner_may_read(
    crashedQuery: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, output = crashedQuery
    (sinkJson,) = checkpoint.glob("twophase/*/sink.json")
    before = sinkJson.read_bytes()
    optionFile = tmp_path / "sink.options"
    optionFile.write_text("# for recovery\ncommitRetries = 2\nfs.secret=Opt-File-Secret-9\n")
    optionFile.chmod(0o644)
    argv = ["recover", "--checkpoint", str(checkpoint), "--sink-option-file", str(optionFile)]
    status, _, err = _run(argv, capsys)
    assert status == 2 and f"chmod 600 {optionFile}" in err and "mode 0644" in err
    assert ds.dataset(str(output), format="parquet").count_rows() == 0  # nothing was done
    optionFile.chmod(0o600)
    status, out, err = _run(argv, capsys)
    assert status == 0, err
    assert "committed 2 transactions" in out
    assert sinkJson.read_bytes() == before  # the query writes sink.json, never recover
    for path in checkpoint.rglob("*"):
        assert not path.is_file() or b"Opt-File-Secret-9" not in path.read_bytes()


def test_sink_option_files_hold_lines_or_json_and_their_errors_show_no_value(
    tmp_path: Path,
) -> None:
    lines, asJson, bad = tmp_path / "a", tmp_path / "b.json", tmp_path / "c"
    lines.write_text("password=pa=ss word\n\n  # note\nurl = postgresql://u@h/db\n")
    asJson.write_text('{"password": "pw-Json-1", "commitRetries": 3, "resetLog": false}')
    bad.write_text("password\n")
    for path in (lines, asJson, bad):
        path.chmod(0o600)
    assert options.readOptionFile(str(lines)) == {
        "password": "pa=ss word",
        "url": "postgresql://u@h/db",
    }
    assert options.readOptionFile(str(asJson)) == {
        "password": "pw-Json-1",
        "commitRetries": "3",
        "resetLog": "false",
    }
    with pytest.raises(options.SinkOptionError, match="line 1: expected KEY=VALUE"):
        options.readOptionFile(str(bad))
    with pytest.raises(options.SinkOptionError, match="cannot read"):
        options.readOptionFile(str(tmp_path / "missing"))
    merged = options.sinkOptions([("password", "from-line")], [str(lines)])
    assert merged["password"] == "from-line" and merged["url"] == "postgresql://u@h/db"


def test_the_same_failure_on_many_handles_is_said_once() -> None:
    cause = "cannot connect to app@db.example:5432/prod: fe_sendauth: no password supplied"
    failures = [
        (
            f"postgres batch 2 partition {p} attempt 0: 1 row(s) into public.t as gid-{p}",
            1,
            PostgresSinkError(f"postgres: commit of postgres batch 2 partition {p} "
                              f"attempt 0: 1 row(s) into public.t as gid-{p}: {cause}",
                              reason=SinkFailure.CREDENTIALS),  # as connect raises it
        )
        for p in (3, 0, 2, 1, 7)
    ]  # fmt: skip
    explanation = errors.explain(CommitFailedError("s1", 2, failures))
    text = errors.paragraph("recover", explanation.text, explanation.fix)
    assert explanation.status == 2  # the server refused: nothing was done
    assert "5 transactions (batch 2 partitions 0-3, 7)" in text
    assert text.count("no password supplied") == 1 and "gid-" not in text
    assert "decision for batch 2 is durable" in text and "PGPASSWORD" in text
    assert "--sink-option password=..." in " ".join(text.split())
    assert len(text.splitlines()) < 12


def test_the_coordinators_refusals_keep_their_words_and_exit_1() -> None:
    owned = errors.explain(LogOwnershipError("file:///c/twophase/s", "s", "q-old", "q-new"))
    assert owned.status == 1 and "twophase.resetLog=true" in owned.text
    pending = errors.explain(RewritePendingError("s", 4, [1, 2], "ProducerFenced"))
    assert pending.status == 1 and "restart the query" in pending.text
    assert "docs/operations.md" in pending.text


def test_a_lost_decided_transaction_is_said_once_with_where_to_read_on(
    crashedQuery: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, _ = crashedQuery
    staged = [p for p in checkpoint.parent.glob("_twophase-staging/**/*") if p.is_file()]
    assert staged
    for path in staged:  # deleted by hand after the decision
        path.unlink()
    status, _, err = _run(["recover", "--checkpoint", str(checkpoint)], capsys)
    assert status == 1
    assert "is lost: exactly-once is broken for it" in err and "docs/operations.md" in err
    assert err.count("decision stays in the log") == 1 and "Traceback" not in err


def test_a_bad_sink_option_names_the_option_and_never_repeats_a_bare_argument(
    crashedQuery: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, _ = crashedQuery
    argv = ["recover", "--checkpoint", str(checkpoint)]
    status, _, err = _run([*argv, "--sink-option", "commitRetries=abc"], capsys)
    assert status == 2 and "commitRetries" in err and "Fix: give the option" in err
    with pytest.raises(SystemExit) as exit:
        cli.main([*argv, "--sink-option", "Bare-Secret-Typed-Alone"])
    assert exit.value.code == 2
    assert "Bare-Secret-Typed-Alone" not in capsys.readouterr().err
