"""The Iceberg sink against real pyiceberg tables (SQL catalog on SQLite, local warehouse),
without Spark.

The tasks' writer and the driver's coordinator and committer are plain Python: each test drives
them as Spark would (or as a crash leaves them) and reads the table back through pyiceberg and
polars, which see only what the current snapshot's manifests name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest

from twophase.coordinator import Coordinator, CoordinatorSettings, DecisionLog
from twophase.protocol import TaskResult, TransactionContext, TransactionLostError
from twophase.redaction import publicOptions
from twophase.sinks.files import FilesWriter
from twophase.sinks.iceberg import (
    LOCATION_OPTION,
    IcebergCommitter,
    IcebergSettings,
    IcebergTableError,
    ensureTable,
    loadCatalog,
)
from twophase.sinks.iceberg.table import appendFiles, batchProperty

pyiceberg = pytest.importorskip("pyiceberg")
pytestmark = pytest.mark.filterwarnings("ignore:Iceberg scan planning with the polars_iceberg")
from pyiceberg.exceptions import CommitFailedException  # noqa: E402

SINK = "iceberg-sink"
QUERY = "query-1"
NAME = "analytics.events"
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("at", pa.timestamp("us", tz="Europe/Paris")),
        ("day", pa.string()),
    ]
)


def catalogOptions(tmp_path: Path) -> dict[str, str]:
    return {
        "catalog.type": "sql",
        "catalog.uri": f"sqlite:///{tmp_path}/catalog.db",
        "catalog.warehouse": f"file://{tmp_path}/warehouse",
    }


class Query:
    """One streaming query into one Iceberg table: its checkpoint, its tasks and its driver."""

    def __init__(self, tmp_path: Path, **options: str) -> None:
        self.options: dict[str, str] = {"table": NAME, **catalogOptions(tmp_path), **options}
        settings = IcebergSettings.fromOptions(self.options)
        self.catalog = loadCatalog(settings.catalogName, settings.catalog)
        table = ensureTable(
            self.catalog,
            NAME,
            SCHEMA,
            settings.partitionBy if settings.partitionGiven else None,
            settings.createTable,
        )
        self.options[LOCATION_OPTION] = table.location()  # what the driver hands the tasks
        self.url = str(tmp_path / "checkpoint" / "twophase" / SINK)
        self.restart()

    def restart(self) -> None:
        """A new driver process: a new committer and coordinator over the same log."""
        self.committer = IcebergCommitter(IcebergSettings.fromOptions(self.options))
        self.log = DecisionLog(self.url)
        settings = CoordinatorSettings(retryInitialSeconds=0.001, retryMaxSeconds=0.01)
        self.coordinator = Coordinator(self.committer, self.log, SINK, settings)

    def tasks(self, batchId: int, partitions: int = 3, attempt: int = 0) -> list[TaskResult]:
        """Batch N's tasks: each writes its share of the batch's rows and prepares."""
        writer = FilesWriter(IcebergSettings.fromOptions(self.options).files)
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

    def table(self) -> Any:
        return self.catalog.load_table(NAME)

    def snapshots(self) -> int:
        return len(self.table().snapshots())

    def ids(self) -> list[int]:
        """The table's ids through pyiceberg, checked against polars."""
        table = self.table()
        ids = sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
        assert sorted(pl.scan_iceberg(table).select("id").collect()["id"].to_list()) == ids
        return ids


def rowsOf(batchId: int) -> list[int]:
    return list(range(batchId * 100, batchId * 100 + 100))


def batchOf(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([f"n{i}" if i % 7 else None for i in ids], pa.string()),
            pa.array([i * 1_000_000 for i in ids], pa.timestamp("us", tz="Europe/Paris")),
            pa.array([dayOf(i) for i in ids], pa.string()),
        ],
        schema=SCHEMA,
    )


def dayOf(i: int) -> str | None:
    return None if i % 10 == 5 else "a:b c" if i % 3 == 0 else f"d{i % 3}"


def expected(*batches: int) -> list[int]:
    return sorted(i for b in batches for i in rowsOf(b))


def test_one_snapshot_per_batch_with_the_batch_in_the_table(tmp_path: Path) -> None:
    query = Query(tmp_path)
    query.run(0)
    query.run(1, partitions=5)

    table = query.table()
    assert query.snapshots() == 2, "one snapshot per batch, not one per task"
    assert table.properties[batchProperty(SINK)] == "1"
    summary = table.current_snapshot().summary
    assert summary["twophase.batchId"] == "1" and summary["twophase.sinkId"] == SINK
    assert summary["added-records"] == "100" and summary["added-data-files"] == "5"
    assert query.ids() == expected(0, 1)
    rows = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert rows[7]["name"] is None and rows[8]["name"] == "n8"
    assert rows[8]["at"].timestamp() == 8.0
    assert str(table.schema().find_field("at").field_type) == "timestamptz"


def test_a_replayed_batch_is_found_in_the_table_and_adds_nothing(tmp_path: Path) -> None:
    query = Query(tmp_path)
    query.run(0)

    query.restart()
    query.coordinator.recover(0)
    query.coordinator.commitBatch(0, query.tasks(0, attempt=1))  # Spark's replay of batch 0

    assert query.snapshots() == 1
    assert query.ids() == expected(0)


def test_crash_after_the_files_moved_before_the_snapshot(tmp_path: Path) -> None:
    """Decided, every handle committed (files in the table's data directory), no snapshot yet:
    the files are invisible, and the restart's recovery appends them in one snapshot."""
    query = Query(tmp_path)
    query.run(0)
    results = query.tasks(1)
    state = query.log.decide(1, results)
    for entry in state.handles:
        query.committer.commit(entry.handle)
    assert query.ids() == expected(0), "moved files that no manifest names are invisible"

    query.restart()
    query.coordinator.recover(2)

    assert query.ids() == expected(0, 1)
    assert query.table().properties[batchProperty(SINK)] == "1"
    assert query.log.outstanding() == []


def test_crash_after_the_snapshot_before_committed_is_logged(tmp_path: Path) -> None:
    query = Query(tmp_path)
    results = query.tasks(0)
    state = query.log.decide(0, results)
    for entry in state.handles:
        query.committer.commit(entry.handle)
    query.committer.completeBatch(SINK, 0, [e.handle for e in state.handles])

    query.restart()
    query.coordinator.recover(1)

    assert query.snapshots() == 1, "the batch found in the table, not appended again"
    assert query.ids() == expected(0)
    assert query.log.outstanding() == []


def test_partitioned_table_holds_the_partition_values_in_its_manifests(tmp_path: Path) -> None:
    query = Query(tmp_path, partitionBy="day")
    query.run(0)

    table = query.table()
    assert [f.name for f in table.spec().fields] == ["day"]
    partitions = table.inspect.partitions().to_pylist()
    assert {p["partition"]["day"] for p in partitions} == {"a:b c", "d1", "d2", None}
    assert query.ids() == expected(0)
    chosen = table.scan(row_filter="day = 'a:b c'").plan_files()
    assert len(list(chosen)) == 1, "pruned to the partition's file (task 0 wrote its rows)"
    rows = table.scan(row_filter="day = 'a:b c'").to_arrow().column("id").to_pylist()
    assert sorted(rows) == [i for i in rowsOf(0) if dayOf(i) == "a:b c"]
    nulls = table.scan(row_filter="day is null").to_arrow().column("id").to_pylist()
    assert sorted(nulls) == [i for i in rowsOf(0) if dayOf(i) is None]


def test_another_writer_and_snapshot_expiry_between_prepare_and_commit(tmp_path: Path) -> None:
    """Another writer appending and the old snapshots expired while a batch is prepared: the
    batch commits on top of them, and a replay of it (the property survives expiry) adds
    nothing."""
    query = Query(tmp_path)
    query.run(0)
    results = query.tasks(1)
    other = pa.Table.from_batches([batchOf([-1, -2])]).cast(query.table().schema().as_arrow())
    query.table().append(other)
    table = query.table()
    table.maintenance.expire_snapshots().by_id(table.snapshots()[0].snapshot_id).commit()
    query.coordinator.commitBatch(1, results)

    query.restart()
    query.coordinator.recover(1)
    query.coordinator.commitBatch(1, query.tasks(1, attempt=1))  # replayed after them

    assert query.ids() == sorted([-2, -1, *expected(0, 1)])


def test_a_commit_racing_another_never_appends_on_top_of_it(tmp_path: Path) -> None:
    """Two processes finishing the same decided batch (a driver and ``twophase recover``): the
    loser's catalog commit fails instead of pyiceberg appending again on top of the winner's
    snapshot, and its retry finds the batch in the table."""
    query = Query(tmp_path)
    results = query.tasks(0)
    state = query.log.decide(0, results)
    for entry in state.handles:
        query.committer.commit(entry.handle)
    handles = [e.handle for e in state.handles]
    paths = [p for h in handles for p in query.committer.dataFiles(h)]
    stale = query.table()
    query.committer.completeBatch(SINK, 0, handles)  # the winner

    with pytest.raises(CommitFailedException):
        appendFiles(stale, SINK, 0, paths)  # the loser, with the table it read before
    query.committer.completeBatch(SINK, 0, handles)  # its retry

    assert query.snapshots() == 1 and query.ids() == expected(0)


def test_a_data_file_deleted_before_its_commit_is_a_lost_batch(tmp_path: Path) -> None:
    query = Query(tmp_path)
    state = query.log.decide(0, query.tasks(0))
    for entry in state.handles:
        query.committer.commit(entry.handle)
    first = query.committer.dataFiles(state.handles[0].handle)[0]
    os.remove(first.removeprefix("file://"))  # an orphan-file cleanup with no grace period

    with pytest.raises(TransactionLostError, match="gone from the Iceberg table"):
        query.committer.completeBatch(SINK, 0, [e.handle for e in state.handles])
    assert query.snapshots() == 0


def test_a_stream_that_does_not_match_the_table_is_refused_before_writing(tmp_path: Path) -> None:
    catalog = loadCatalog("t", {k[8:]: v for k, v in catalogOptions(tmp_path).items()})
    catalog.create_namespace("ns")
    catalog.create_table("ns.small", pa.schema([("id", pa.int32())]))

    with pytest.raises(IcebergTableError, match="stream's columns do not match") as caught:
        ensureTable(catalog, "ns.small", SCHEMA, None, True)
    assert "id int" in str(caught.value) and "select and cast" in str(caught.value)
    with pytest.raises(IcebergTableError, match="createTable"):
        ensureTable(catalog, "ns.none", SCHEMA, None, False)
    assert catalog.list_tables("ns") == [("ns", "small")]

    ensureTable(catalog, "ns.plain", SCHEMA, None, True)
    with pytest.raises(IcebergTableError, match="partitionBy='day' differs"):
        ensureTable(catalog, "ns.plain", SCHEMA, ["day"], True)

    required = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    catalog.create_table("ns.required", required)
    with pytest.raises(IcebergTableError, match="required columns id"):
        ensureTable(catalog, "ns.required", pa.schema([("id", pa.int64())]), None, True)

    from pyiceberg.transforms import DayTransform

    zoned = pa.schema([("id", pa.int64()), ("at", pa.timestamp("us", tz="UTC"))])
    daily = catalog.create_table("ns.daily", zoned)
    with daily.update_spec() as spec:
        spec.add_field("at", DayTransform(), "at_day")
    with pytest.raises(IcebergTableError, match=r"day\(at\).*identity partitions only"):
        ensureTable(catalog, "ns.daily", zoned, None, True)


def test_options_and_what_the_checkpoint_keeps(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="option table is required"):
        IcebergSettings.fromOptions({})
    with pytest.raises(ValueError, match="must be <namespace>.<name>"):
        IcebergSettings.fromOptions({"table": "events"})
    with pytest.raises(ValueError, match="createTable='maybe'"):
        IcebergSettings.fromOptions({"table": NAME, "createTable": "maybe"})
    with pytest.raises(ValueError, match="gs:// is not supported"):
        IcebergSettings.fromOptions({"table": NAME}).filesAt("gs://bucket/wh/t")
    from twophase.spark.iceberg import IcebergSink

    secret = "s3cr3t-Pa55"
    options = {
        "table": NAME,
        "catalog.type": "sql",
        "catalog.uri": f"postgresql+psycopg://twophase:{secret}@localhost:5432/catalog",
        "catalog.warehouse": "s3://bucket/warehouse",
        "catalog.s3.secret-access-key": secret,
        "fs.secret": secret,
        "partitionBy": "day",
        "compression": "zstd",
        "checkpointLocation": str(tmp_path / "cp"),
    }
    settings = IcebergSettings.fromOptions(options)
    assert settings.catalog["s3.secret-access-key"] == secret
    files = settings.filesAt("s3://bucket/warehouse/analytics/events")
    assert files.path == "s3://bucket/warehouse/analytics/events/data"
    assert files.compression == "zstd" and files.tableFiles
    kept = publicOptions(options, IcebergSink.safeOptions)
    kept = {k: IcebergSink.publicOptionValue(k, v) for k, v in kept.items()}
    assert secret not in json.dumps(kept)
    assert kept["catalog.uri"] == "postgresql+psycopg://twophase@localhost:5432/catalog"
    assert set(kept) == {
        "table",
        "catalog.type",
        "catalog.uri",
        "catalog.warehouse",
        "partitionBy",
        "compression",
        "checkpointLocation",
    }
    sqlite = f"sqlite:///{tmp_path}/catalog.db"
    assert IcebergSink.publicOptionValue("catalog.uri", sqlite) == sqlite


def test_doctor_finds_a_decided_batch_and_recover_commits_it_to_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """From the checkpoint alone, as an operator would: ``twophase doctor`` names the decided,
    unfinished batch, ``twophase recover`` moves its files and appends its snapshot."""
    from twophase import cli
    from twophase.settings import SinkSettings
    from twophase.spark.driver import describeSink
    from twophase.spark.iceberg import IcebergSink

    options = {
        "table": NAME,
        **catalogOptions(tmp_path),
        "checkpointLocation": str(tmp_path / "ckpt"),
    }
    sink = IcebergSink(dict(options))
    settings = SinkSettings.fromOptions(sink.options, sink.name())
    catalog = loadCatalog("default", {k[8:]: v for k, v in catalogOptions(tmp_path).items()})
    table = ensureTable(catalog, NAME, SCHEMA, None, True)
    sink.options[LOCATION_OPTION] = table.location()
    describeSink(sink, settings)
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
    assert found["system"] == "iceberg"
    assert [f["finding"] for f in found["findings"]] == ["decided-unfinished"]
    assert catalog.load_table(NAME).current_snapshot() is None

    assert cli.main(["recover", "--checkpoint", str(tmp_path / "ckpt")]) == 0
    table = catalog.load_table(NAME)
    ids = table.scan().to_arrow().column("id").to_pylist()
    assert sorted(ids) == expected(0)
    assert table.properties[batchProperty(settings.sinkId)] == "0"


def test_a_catalog_that_cannot_be_reached_is_a_transient_commit_error(tmp_path: Path) -> None:
    """The commit's retries (and, past them, the restart) handle a catalog database that does
    not answer; the error names the table and never the catalog's password."""
    from twophase.protocol import TransientCommitError

    settings = IcebergSettings.fromOptions(
        {
            "table": NAME,
            "catalog.type": "sql",
            "catalog.uri": "postgresql+psycopg://twophase:Catal0gPw@127.0.0.1:9/catalog",
            "catalog.warehouse": f"file://{tmp_path}/warehouse",
        }
    )
    with pytest.raises(TransientCommitError, match="analytics.events") as caught:
        IcebergCommitter(settings).completeBatch(SINK, 0, [])  # nothing to add: no catalog call
        IcebergCommitter(settings).table()
    assert "Catal0gPw" not in str(caught.value)


def test_a_postgres_catalog_gets_bounded_waits_unless_its_uri_sets_them() -> None:
    """libpq waits without end by default: the catalog's URI gets the sink's connectTimeout as
    libpq's connect and TCP bounds, a bound the user wrote in the URI is kept, and a SQLite
    catalog's URI is left alone."""
    from twophase.sinks.iceberg.table import _boundedUri, _isPostgres

    settings = IcebergSettings.fromOptions(
        {"table": NAME, "connectTimeout": "3", "socketTimeout": "0"}
    )
    assert (settings.connectTimeout, settings.socketTimeout) == (3, 0)
    assert IcebergSettings.fromOptions({"table": NAME}).socketTimeout == 120
    with pytest.raises(ValueError, match="connectTimeout=0 must be at least 1"):
        IcebergSettings.fromOptions({"table": NAME, "connectTimeout": "0"})
    bounded = _boundedUri("postgresql+psycopg://u:p%40ss@db:5432/cat?connect_timeout=30", 3)
    assert bounded.startswith("postgresql+psycopg://u:p%40ss@db:5432/cat?")
    assert "connect_timeout=30" in bounded and "tcp_user_timeout=3000" in bounded
    assert "keepalives=1" in bounded
    assert _isPostgres("postgresql://db/cat") and _isPostgres("postgresql+psycopg://db/cat")
    assert not _isPostgres("sqlite:////tmp/catalog.db") and not _isPostgres("")


def test_manifests_merge_and_old_snapshots_expire_with_every_row_kept(tmp_path: Path) -> None:
    """Appends merge small manifests (Iceberg's default, which pyiceberg's is not), a table the
    sink creates deletes old metadata files, and ``retainSnapshots`` expires old snapshots: the
    table stays small, every row stays, and a replay of an expired batch adds nothing."""
    query = Query(tmp_path, retainSnapshots="3")
    table = query.table()
    assert table.properties["write.metadata.delete-after-commit.enabled"] == "true"
    with table.transaction() as change:
        change.set_properties({"commit.manifest.min-count-to-merge": "3"})
    for batchId in range(7):
        query.run(batchId, partitions=2)

    table = query.table()
    assert len(table.snapshots()) < 6, "expired down to 3 once there were 6"
    assert len(table.current_snapshot().manifests(table.io)) < 7, "merged, not one per batch"
    assert query.ids() == expected(*range(7))
    query.restart()
    query.coordinator.recover(0)
    query.coordinator.commitBatch(0, query.tasks(0, attempt=1))
    assert query.ids() == expected(*range(7))
