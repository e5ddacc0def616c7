"""``twophase verify --sink multi`` without servers: two files targets, joined on the id.

PostgreSQL and Kafka targets are verified against the real servers in
``integration_tests/test_verify_multi.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from twophase import cli
from twophase.verify import MultiVerifyReport, VerifyInputError, expectedFromSequence, verify

ROWS = 40


def writeTarget(path: Path, ids: list[int], name: str = "part-0.parquet") -> None:
    """Sequence rows ``ids`` as a committed Parquet file of a files target."""
    path.mkdir(parents=True, exist_ok=True)
    rows = expectedFromSequence(0, ROWS).take(ids)
    pq.write_table(rows, path / name)


def options(tmp_path: Path) -> dict[str, str]:
    return {
        "targets": "a=files,b=files",
        "a.path": str(tmp_path / "a"),
        "b.path": str(tmp_path / "b"),
    }


def cliArgs(tmp_path: Path) -> list[str]:
    args = ["verify", "--source", "sequence", "--end", str(ROWS), "--sink", "multi"]
    for key, value in options(tmp_path).items():
        args += ["--sink-option", f"{key}={value}"]
    return args


def test_both_targets_whole_is_exactly_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    writeTarget(tmp_path / "a", list(range(ROWS)))
    writeTarget(tmp_path / "b", list(range(ROWS)))
    assert cli.main(cliArgs(tmp_path)) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: exactly once") and "one-sided   0 ids" in out
    assert "target a (files):" in out and "target b (files):" in out


def test_a_batch_in_one_target_only_is_named_by_target(tmp_path: Path) -> None:
    writeTarget(tmp_path / "a", list(range(ROWS)))
    writeTarget(tmp_path / "b", list(range(30)))
    report = verify("sequence", {"end": str(ROWS)}, "multi", options(tmp_path))
    assert isinstance(report, MultiVerifyReport) and not report.ok
    a, b = report.targets
    assert a.ok and (a.absent, b.absent) == (0, 10)
    assert b.absentExamples == ("30", "31", "32", "33", "34")
    assert (report.missing, report.oneSided, report.actualRows) == (10, 10, ROWS + 30)
    assert "the targets disagree" in report.describe()


def test_a_duplicate_in_one_target_is_not_one_sided(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    writeTarget(tmp_path / "a", list(range(ROWS)))
    writeTarget(tmp_path / "a", [3], name="part-1.parquet")
    writeTarget(tmp_path / "b", list(range(ROWS)))
    assert cli.main([*cliArgs(tmp_path), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert (data["duplicated"], data["oneSidedIds"]) == (1, 0)
    assert [t["ok"] for t in data["targets"]] == [False, True]
    assert data["targets"][0]["report"]["examples"]["duplicated"][0]["values"]["id"] == 3


def test_ids_lost_in_both_targets_are_missing_but_not_one_sided(tmp_path: Path) -> None:
    writeTarget(tmp_path / "a", list(range(20)))
    writeTarget(tmp_path / "b", list(range(20)))
    report = verify("sequence", {"end": str(ROWS)}, "multi", options(tmp_path))
    assert (report.missing, report.ok) == (40, False)
    assert isinstance(report, MultiVerifyReport) and report.oneSided == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"targets": "a=files"}, "names one target"),
        ({"targets": "a=files,b=mq"}, "target 'b' has kind 'mq'"),
        ({"targets": "a=files,b=pkg.mod:Sink"}, "cannot read b (pkg.mod:Sink)"),
        ({"b.sinkColumns": "id,"}, "option b.sinkColumns='id,'"),
        ({"b.sinkColumns": "id"}, "1 target columns (id)"),
    ],
)
def test_bad_multi_options_are_input_errors(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    writeTarget(tmp_path / "a", list(range(ROWS)))
    writeTarget(tmp_path / "b", list(range(ROWS)))
    with pytest.raises(VerifyInputError, match=re.escape(message)):
        verify("sequence", {"end": str(ROWS)}, "multi", {**options(tmp_path), **change})


def test_a_delta_target_is_read_through_its_log(tmp_path: Path) -> None:
    """A ``delta`` target is read as Delta readers see it: a data file in the table's directory
    that no commit names (a moved file before the batch's Delta commit) is not counted."""
    deltalake = pytest.importorskip("deltalake")
    writeTarget(tmp_path / "a", list(range(ROWS)))
    deltalake.write_deltalake(str(tmp_path / "b"), expectedFromSequence(0, ROWS - 10))
    writeTarget(tmp_path / "b", list(range(ROWS - 10, ROWS)), "moved-not-committed.parquet")
    multi = {"targets": "a=files,b=delta", "a.path": str(tmp_path / "a")}
    report = verify(
        "sequence", {"end": str(ROWS)}, "multi", {**multi, "b.path": str(tmp_path / "b")}
    )
    assert isinstance(report, MultiVerifyReport) and not report.ok
    [delta] = [t for t in report.targets if t.kind == "delta"]
    assert delta.report.missing == 10 and delta.report.duplicated == 0


def test_an_iceberg_target_is_read_through_its_snapshot(tmp_path: Path) -> None:
    """An ``iceberg`` target is read as Iceberg readers see it: a data file under the table
    that no snapshot names (a moved file before the batch's snapshot) is not counted."""
    pytest.importorskip("pyiceberg")
    from twophase.sinks.iceberg import loadCatalog

    catalog = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/warehouse",
    }
    writeTarget(tmp_path / "a", list(range(ROWS)))
    lake = loadCatalog("default", catalog)
    lake.create_namespace("ns")
    rows = expectedFromSequence(0, ROWS - 10)
    table = lake.create_table("ns.b", rows.schema)
    table.append(rows)
    data = Path(table.location().removeprefix("file://")) / "data"
    writeTarget(data, list(range(ROWS - 10, ROWS)), "moved-not-committed.parquet")
    multi = {
        "targets": "a=files,b=iceberg",
        "a.path": str(tmp_path / "a"),
        "b.table": "ns.b",
        **{f"b.catalog.{key}": value for key, value in catalog.items()},
    }
    report = verify("sequence", {"end": str(ROWS)}, "multi", multi)
    assert isinstance(report, MultiVerifyReport) and not report.ok
    [iceberg] = [t for t in report.targets if t.kind == "iceberg"]
    assert iceberg.report.missing == 10 and iceberg.report.duplicated == 0
