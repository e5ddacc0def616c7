"""The Delta sink against real delta-rs tables on local disk, without Spark.

The tasks' writer and the driver's coordinator and committer are plain Python: each test drives
them as Spark would (or as a crash leaves them) and reads the table back through deltalake,
polars and DuckDB, which see only what the log names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from twophase.coordinator import Coordinator, CoordinatorSettings, DecisionLog
from twophase.protocol import TaskResult, TransactionContext
from twophase.redaction import publicOptions
from twophase.sinks.delta import DeltaCommitter, DeltaSettings, DeltaTableError, ensureTable
from twophase.sinks.files import FilesWriter

deltalake = pytest.importorskip("deltalake")

SINK = "delta-sink"
QUERY = "query-1"
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("at", pa.timestamp("us", tz="Europe/Paris")),
        ("day", pa.string()),
    ]
)


class Query:
    """One streaming query into one Delta table: its checkpoint, its tasks and its driver."""

    def __init__(self, tmp_path: Path, **options: str) -> None:
        self.table = str(tmp_path / "table")
        self.options = {"path": self.table, **options}
        self.settings = DeltaSettings.fromOptions(self.options)
        self.url = str(tmp_path / "checkpoint" / "twophase" / SINK)
        ensureTable(
            self.table,
            SCHEMA,
            self.settings.partitionBy if self.settings.partitionGiven else None,
            self.settings.createTable,
        )
        self.restart()

    def restart(self) -> None:
        """A new driver process: a new committer and coordinator over the same log."""
        self.committer = DeltaCommitter(DeltaSettings.fromOptions(self.options))
        self.log = DecisionLog(self.url)
        settings = CoordinatorSettings(retryInitialSeconds=0.001, retryMaxSeconds=0.01)
        self.coordinator = Coordinator(self.committer, self.log, SINK, settings)

    def tasks(self, batchId: int, partitions: int = 3, attempt: int = 0) -> list[TaskResult]:
        """Batch N's tasks: each writes its share of the batch's rows and prepares."""
        writer = FilesWriter(DeltaSettings.fromOptions(self.options).files)
        results = []
        for p in range(partitions):
            ids = [i for i in rowsOf(batchId) if i % partitions == p]
            ctx = TransactionContext(SINK, QUERY, batchId, p, attempt)
            txn = writer.beginTransaction(ctx)
            writer.write(txn, batchOf(ids))
            handle = writer.preCommit(txn)
            results.append(TaskResult(SINK, QUERY, batchId, p, attempt, handle, len(ids)))
        return results

    def run(self, batchId: int, partitions: int = 3) -> list[TaskResult]:
        self.coordinator.recover(batchId)
        results = self.tasks(batchId, partitions)
        self.coordinator.commitBatch(batchId, results)
        return results

    def deltaTable(self) -> deltalake.DeltaTable:
        return deltalake.DeltaTable(self.table)

    def ids(self) -> list[int]:
        """The table's ids through deltalake, checked against polars."""
        ids = sorted(self.deltaTable().to_pyarrow_table().column("id").to_pylist())
        assert sorted(pl.read_delta(self.table)["id"].to_list()) == ids
        return ids


def rowsOf(batchId: int) -> list[int]:
    return list(range(batchId * 100, batchId * 100 + 100))


def batchOf(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([f"n{i}" if i % 7 else None for i in ids], pa.string()),
            pa.array([i * 1_000_000 for i in ids], pa.timestamp("us", tz="Europe/Paris")),
            pa.array([("a:b c" if i % 3 == 0 else f"d{i % 3}") for i in ids], pa.string()),
        ],
        schema=SCHEMA,
    )


def expected(*batches: int) -> list[int]:
    return sorted(i for b in batches for i in rowsOf(b))


def test_one_commit_per_batch_with_the_batch_as_application_transaction(tmp_path: Path) -> None:
    query = Query(tmp_path)
    created = query.deltaTable().version()
    query.run(0)
    query.run(1, partitions=5)

    table = query.deltaTable()
    assert table.version() == created + 2, "one Delta commit per batch, not one per task"
    assert table.transaction_version(f"twophase-{SINK}") == 1
    assert query.ids() == expected(0, 1)
    latest = table.history(1)[0]
    assert latest["twophase.batchId"] == "1" and latest["twophase.sinkId"] == SINK
    adds = pa.table(table.get_add_actions()).to_pylist()
    assert sum(a["num_records"] for a in adds) == 200
    rows = table.to_pyarrow_table().to_pylist()
    byId = {r["id"]: r for r in rows}
    assert byId[7]["name"] is None and byId[8]["name"] == "n8"
    assert byId[8]["at"].timestamp() == 8.0


def test_a_replayed_batch_is_found_in_the_table_and_adds_nothing(tmp_path: Path) -> None:
    query = Query(tmp_path)
    query.run(0)
    version = query.deltaTable().version()

    query.restart()
    query.coordinator.recover(0)
    query.coordinator.commitBatch(0, query.tasks(0, attempt=1))  # Spark's replay of batch 0

    assert query.deltaTable().version() == version
    assert query.ids() == expected(0)


def test_crash_after_the_files_moved_before_the_delta_commit(tmp_path: Path) -> None:
    """Decided, every handle committed (files in the table's directory), no log commit yet: the
    files are invisible, and the restart's recovery adds them in one commit."""
    query = Query(tmp_path)
    query.run(0)
    results = query.tasks(1)
    state = query.log.decide(1, results)
    for entry in state.handles:
        query.committer.commit(entry.handle)
    assert query.ids() == expected(0), "moved files that no commit names are invisible"

    query.restart()
    query.coordinator.recover(2)

    assert query.ids() == expected(0, 1)
    assert query.deltaTable().transaction_version(f"twophase-{SINK}") == 1
    assert query.log.outstanding() == []


def test_crash_after_the_delta_commit_before_committed_is_logged(tmp_path: Path) -> None:
    query = Query(tmp_path)
    results = query.tasks(0)
    state = query.log.decide(0, results)
    for entry in state.handles:
        query.committer.commit(entry.handle)
    query.committer.completeBatch(SINK, 0, [e.handle for e in state.handles])
    version = query.deltaTable().version()

    query.restart()
    query.coordinator.recover(1)

    assert query.deltaTable().version() == version, "the batch found in the table, not added again"
    assert query.ids() == expected(0)
    assert query.log.outstanding() == []


def test_partitioned_table_holds_the_partition_values_in_its_log(tmp_path: Path) -> None:
    query = Query(tmp_path, partitionBy="day")
    query.run(0)

    table = query.deltaTable()
    assert table.metadata().partition_columns == ["day"]
    assert query.ids() == expected(0)
    rows = table.to_pyarrow_table().to_pylist()
    assert {r["day"] for r in rows} == {"a:b c", "d1", "d2"}
    assert all(r["day"] == ("a:b c" if r["id"] % 3 == 0 else f"d{r['id'] % 3}") for r in rows)
    chosen = table.to_pyarrow_table(filters=[("day", "=", "a:b c")])
    assert sorted(chosen.column("id").to_pylist()) == [i for i in rowsOf(0) if i % 3 == 0]


def test_another_writer_and_a_compaction_between_batches(tmp_path: Path) -> None:
    """Another writer appending, an optimize rewriting the files and a vacuum deleting the old
    ones: the sink's later batches and a replay of an earlier one stay exactly once."""
    query = Query(tmp_path)
    query.run(0)
    deltalake.write_deltalake(query.table, batchOf([-1, -2]), mode="append")
    results = query.tasks(1)
    table = query.deltaTable()
    table.optimize.compact()
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    query.coordinator.commitBatch(1, results)  # prepared before the compaction and vacuum

    query.restart()
    query.coordinator.recover(1)
    query.coordinator.commitBatch(1, query.tasks(1, attempt=1))  # replayed after them

    assert query.ids() == sorted([-2, -1, *expected(0, 1)])


def test_a_stream_that_does_not_match_the_table_is_refused_before_writing(tmp_path: Path) -> None:
    table = str(tmp_path / "table")
    deltalake.write_deltalake(table, pa.table({"id": pa.array([1], pa.int32())}))

    with pytest.raises(DeltaTableError, match="stream's columns do not match") as caught:
        ensureTable(table, SCHEMA, None, True)
    assert "id int" in str(caught.value) and "select and cast" in str(caught.value)
    with pytest.raises(DeltaTableError, match="createTable"):
        ensureTable(str(tmp_path / "none"), SCHEMA, None, False)
    assert not os.path.exists(tmp_path / "none")
    with pytest.raises(DeltaTableError, match="partitionBy='day' differs"):
        deltalake.write_deltalake(str(tmp_path / "t2"), batchOf([1]))
        ensureTable(str(tmp_path / "t2"), SCHEMA, ["day"], True)


def test_tables_whose_rules_a_file_writer_would_skip_are_refused(tmp_path: Path) -> None:
    constrained = str(tmp_path / "constrained")
    deltalake.write_deltalake(constrained, batchOf([1]))
    deltalake.DeltaTable(constrained).alter.add_constraint({"positive": "id > 0"})
    with pytest.raises(DeltaTableError, match="CHECK constraints"):
        ensureTable(constrained, SCHEMA, None, True)

    mapped = str(tmp_path / "mapped")
    deltalake.DeltaTable.create(
        mapped,
        SCHEMA.set(2, pa.field("at", pa.timestamp("us", tz="UTC"))),
        configuration={"delta.columnMapping.mode": "name"},
    )
    with pytest.raises(DeltaTableError, match="column mapping"):
        ensureTable(mapped, SCHEMA, None, True)


def test_options_and_what_the_checkpoint_keeps(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="option path is required"):
        DeltaSettings.fromOptions({})
    with pytest.raises(ValueError, match="gs:// is not supported"):
        DeltaSettings.fromOptions({"path": "gs://bucket/table"})
    with pytest.raises(ValueError, match="createTable='maybe'"):
        DeltaSettings.fromOptions({"path": str(tmp_path), "createTable": "maybe"})
    options = {
        "path": str(tmp_path / "t"),
        "partitionBy": "day",
        "checkpointLocation": str(tmp_path / "cp"),
        "compression": "zstd",
    }
    settings = DeltaSettings.fromOptions(options)
    assert settings.files.format == "parquet" and settings.files.compression == "zstd"
    from twophase.spark.declared import DeltaSink

    kept = publicOptions(options, DeltaSink.safeOptions)
    assert json.loads(json.dumps(kept)) == {k: v for k, v in options.items()}


def test_doctor_finds_a_decided_batch_and_recover_commits_it_to_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """From the checkpoint alone, as an operator would: ``twophase doctor`` names the decided,
    unfinished batch, ``twophase recover`` moves its files and makes its Delta commit."""
    from twophase import cli
    from twophase.settings import SinkSettings
    from twophase.spark.declared import DeltaSink
    from twophase.spark.driver import describeSink

    table = str(tmp_path / "table")
    sink = DeltaSink({"path": table, "checkpointLocation": str(tmp_path / "ckpt")})
    settings = SinkSettings.fromOptions(sink.options, sink.name())
    describeSink(sink, settings)
    ensureTable(table, SCHEMA, None, True)
    log = DecisionLog(settings.logLocation)
    log.claim(settings.sinkId, QUERY)
    writer = sink.createWriter()
    results = []
    for p in range(2):
        ctx = TransactionContext(settings.sinkId, QUERY, 0, p, 0)
        txn = writer.beginTransaction(ctx)
        writer.write(txn, batchOf(rowsOf(0)[p::2]))
        results.append(TaskResult(settings.sinkId, QUERY, 0, p, 0, writer.preCommit(txn), 50))
    state = log.decide(0, results)
    sink.createCommitter().commit(state.handles[0].handle)  # one moved, then the driver died

    assert cli.main(["doctor", "--checkpoint", str(tmp_path / "ckpt"), "--json"]) == 1
    [found] = json.loads(capsys.readouterr().out)["sinks"]
    assert found["system"] == "delta"
    assert [f["finding"] for f in found["findings"]] == ["decided-unfinished"]
    assert deltalake.DeltaTable(table).to_pyarrow_table().num_rows == 0

    assert cli.main(["recover", "--checkpoint", str(tmp_path / "ckpt")]) == 0
    ids = deltalake.DeltaTable(table).to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids) == expected(0)
    assert deltalake.DeltaTable(table).transaction_version(f"twophase-{settings.sinkId}") == 0
