"""``twophase.verify`` and ``twophase verify`` without servers: the multiset comparison, files
written by the real files sink (committed and staged), and the command's exit codes.

PostgreSQL and Kafka are verified against the real servers in ``integration_tests/test_verify.py``.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from twophase import cli
from twophase.protocol import TransactionContext
from twophase.sinks.files import FilesCommitter, FilesSettings, FilesWriter, defaultStagingPath
from twophase.sources.sequence import SequenceSettings
from twophase.spark.sequence import SequenceRange, SequenceReader
from twophase.verify import (
    VerifyInputError,
    VerifyReport,
    actualFromFiles,
    asKafkaRecords,
    compare,
    expectedFromSequence,
    verify,
)
from twophase.verify.held import decodeHex

SINK = "verify-test"


def rows(ids: list[int], payload: str = "row-{}") -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "payload": pa.array([payload.format(i) for i in ids], pa.string()),
        }
    )


def records(pairs: list[tuple[bytes | None, bytes | None]]) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([k for k, _ in pairs], pa.binary()),
            "value": pa.array([v for _, v in pairs], pa.binary()),
        }
    )


def counts(report: VerifyReport) -> tuple[int, int, int]:
    return report.missing, report.duplicated, report.unexpected


# -- compare ----------------------------------------------------------------------------------


def test_identical_sides_are_exactly_once() -> None:
    report = compare(expectedFromSequence(0, 100), rows(list(range(100))))
    assert report.ok and counts(report) == (0, 0, 0)
    assert (report.expectedRows, report.actualRows) == (100, 100)
    assert report.columns == ("id", "payload")
    assert "OK: exactly once" in report.describe()


def test_missing_duplicated_and_unexpected_are_counted_with_first_examples() -> None:
    expected = expectedFromSequence(0, 20)
    held = [i for i in range(20) if i not in (3, 11, 12)] + [5, 5, 7] + [100, 101]
    report = compare(expected, rows(held))
    assert not report.ok
    assert counts(report) == (3, 3, 2)  # 5 held twice extra, 7 once extra
    assert [e.values["id"] for e in report.missingExamples] == [3, 11, 12]
    assert [(e.values["id"], e.expected, e.actual) for e in report.duplicatedExamples] == [
        (5, 1, 3),
        (7, 1, 2),
    ]
    assert [(e.values, e.actual) for e in report.unexpectedExamples] == [
        ({"id": 100, "payload": "row-100"}, 1),
        ({"id": 101, "payload": "row-101"}, 1),
    ]
    text = report.describe()
    assert "VIOLATED" in text and 'id=3, payload="row-3": offered 1, found 0' in text


def test_examples_are_the_first_five_in_source_order() -> None:
    expected = rows([50, 40, 30, 20, 10, 0, 60, 70])
    report = compare(expected, rows([]))
    assert report.missing == 8
    assert [e.values["id"] for e in report.missingExamples] == [50, 40, 30, 20, 10]
    assert len(compare(expected, rows([]), examples=2).missingExamples) == 2


def test_equal_records_offered_twice_must_be_held_twice() -> None:
    offered = records([(b"k", b"v"), (b"k", b"v"), (b"x", b"y")])
    once = compare(offered, records([(b"k", b"v"), (b"x", b"y")]))
    assert counts(once) == (1, 0, 0)
    assert once.missingExamples[0].expected == 2 and once.missingExamples[0].actual == 1
    assert compare(offered, records([(b"x", b"y"), (b"k", b"v"), (b"k", b"v")])).ok
    thrice = compare(offered, records([(b"k", b"v")] * 3 + [(b"x", b"y")]))
    assert counts(thrice) == (0, 1, 0)


def test_a_wrong_payload_is_one_missing_and_one_unexpected_record() -> None:
    held = rows([0, 1, 2])
    held = held.set_column(1, "payload", pa.array(["row-0", "row-1", "row-two"]))
    report = compare(expectedFromSequence(0, 3), held)
    assert counts(report) == (1, 0, 1)
    assert report.unexpectedExamples[0].values == {"id": 2, "payload": "row-two"}


def test_null_keys_are_one_identity() -> None:
    offered = records([(None, b"a"), (None, b"b"), (b"k", None)])
    assert compare(offered, records([(None, b"b"), (b"k", None), (None, b"a")])).ok
    report = compare(offered, records([(None, b"a"), (None, b"a"), (b"k", None)]))
    assert counts(report) == (1, 1, 0)
    assert report.duplicatedExamples[0].values == {"key": None, "value": b"a"}


def test_columns_are_compared_across_names_and_types() -> None:
    expected = expectedFromSequence(0, 4)
    held = pa.table(
        {
            "n": pa.array([3, 2, 1, 0], pa.int32()),
            "text": pa.array([b"row-3", b"row-2", b"row-1", b"row-0"], pa.binary()),
            "other": pa.array([1.5] * 4),
        }
    )
    assert compare(expected, held, ["id", "payload"], actualColumns=["n", "text"]).ok
    assert compare(expected, held, ["id"], actualColumns=["n"]).ok
    # Kafka keys (the text of an id) against integer ids: compared as text
    keys = pa.table({"key": pa.array([b"0", b"1", b"2", b"3"], pa.binary())})
    assert compare(expected, keys, ["id"], actualColumns=["key"]).ok
    assert counts(compare(expected, keys.slice(1), ["id"], actualColumns=["key"])) == (1, 0, 0)


def test_missing_columns_and_incomparable_types_are_input_errors() -> None:
    expected = expectedFromSequence(0, 3)
    with pytest.raises(VerifyInputError, match="sink has no column payload"):
        compare(expected, pa.table({"id": pa.array([0, 1, 2])}))
    with pytest.raises(VerifyInputError, match="source has no column nope"):
        compare(expected, expected, ["nope"])
    nested = pa.table({"id": pa.array([[0], [1], [2]])})
    with pytest.raises(VerifyInputError, match="cannot be compared"):
        compare(expected, nested, ["id"])
    with pytest.raises(VerifyInputError, match="no default identity columns"):
        compare(pa.table({"a": [1]}), pa.table({"a": [1]}))


def test_an_empty_sink_without_columns_misses_everything() -> None:
    report = compare(expectedFromSequence(0, 7), pa.table({}))
    assert counts(report) == (7, 0, 0) and report.actualRows == 0
    assert compare(expectedFromSequence(0, 0), pa.table({})).ok


def test_the_report_as_json_shows_bytes_as_text_or_hex() -> None:
    report = compare(records([(b"\xff\x00", b"value"), (b"k", b"v")]), records([(b"k", b"v")]))
    data = json.loads(json.dumps(report.toJson()))
    assert data["ok"] is False and data["missing"] == 1
    assert data["examples"]["missing"] == [
        {"values": {"key": "0xff00", "value": "value"}, "expected": 1, "actual": 0}
    ]


# -- what the sequence source offered ---------------------------------------------------------


def test_expected_sequence_rows_are_the_sources_rows() -> None:
    reader = SequenceReader(SequenceSettings.fromOptions({}))
    read = pa.Table.from_batches(list(reader.read(SequenceRange(10, 200_010))))
    assert expectedFromSequence(10, 200_010).equals(read)
    assert expectedFromSequence(5, 5).num_rows == 0
    with pytest.raises(VerifyInputError, match="start <= end"):
        expectedFromSequence(10, 5)


def test_sequence_rows_as_kafka_records() -> None:
    table = asKafkaRecords(expectedFromSequence(7, 9))
    assert table.to_pylist() == [
        {"key": b"7", "value": b"row-7"},
        {"key": b"8", "value": b"row-8"},
    ]


# -- what a files sink holds ------------------------------------------------------------------


def filesSink(options: dict[str, str]) -> FilesSettings:
    """The files sink's settings from its options: what its writer and committer are built of."""
    return FilesSettings.fromOptions(options)


def writeBatch(
    settings: FilesSettings, batchId: int, parts: list[pa.Table], commit: bool = True
) -> None:
    """One micro-batch through the real files sink: a task per part, then the driver."""
    writer, committer = FilesWriter(settings), FilesCommitter(settings)
    handles = []
    for partition, part in enumerate(parts):
        ctx = TransactionContext(SINK, "q-1", batchId, partition, 0, "run-1")
        txn = writer.beginTransaction(ctx)
        for batch in part.to_batches(max_chunksize=1000):
            writer.write(txn, batch)
        handles.append(writer.preCommit(txn))
    if commit:
        for handle in handles:
            committer.commit(handle)


@pytest.mark.parametrize(
    "options",
    [
        {"format": "parquet"},
        {"format": "json"},
        {"format": "csv"},
        {"format": "csv", "compression": "gzip", "header": "false"},
        {"format": "json", "compression": "gzip", "partitionBy": "bucket"},
        {"format": "parquet", "partitionBy": "bucket", "maxRecordsPerFile": "300"},
    ],
    ids=lambda o: "-".join(o.values()),
)
def test_committed_files_are_verified_and_staged_files_ignored(
    tmp_path: Path, options: dict[str, str]
) -> None:
    out = tmp_path / "out"
    sink = filesSink({"path": str(out), **options})
    table = expectedFromSequence(0, 2000)
    table = table.append_column("bucket", pa.array(np.arange(2000) % 3, pa.int64()))
    writeBatch(sink, 0, [table.slice(0, 700), table.slice(700, 500)])
    writeBatch(sink, 1, [table.slice(1200, 800)])
    writeBatch(sink, 2, [table.slice(0, 900)], commit=False)  # prepared, never decided
    assert any(Path(defaultStagingPath(str(out))).rglob("*.staged"))
    sinkOptions = {"path": str(out), **options}
    names = ["f0", "f1"] if options.get("header") == "false" else None
    report = verify("sequence", {"end": "2000"}, "files", sinkOptions, sinkColumns=names)
    assert report.ok, report.describe()
    assert report.actualRows == 2000
    # the same batch committed again (a sink that is not exactly-once) is seen
    writeBatch(filesSink({**sinkOptions}), 7, [table.slice(0, 10)])
    again = verify("sequence", {"end": "2000"}, "files", sinkOptions, sinkColumns=names)
    assert counts(again) == (0, 10, 0)
    assert [e.values["id"] for e in again.duplicatedExamples] == [0, 1, 2, 3, 4]


def test_partition_columns_come_back_as_columns(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = filesSink({"path": str(out), "partitionBy": "payload"})
    writeBatch(sink, 0, [expectedFromSequence(0, 50)])
    assert len(list(out.glob("payload=*"))) == 50
    assert verify("sequence", {"end": "50"}, "files", {"path": str(out)}).ok
    typed = {"path": str(out), "partitionBy": "payload"}
    assert verify("sequence", {"end": "50"}, "files", typed).ok


def test_text_files_keep_strings_that_look_like_numbers(tmp_path: Path) -> None:
    out = tmp_path / "out"
    offered = pa.table({"id": pa.array([1, 2], pa.int64()), "payload": ["007", "1e3"]})
    for fmt in ("csv", "json"):
        sink = filesSink({"path": str(out / fmt), "format": fmt})
        writeBatch(sink, 0, [offered])
        actual = actualFromFiles(str(out / fmt), fmt, schema=offered.schema)
        assert actual.column("payload").to_pylist() == ["007", "1e3"]
        assert compare(offered, actual).ok


def test_binary_columns_of_json_files_are_decoded_from_base64(tmp_path: Path) -> None:
    out = tmp_path / "out"
    offered = records([(b"\x00\xff", b"one"), (None, b"two")])
    sink = filesSink({"path": str(out), "format": "json"})
    writeBatch(sink, 0, [offered])
    line = next(out.glob("*.json")).read_text().splitlines()[0]
    assert base64.b64encode(b"\x00\xff").decode() in line
    assert compare(offered, actualFromFiles(str(out), "json", schema=offered.schema)).ok


def test_an_output_without_committed_files_misses_everything(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = filesSink({"path": str(out)})
    writeBatch(sink, 0, [expectedFromSequence(0, 10)], commit=False)
    report = verify("sequence", {"end": "10"}, "files", {"path": str(out)})
    assert counts(report) == (10, 0, 0)


def test_files_input_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(VerifyInputError, match="no such directory"):
        actualFromFiles(str(tmp_path / "nowhere"))
    with pytest.raises(VerifyInputError, match="format='xml' is not supported"):
        actualFromFiles(str(tmp_path), "xml")
    pq.write_table(rows([1]), tmp_path / "part-0.parquet")
    with pytest.raises(VerifyInputError, match="no column nope"):
        actualFromFiles(str(tmp_path), columns=["nope"])
    (tmp_path / "part-1.parquet").write_text("not parquet")
    with pytest.raises(VerifyInputError, match="cannot read the files as parquet"):
        actualFromFiles(str(tmp_path))


def test_hex_text_decodes_to_bytes() -> None:
    values = [b"", None, b"\x00\x01\xfe\xff", b"twophase", None]
    text = pa.chunked_array(
        [pa.array([None if v is None else v.hex().upper() for v in values]).slice(1)]
    )
    decoded = decodeHex(text)
    assert decoded.type == pa.binary()
    assert decoded.to_pylist() == values[1:]
    assert decodeHex(pa.chunked_array([], pa.string())).to_pylist() == []


# -- the command ------------------------------------------------------------------------------


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["verify", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def output(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    writeBatch(filesSink({"path": str(out)}), 0, [expectedFromSequence(0, 100)])
    return out


def test_cli_exits_0_when_exactly_once(output: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        ["--source", "sequence", "--start", "0", "--end", "100", "--sink", "files"]
        + ["--path", str(output)],
        capsys,
    )
    assert code == 0, err
    assert out.startswith("OK: exactly once")
    assert "offered     100 records" in out and "found       100 records" in out


def test_cli_exits_1_on_a_violation_with_json(
    output: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        ["--source", "sequence", "--start", "50", "--end", "150", "--sink", "files"]
        + ["--sink-option", f"path={output}", "--sink-option", "format=parquet", "--json"],
        capsys,
    )
    assert code == 1
    data = json.loads(out)
    assert (data["ok"], data["missing"], data["duplicated"], data["unexpected"]) == (
        False,
        50,
        0,
        50,
    )
    assert data["examples"]["missing"][0]["values"] == {"id": 100, "payload": "row-100"}
    assert data["examples"]["unexpected"][0]["values"] == {"id": 0, "payload": "row-0"}
    assert len(data["examples"]["missing"]) == 5


def test_cli_identity_columns_can_be_narrowed(
    output: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--source", "sequence", "--end", "100", "--sink", "files", "--path", str(output)]
    assert run([*args, "--columns", "id"], capsys)[0] == 0
    code, _, err = run([*args, "--columns", "id", "--sink-columns", "nope"], capsys)
    assert code == 2 and "no column nope" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sink", "files", "--path", "{tmp}/nowhere"], "no such directory"),
        (["--sink", "files", "--path", "{tmp}", "--url", "x"], "--url is an option of"),
        (["--sink", "files"], "option path is required"),
        (["--sink", "postgres", "--table", "t"], 'needs .option("url"'),
        (["--sink", "kafka", "--topic", "t"], "kafka.bootstrap.servers is required"),
    ],
)
def test_cli_exits_2_on_bad_input_with_a_message_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, out, err = run(["--source", "sequence", "--end", "10", *args], capsys)
    assert code == 2
    assert message in err and "Traceback" not in err and out == ""


def test_cli_exits_2_without_a_range_or_with_a_bad_option(
    output: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["--source", "sequence", "--sink", "files", "--path", str(output)], capsys)
    assert code == 2 and "--end N" in err
    with pytest.raises(SystemExit) as exit:
        cli.main(["verify", "--source", "sequence", "--sink", "files", "--sink-option", "path"])
    assert exit.value.code == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


# -- speed ------------------------------------------------------------------------------------


def test_five_million_sequence_rows_against_a_parquet_directory(
    tmp_path: Path, record_property: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    rowsTotal = 5_000_000
    table = expectedFromSequence(0, rowsTotal)
    for i, start in enumerate(range(0, rowsTotal, 500_000)):
        pq.write_table(table.slice(start, 500_000), tmp_path / f"part-{i:05d}.snappy.parquet")
    del table
    started = time.monotonic()
    code, out, err = run(
        ["--source", "sequence", "--end", str(rowsTotal), "--sink", "files"]
        + ["--path", str(tmp_path), "--json"],
        capsys,
    )
    seconds = time.monotonic() - started
    record_property("verifySeconds", round(seconds, 2))
    with capsys.disabled():
        print(f"\nverify of {rowsTotal} sequence rows against parquet: {seconds:.2f} s")
    assert code == 0, err
    assert json.loads(out)["actualRows"] == rowsTotal
    assert seconds < 120  # generous: about 3 s on a busy 2-core machine
