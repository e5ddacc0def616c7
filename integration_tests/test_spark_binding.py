"""How the Spark binding drives a sink: the tasks that write a batch, and PySpark's calls.

``twophase.foreachBatch`` writes a batch of many partitions with few tasks, exactly once.
The default writes with one task per task slot, whatever the batch's partitions; each task
reports the input partitions its transaction holds. After a decided batch lost transactions
(Kafka's timeout while the query was down), the replay writes exactly those inputs again,
however Spark groups the partitions this time: the test changes ``writerTasks`` between the runs
and SIGKILLs an executor during the rewrite, on a local cluster of two executors, through
``twophase.multi`` into Kafka and PostgreSQL's staged path. ``format()`` warns once per run
when a batch had many more tasks than slots, and relies on the order in which PySpark calls a
stream writer (planned when pickled for the tasks, never pickled to commit): a test here fails
the day a PySpark version changes it. The quick cases share one in-process session.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import twophase
from integration_tests.spark_harness import FOREACH_BATCH, Harness
from integration_tests.spark_processes import sharedSession
from integration_tests.test_kafka_helpers import createTopic, privateBroker
from integration_tests.test_kafka_spark import awaitOutage, openTransactions, rewriteRecords
from integration_tests.test_multi import SINK_SPEC, kafkaIds, multiOptions, pgIds, preparedGids
from twophase.coordinator import DecisionLog
from twophase.settings import SinkSettings, TwoPhaseConfigError
from twophase.spark import task_advice
from twophase.spark.declared import FilesSink
from twophase.spark.stream_writer import TwoPhaseStreamWriter

PARTITIONS = 24


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from sharedSession("twophase-spark-binding")


def runFiles(spark: Any, tmp: Path, name: str, **options: str) -> tuple[Path, Path]:
    """Three batches of 600 rows in ``PARTITIONS`` partitions into ``twophase.files`` through
    ``twophase.foreachBatch("twophase.files", ...)``; returns (output, checkpoint)."""
    out, ckpt = tmp / f"{name}-out", tmp / f"{name}-ckpt"
    stream = (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", 600)
        .option("totalRows", 1800)
        .option("numPartitions", 4)
        .load()
        .repartition(PARTITIONS, "id")
    )
    write = twophase.foreachBatch(
        "twophase.files", {"path": str(out), "checkpointLocation": str(ckpt), **options}
    )
    query = (
        stream.writeStream.foreachBatch(write)
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return out, ckpt


def decidedHandles(ckpt: Path) -> list[list[dict[str, Any]]]:
    """The handles of each batch's decision, in batch order."""
    log = DecisionLog(str(next((ckpt / "twophase").iterdir())))
    states = [log.state(b) for b in log.committedBatchIds()]
    return [[h.toJson() for h in s.handles] for s in states if s is not None]


def test_by_default_one_task_per_slot_writes_each_batch_and_names_its_inputs(
    spark: Any, tmp_path: Path
) -> None:
    out, ckpt = runFiles(spark, tmp_path, "default")
    ids = sorted(pq.read_table(out).column("id").to_pylist())
    assert ids == list(range(1800))
    batches = decidedHandles(ckpt)
    assert len(batches) == 3
    for handles in batches:
        assert len(handles) == spark.sparkContext.defaultParallelism == 2
        inputs = sorted(i for h in handles for i in h["inputs"])
        assert inputs == list(range(PARTITIONS)), "every input partition in exactly one task"
        assert sum(len(h["handle"]["files"]) for h in handles) == 2, "one file per task"


def test_writer_tasks_sets_the_count_and_input_keeps_the_partitions(
    spark: Any, tmp_path: Path
) -> None:
    _, three = runFiles(spark, tmp_path, "three", writerTasks="3")
    assert [len(h) for h in decidedHandles(three)] == [3, 3, 3]
    out, kept = runFiles(spark, tmp_path, "input", writerTasks="input")
    batches = decidedHandles(kept)
    assert [len(h) for h in batches] == [PARTITIONS] * 3
    assert all(h["inputs"] == [h["partitionId"]] for hs in batches for h in hs if h["inputs"])
    assert sorted(pq.read_table(out).column("id").to_pylist()) == list(range(1800))


def test_bad_writer_tasks_and_names_are_refused_before_anything_is_written(
    spark: Any, tmp_path: Path
) -> None:
    options = {"path": str(tmp_path / "o"), "checkpointLocation": str(tmp_path / "c")}
    with pytest.raises(TwoPhaseConfigError, match="writerTasks='-2' must be a number of tasks"):
        twophase.foreachBatch("twophase.files", {**options, "writerTasks": "-2"})
    with pytest.raises(TwoPhaseConfigError, match="built-in sinks are twophase.delta, twophase.f"):
        twophase.foreachBatch("twophase.sequence", options)
    stream = (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", 10)
        .option("totalRows", 10)
        .load()
    )
    query = (
        stream.writeStream.format("twophase.files")
        .options(**options, writerTasks="2")
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match="writerTasks applies to twophase.foreachBatch only"):
        query.awaitTermination()
    assert not (tmp_path / "o").exists()


def test_format_warns_once_per_run_when_a_batch_had_many_more_tasks_than_slots(
    spark: Any, tmp_path: Path
) -> None:
    def start(frame: Any, name: str) -> Any:
        return (
            frame.writeStream.format("twophase.files")
            .option("path", str(tmp_path / f"{name}-out"))
            .option("checkpointLocation", str(tmp_path / f"{name}-ckpt"))
            .trigger(availableNow=True)
            .start()
        )

    stream = (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", 600)
        .option("totalRows", 1200)
        .load()
        .repartition(PARTITIONS, "id")
    )
    many = start(stream, "many")
    many.awaitTermination()
    log = next((tmp_path / "many-ckpt" / "twophase").iterdir())
    notice = json.loads((log / task_advice.NOTICE_FILE).read_text())
    assert notice == {"runId": str(many.runId), "batchId": 0}, "told at the first batch, once"
    few = start(stream.coalesce(2), "few")
    few.awaitTermination()
    assert not list((tmp_path / "few-ckpt").rglob(task_advice.NOTICE_FILE))


def test_pyspark_plans_by_pickling_the_writer_and_commits_with_one_never_pickled(
    spark: Any, tmp_path: Path
) -> None:
    """What twophase.spark.stream_writer relies on: the planner pickles the writer for the
    tasks (so the batch is planned, recovery included, before any task), the tasks get that
    planned writer, and the commit worker builds its own writer and never pickles it."""
    events = str(tmp_path / "events")

    def note(what: str, planned: bool) -> None:
        with open(events, "a") as f:
            f.write(f"{what} {os.getpid()} {planned}\n")

    class RecordingWriter(TwoPhaseStreamWriter):
        def __getstate__(self) -> dict[str, Any]:
            note("pickled", self.plan is not None)
            return super().__getstate__()

        def write(self, iterator: Any) -> Any:
            note("write", self.plan is not None)
            return super().write(iterator)

        def commit(self, messages: Any, batchId: int) -> None:
            note("commit", self.plan is not None)
            super().commit(messages, batchId)

    class RecordingFiles(FilesSink):
        @classmethod
        def name(cls) -> str:
            return "it.recording-files"

        def streamWriter(self, schema: Any, overwrite: bool) -> TwoPhaseStreamWriter:
            settings = SinkSettings.fromOptions(self.options, self.name())
            return RecordingWriter(self, settings, schema, "run")

    spark.dataSource.register(RecordingFiles)
    query = (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", 100)
        .option("totalRows", 200)
        .load()
        .writeStream.format("it.recording-files")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seen = [line.split() for line in Path(events).read_text().splitlines()]
    kinds = [what for what, _, _ in seen]
    assert kinds.count("commit") == 2 and "write" in kinds, seen
    assert kinds.index("pickled") < kinds.index("write"), "planned before any task"
    assert all(planned == "True" for what, _, planned in seen if what == "write"), seen
    assert all(planned == "False" for what, _, planned in seen if what == "commit"), seen
    committers = {pid for what, pid, _ in seen if what == "commit"}
    picklers = {pid for what, pid, _ in seen if what == "pickled"}
    assert not committers & picklers, "the commit worker never pickles its writer"
    assert sorted(pq.read_table(tmp_path / "out").column("id").to_pylist()) == list(range(200))


@pytest.mark.timeout(1200)
def test_a_replay_regrouped_by_spark_writes_the_lost_transactions_inputs_exactly_once(
    tmp_path: Path, pg_url: str, pg_table: str
) -> None:
    """Two executors, 2 write tasks over 12 shuffled partitions; batch 1 decided, then the whole
    query SIGKILLed and down past Kafka's transaction timeout (10 s on a private broker). The
    restart writes with 3 tasks and loses an executor during the rewrite of batch 1: the
    PostgreSQL parts (staged) are committed from the decision, the Kafka parts from the replay,
    each holding the inputs its decided transaction held."""
    for broker in privateBroker(tmp_path, TWOPHASE_KAFKA_TXN_MAX_TIMEOUT_MS="10000"):
        topic = createTopic(broker.bootstrap, partitions=2)
        options = multiOptions(tmp_path, pg_url, pg_table, broker.bootstrap, topic)
        options.pop("checkpointLocation")
        options |= {"orders.commitMode": "staged", "writerTasks": "2"}
        h = Harness(
            tmp_path / "query",
            "local-cluster",
            sink=SINK_SPEC,
            via=FOREACH_BATCH,
            rows=3 * 60,
            rowsPerBatch=60,
            partitions=2,
            repartition=12,
            options=options,
        )
        h.crashRun("driver.afterDecision:1", onceFile=h.onceFile("-decided"))
        awaitOutage(broker.bootstrap, options["events.transactionalIdPrefix"], 25)
        decided = h.decisionLog().state(1)
        assert decided is not None and len(decided.handles) == 2
        original = {e.partitionId: e.inputs for e in decided.handles}
        assert sorted(i for inputs in original.values() for i in inputs or ()) == list(range(12))

        killed = tmp_path / "executor-killed"
        h.options |= {
            "writerTasks": "3",
            "it.killExecutorAtBatch": "1",
            "it.killExecutorOnceFile": str(killed),
        }
        h.restartUntilExhausted()
        assert killed.exists(), "no executor was killed during the rewrite"
        expected = list(range(h.rows))
        assert pgIds(pg_url, pg_table) == expected, h.describeRuns()
        assert kafkaIds(broker.bootstrap, topic) == expected, h.describeRuns()
        (rewrite,) = [r for r in rewriteRecords(h) if r["batchId"] == 1]
        assert rewrite["lost"] == [0, 1], rewrite
        replaced = {r["partitionId"]: tuple(r["inputs"]) for r in rewrite["replacements"]}
        assert replaced == original, "each replacement holds its lost transaction's inputs"
        later = h.decisionLog().state(2)
        assert later is not None and len(later.handles) == 3, "the restart wrote with 3 tasks"
        assert openTransactions(broker.bootstrap, options["events.transactionalIdPrefix"]) == []
        sinkId = next((h.checkpoint / "twophase").iterdir()).name
        assert preparedGids(pg_url, sinkId) == []
