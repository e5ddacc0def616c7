"""twophase.multi against the real PostgreSQL and Kafka: one decision, both systems or neither.

Three layers: bad options and columns refused before any task writes (no Spark session); the
participant with a Kafka part the broker aborted after the decision (the replay's Kafka part
committed, its PostgreSQL part not, so nothing twice); a Spark query killed at the protocol's
windows (a task killed between preparing its two targets, the driver between two commits), read
back from both systems. The chaos harness's `multi` pipeline goes through every other window.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from psycopg import sql
from pyspark.sql.types import LongType, StringType, StructField, StructType

from integration_tests.spark_harness import Harness
from integration_tests.spark_processes import killExecutorJvmOnce
from integration_tests.test_kafka_helpers import createTopic, readTopic, unique
from integration_tests.test_kafka_participant import state
from integration_tests.test_kafka_spark import openTransactions
from twophase.clients.postgres import PostgresUnavailableError
from twophase.coordinator import Coordinator, CoordinatorSettings, DecisionLog
from twophase.coordinator.errors import RewritePendingError
from twophase.protocol import RecoveryScope, TaskResult, TransactionContext
from twophase.settings import TwoPhaseConfigError, optionOf
from twophase.sinks.multi import MultiWriter
from twophase.spark.multi import MultiSink

SINK_SPEC = "integration_tests.test_multi:SequenceMultiSink"

ORDERS = StructType([StructField("id", LongType()), StructField("payload", StringType())])
EVENTS = StructType([StructField("key", StringType()), StructField("value", StringType())])


def multiOptions(
    tmp: Path, pgUrl: str, table: str, bootstrap: str, topic: str, **extra: str
) -> dict[str, str]:
    return {
        "targets": "orders=postgres,events=kafka",
        "orders.url": pgUrl,
        "orders.table": table,
        "orders.createTable": "true",
        "events.kafka.bootstrap.servers": bootstrap,
        "events.topic": topic,
        "events.transactionalIdPrefix": unique("it-multi"),
        "checkpointLocation": str(tmp / "checkpoint"),
        **extra,
    }


@pytest.fixture
def table(pg_table: str) -> str:
    return pg_table


def pgIds(pgUrl: str, table: str) -> list[int]:
    with psycopg.connect(pgUrl, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
        if not exists or not exists[0]:
            return []
        query = sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(table))
        return [int(row[0]) for row in conn.execute(query)]


def kafkaIds(bootstrap: str, topic: str) -> list[int]:
    return sorted(int(r.key or b"-1") for r in readTopic(bootstrap, topic))


def preparedGids(pgUrl: str, sinkId: str) -> list[str]:
    with psycopg.connect(pgUrl, autocommit=True) as conn:
        rows = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%{sinkId}%",))
        return [str(r[0]) for r in rows]


# ---------------------------------------------------------------------------------------------
# Refused before any task writes.


def test_bad_targets_and_columns_are_refused_before_anything_is_written(
    tmp_path: Path, pg_url: str, kafka_bootstrap: str, table: str
) -> None:
    topic = createTopic(kafka_bootstrap)
    good = multiOptions(tmp_path, pg_url, table, kafka_bootstrap, topic)
    for targets, expected in (
        ("", "needs option targets"),
        ("orders", "is not name=kind"),
        ("orders=postgres", "names one target"),
        ("orders=postgres,orders=kafka", "appears twice"),
        ("orders=postgres,events=mongo", "has kind 'mongo'"),
        ("orders=postgres,9events=kafka", "must be a letter"),
        ("orders=postgres,events=no.such.module:Sink", "cannot be imported"),
    ):
        with pytest.raises(TwoPhaseConfigError, match=expected):
            MultiSink({**good, "targets": targets})
    sink = MultiSink(good)
    with pytest.raises(TwoPhaseConfigError, match="target 'events' .* needs a struct column"):
        sink.validate(StructType([StructField("orders", ORDERS)]))
    with pytest.raises(TwoPhaseConfigError, match="column 'events' of target 'events' is string"):
        sink.validate(
            StructType([StructField("orders", ORDERS), StructField("events", StringType())])
        )
    noValue = StructType([StructField("key", StringType())])
    with pytest.raises(TwoPhaseConfigError, match=r"target 'events' \(kafka\).*value"):
        sink.validate(StructType([StructField("orders", ORDERS), StructField("events", noValue)]))
    # A server down is no configuration error: its own (retryable) error, naming the target.
    unreachable = MultiSink(
        {
            **good,
            "orders.url": "postgresql://nobody@127.0.0.1:1/none",
            "orders.connectRetrySeconds": "1",
        }
    )
    with pytest.raises(PostgresUnavailableError, match="is unreachable") as info:
        unreachable.validate(
            StructType([StructField("orders", ORDERS), StructField("events", EVENTS)])
        )
    assert "target 'orders' (postgres)" in " ".join(getattr(info.value, "__notes__", []))
    assert pgIds(pg_url, table) == [] and readTopic(kafka_bootstrap, topic) == []
    sink.validate(StructType([StructField("orders", ORDERS), StructField("events", EVENTS)]))


# ---------------------------------------------------------------------------------------------
# The participant: a Kafka part lost after the decision, the PostgreSQL part not.


def rows(ids: list[int]) -> pa.RecordBatch:
    idArray = pa.array(ids, pa.int64())
    payload = pa.array([f"row-{i}" for i in ids])
    orders = pa.StructArray.from_arrays([idArray, payload], names=["id", "payload"])
    events = pa.StructArray.from_arrays([pc.cast(idArray, pa.string()), payload], ["key", "value"])
    return pa.RecordBatch.from_arrays([orders, events], names=["orders", "events"])


def prepare(writer: MultiWriter, sinkId: str, ids: list[int], partition: int) -> dict[str, Any]:
    txn = writer.beginTransaction(TransactionContext(sinkId, "q", 0, partition, 0))
    writer.write(txn, rows(ids))
    return writer.preCommit(txn)


@pytest.mark.timeout(180)
def test_each_target_sets_its_own_bad_records_aside_in_the_same_decision(
    tmp_path: Path, pg_url: str, kafka_bootstrap: str, table: str
) -> None:
    """``orders.badRecords`` and ``events.badRecords``: a NULL PostgreSQL rejects and a record
    too large for the producer go to each target's dead-letter table and topic (created by
    validate), inside the parts of the one transaction; committed together by one decision."""
    topic, dead = createTopic(kafka_bootstrap), unique("it-multi-dead")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, payload text NOT NULL)").format(
                sql.Identifier(table)
            )
        )
    options = multiOptions(
        tmp_path,
        pg_url,
        table,
        kafka_bootstrap,
        topic,
        **{
            "orders.badRecords": f"{table}_rejected",
            "events.badRecords": dead,
            "events.kafka.message.max.bytes": "4000",
        },
    )
    sink = MultiSink(options)
    sink.validate(StructType([StructField("orders", ORDERS), StructField("events", EVENTS)]))
    ids = pa.array([0, 1, 2, 3], pa.int64())
    orders = pa.StructArray.from_arrays(
        [ids, pa.array(["a", None, "c", "d"])], names=["id", "payload"]
    )
    events = pa.StructArray.from_arrays(
        [pc.cast(ids, pa.string()), pa.array(["a", "b", "c" * 9000, "d"])], ["key", "value"]
    )
    writer = sink.createWriter()
    sinkId = "it-multi-aside"
    txn = writer.beginTransaction(TransactionContext(sinkId, "q", 0, 0, 0))
    writer.write(txn, pa.RecordBatch.from_arrays([orders, events], names=["orders", "events"]))
    handle = writer.preCommit(txn)
    try:
        coordinator = Coordinator(
            sink.createCommitter(),
            DecisionLog(str(tmp_path / "log")),
            sinkId,
            CoordinatorSettings(),
        )
        coordinator.commitBatch(0, [TaskResult(sinkId, "q", 0, 0, 0, handle, 4)])
        assert pgIds(pg_url, table) == [0, 2, 3] and kafkaIds(kafka_bootstrap, topic) == [0, 1, 3]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            aside = conn.execute(
                sql.SQL("SELECT record ->> 'id', error_column FROM {}").format(
                    sql.Identifier(f"{table}_rejected")
                )
            ).fetchall()
        assert aside == [("1", "payload")]
        assert [r.key for r in readTopic(kafka_bootstrap, dead)] == [b"2"]
        assert preparedGids(pg_url, sinkId) == []
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(f"{table}_rejected"))
            )


@pytest.mark.timeout(180)
def test_kafka_and_a_delta_table_in_one_decision_across_a_driver_death(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """``events=kafka,orders=delta``: the driver dies after committing one task's parts (its
    Kafka transaction ended, its files moved into the table, no Delta commit); the restart's
    recovery commits the rest and makes the batch's one Delta commit, and Spark's replay of
    the batch adds nothing to either."""
    deltalake = pytest.importorskip("deltalake")
    topic, path = createTopic(kafka_bootstrap), str(tmp_path / "orders")
    options = {
        "targets": "orders=delta,events=kafka",
        "orders.path": path,
        "events.kafka.bootstrap.servers": kafka_bootstrap,
        "events.topic": topic,
        "events.transactionalIdPrefix": unique("it-multi-delta"),
        "checkpointLocation": str(tmp_path / "checkpoint"),
    }
    sink = MultiSink(options)
    sink.validate(StructType([StructField("orders", ORDERS), StructField("events", EVENTS)]))
    sinkId = "it-multi-delta"
    handles = [
        prepare(sink.createWriter(), sinkId, [p * 10 + i for i in range(10)], p) for p in (0, 1)
    ]
    results = [TaskResult(sinkId, "q", 0, p, 0, h, 10) for p, h in enumerate(handles)]
    log = DecisionLog(str(tmp_path / "log"))
    state = log.decide(0, results)
    sink.createCommitter().commit(state.handles[0].handle)  # then the driver died

    assert kafkaIds(kafka_bootstrap, topic) == list(range(10))
    assert deltalake.DeltaTable(path).to_pyarrow_table().num_rows == 0, "no Delta commit yet"

    coordinator = Coordinator(sink.createCommitter(), log, sinkId, CoordinatorSettings())
    coordinator.recover(1)
    coordinator.commitBatch(0, results)  # Spark's replay of batch 0 finds it committed

    table = deltalake.DeltaTable(path)
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == list(range(20))
    assert table.version() == 1, "the table's creation, then one commit for the batch"
    assert kafkaIds(kafka_bootstrap, topic) == list(range(20))


def test_postgres_and_an_iceberg_table_in_one_decision_across_a_driver_death(
    tmp_path: Path, pg_url: str, table: str
) -> None:
    """``orders=postgres,events=iceberg``: the driver dies after committing one task's parts
    (its PostgreSQL transaction committed, its files moved under the table, no snapshot); the
    restart's recovery commits the rest and appends the batch's one snapshot, and Spark's
    replay of the batch adds nothing to either."""
    pytest.importorskip("pyiceberg")
    from twophase.sinks.iceberg import loadCatalog

    catalog = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/warehouse",
    }
    options = {
        "targets": "orders=postgres,events=iceberg",
        "orders.url": pg_url,
        "orders.table": table,
        "orders.createTable": "true",
        "events.table": "it.events",
        **{f"events.catalog.{key}": value for key, value in catalog.items()},
        "checkpointLocation": str(tmp_path / "checkpoint"),
    }
    sink = MultiSink(options)
    sink.validate(StructType([StructField("orders", ORDERS), StructField("events", EVENTS)]))
    sinkId = "it-multi-iceberg"
    handles = [
        prepare(sink.createWriter(), sinkId, [p * 10 + i for i in range(10)], p) for p in (0, 1)
    ]
    results = [TaskResult(sinkId, "q", 0, p, 0, h, 10) for p, h in enumerate(handles)]
    log = DecisionLog(str(tmp_path / "log"))
    state = log.decide(0, results)
    sink.createCommitter().commit(state.handles[0].handle)  # then the driver died

    def lake() -> Any:
        return loadCatalog("default", catalog).load_table("it.events")

    assert pgIds(pg_url, table) == list(range(10))
    assert lake().current_snapshot() is None, "no snapshot yet"

    coordinator = Coordinator(sink.createCommitter(), log, sinkId, CoordinatorSettings())
    coordinator.recover(1)
    coordinator.commitBatch(0, results)  # Spark's replay of batch 0 finds it committed

    keys = lake().scan().to_arrow().column("key").to_pylist()
    assert sorted(int(k) for k in keys) == list(range(20))
    assert len(lake().snapshots()) == 1, "one snapshot for the batch"
    assert pgIds(pg_url, table) == list(range(20))


@pytest.mark.timeout(180)
def test_a_lost_kafka_part_is_rewritten_and_the_postgres_part_is_not_written_twice(
    tmp_path: Path, pg_url: str, kafka_bootstrap: str, table: str
) -> None:
    topic = createTopic(kafka_bootstrap)
    options = multiOptions(
        tmp_path,
        pg_url,
        table,
        kafka_bootstrap,
        topic,
        **{"events.kafka.transaction.timeout.ms": "3000"},
    )
    sink = MultiSink(options)
    sink.validate(StructType([StructField("orders", ORDERS), StructField("events", EVENTS)]))
    sinkId = "it-multi-sink"
    first = prepare(sink.createWriter(), sinkId, [0, 1, 2], partition=0)
    deadline = time.monotonic() + 60
    while state(kafka_bootstrap, first["parts"]["events"]["transactionalId"]) != "CompleteAbort":
        assert time.monotonic() < deadline, "the broker never aborted the Kafka part"
        time.sleep(0.5)
    logDir = tmp_path / "log"

    def coordinator() -> Coordinator:
        return Coordinator(
            sink.createCommitter(), DecisionLog(str(logDir)), sinkId, CoordinatorSettings()
        )

    result = TaskResult(sinkId, "q", 0, 0, 0, first, 3)
    with pytest.raises(RewritePendingError, match="partitions \\[0\\]"):
        coordinator().commitBatch(0, [result])
    assert pgIds(pg_url, table) == [0, 1, 2], "the decided PostgreSQL part is committed"
    assert kafkaIds(kafka_bootstrap, topic) == []
    assert coordinator().recover().awaitingRewrite == {0: (0,)}
    replay = prepare(sink.createWriter(), sinkId, [2, 0, 1], partition=0)
    coordinator().commitBatch(0, [TaskResult(sinkId, "q", 0, 0, 0, replay, 3)])
    assert pgIds(pg_url, table) == [0, 1, 2], "the replay's PostgreSQL part is aborted"
    assert kafkaIds(kafka_bootstrap, topic) == [0, 1, 2]
    assert preparedGids(pg_url, sinkId) == []
    committer = sink.createCommitter()
    assert committer.recoverAndAbort(RecoveryScope(sinkId)) == []


def test_a_users_own_sink_is_a_target_and_a_dead_attempt_is_swept_in_both(
    tmp_path: Path, pg_url: str, table: str
) -> None:
    sink = MultiSink(
        {
            "targets": "orders=postgres,notes=integration_tests.test_spark_user_sink:JsonDirSink",
            "orders.url": pg_url,
            "orders.table": table,
            "orders.createTable": "true",
            "notes.path": str(tmp_path / "notes"),
            "checkpointLocation": str(tmp_path / "checkpoint"),
        }
    )
    notes = StructType([StructField("id", LongType()), StructField("text", StringType())])
    sink.validate(StructType([StructField("orders", ORDERS), StructField("notes", notes)]))
    sinkId = "it-multi-user"

    def batch(ids: list[int]) -> pa.RecordBatch:
        idArray = pa.array(ids, pa.int64())
        text = pa.array([f"row-{i}" for i in ids])
        orders = pa.StructArray.from_arrays([idArray, text], names=["id", "payload"])
        # A null struct: that row goes to no transaction of the target.
        mask = pa.array([i % 2 == 1 for i in ids])
        notes = pa.StructArray.from_arrays([idArray, text], names=["id", "text"], mask=mask)
        return pa.RecordBatch.from_arrays([orders, notes], names=["orders", "notes"])

    def prepared(ids: list[int], partition: int, attempt: int = 0) -> dict[str, Any]:
        writer = sink.createWriter()
        txn = writer.beginTransaction(TransactionContext(sinkId, "q", 0, partition, attempt))
        writer.write(txn, batch(ids))
        return writer.preCommit(txn)

    dead = prepared([0, 1], partition=0)  # an attempt whose task died after preparing both
    live = prepared([0, 1], partition=0, attempt=1)
    other = prepared([2, 3], partition=1)
    coordinator = Coordinator(
        sink.createCommitter(), DecisionLog(str(tmp_path / "log")), sinkId, CoordinatorSettings()
    )
    report = coordinator.commitBatch(
        0, [TaskResult(sinkId, "q", 0, 0, 1, live, 2), TaskResult(sinkId, "q", 0, 1, 0, other, 2)]
    )
    assert report.handles == 2 and report.stragglersAborted == 2, report  # dead attempt, swept
    assert pgIds(pg_url, table) == [0, 1, 2, 3]
    written = sorted((tmp_path / "notes").glob("batch=0/*.jsonl"))
    texts = sorted(line for path in written for line in path.read_text().splitlines())
    assert texts == ['{"id": 0, "text": "row-0"}', '{"id": 2, "text": "row-2"}']
    assert not list((tmp_path / "notes" / ".pending").iterdir())
    assert dead["parts"]["orders"] != live["parts"]["orders"]
    assert preparedGids(pg_url, sinkId) == []


# ---------------------------------------------------------------------------------------------
# Spark: crashes at the protocol's windows, a task killed between its two targets.


class SequenceMultiSink(MultiSink):
    """``twophase.multi`` fed by the harness's sequence rows: ``orders`` = (id, payload) into
    PostgreSQL, ``events`` = (key = id, value = payload) into Kafka.

    Option ``it.killBetweenTargetsAtBatch=<N>`` with ``it.killOnceFile=<path>``: in batch N, the
    task's Python worker is SIGKILLed after its PostgreSQL part is prepared and before its Kafka
    part is, once. Option ``it.killExecutorAtBatch=<N>`` with ``it.killExecutorOnceFile=<path>``:
    in batch N, after a task wrote its first rows, the executor JVM that runs it is SIGKILLed,
    once (local-cluster only).
    """

    @classmethod
    def name(cls) -> str:
        return "it.multi-sequence"

    def validate(self, schema: StructType) -> None:
        super().validate(StructType([StructField("orders", ORDERS), StructField("events", EVENTS)]))

    def createWriter(self) -> MultiWriter:
        return SequenceMultiWriter(super().createWriter().parts, self.options)


class SequenceMultiWriter(MultiWriter):
    def __init__(self, parts: Any, options: Mapping[str, str]) -> None:
        super().__init__(parts)
        self.options = dict(options)

    def write(self, txn: Any, batch: pa.RecordBatch) -> None:
        super().write(txn, rows(batch.column("id").to_pylist()))
        killAt = optionOf(self.options, "it.killExecutorAtBatch")
        if killAt is not None and int(killAt) == txn.ctx.batchId:
            onceFile = str(optionOf(self.options, "it.killExecutorOnceFile"))
            killExecutorJvmOnce(onceFile, f"partition {txn.ctx.partitionId}")

    def preCommit(self, txn: Any) -> dict[str, Any]:
        killAt = optionOf(self.options, "it.killBetweenTargetsAtBatch")
        if killAt is not None and int(killAt) == txn.ctx.batchId:
            onceFile = str(optionOf(self.options, "it.killOnceFile"))
            try:
                os.close(os.open(onceFile, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return super().preCommit(txn)
            target, writer, open_ = txn.txns[0]
            assert target.name == "orders"
            writer.preCommit(open_)  # PostgreSQL prepared, Kafka still open
            os.kill(os.getpid(), signal.SIGKILL)
        return super().preCommit(txn)


def assertBothOrNeither(h: Harness, pgUrl: str, table: str, bootstrap: str, topic: str) -> None:
    """Nothing twice; every committed batch in both systems; nothing of an undecided one."""
    log = DecisionLog(str(next((h.checkpoint / "twophase").iterdir())))
    committed = set(log.committedBatchIds())
    decided = committed | {s.batchId for s in log.outstanding()}
    per = h.rowsPerBatch
    for name, ids in (("postgres", pgIds(pgUrl, table)), ("kafka", kafkaIds(bootstrap, topic))):
        assert len(ids) == len(set(ids)), f"{name}: duplicates"
        batches = {i // per for i in ids}
        assert committed <= batches, f"{name}: committed batches {committed - batches} missing"
        assert batches <= decided, f"{name}: undecided batches {batches - decided} visible"


@pytest.mark.timeout(1200)
def test_a_task_and_a_driver_killed_mid_batch_leave_each_batch_in_both_systems_or_neither(
    tmp_path: Path, pg_url: str, kafka_bootstrap: str, table: str
) -> None:
    topic = createTopic(kafka_bootstrap, partitions=2)
    options = multiOptions(tmp_path, pg_url, table, kafka_bootstrap, topic)
    options.pop("checkpointLocation")
    options["orders.maxPreparedPartitions"] = "1"  # partition 0 prepares, partition 1 stages
    options["it.killBetweenTargetsAtBatch"] = "1"
    options["it.killOnceFile"] = str(tmp_path / "killed-between")
    h = Harness(
        tmp_path / "query", "local", sink=SINK_SPEC, rows=5 * 20, rowsPerBatch=20, options=options
    )
    # Batch 1: a task killed between its targets (Spark retries it). Batch 2: the driver killed
    # between the commits of its two partitions. The other driver windows, with server kills,
    # are the chaos harness's `multi` pipeline.
    h.crashRun("driver.betweenCommits:2", onceFile=h.onceFile("-between"))
    assertBothOrNeither(h, pg_url, table, kafka_bootstrap, topic)
    assert (tmp_path / "killed-between").exists(), "no task was killed between its targets"
    h.restartUntilExhausted()
    expected = list(range(h.rows))
    assert pgIds(pg_url, table) == expected, h.describeRuns()
    assert kafkaIds(kafka_bootstrap, topic) == expected, h.describeRuns()
    prefix = options["events.transactionalIdPrefix"]
    assert openTransactions(kafka_bootstrap, prefix) == []
    sinkId = next((h.checkpoint / "twophase").iterdir()).name
    assert preparedGids(pg_url, sinkId) == []
