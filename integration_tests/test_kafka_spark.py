"""twophase.kafka end to end: Spark streaming queries crashed on purpose, read back exactly once.

The queries run in child processes (``integration_tests/spark_harness.py``: its own session,
``markQueryProcessGroup``, ``TWOPHASE_CRASH_AT``) against the real broker of
``make services``. The harness feeds ``twophase.sequence`` rows (``id``, ``payload``) to a
sink; :class:`SequenceKafkaSink` is ``twophase.kafka`` with ``key = id`` and ``value =
payload``, plus one test-only fault: SIGKILL of the executor JVM in the middle of a
transaction. What a user sees is checked with a ``read_committed`` consumer: every id exactly
once, with its payload, no transaction of the sink left open.

The Kafka -> Spark -> Kafka pipeline needs the Kafka source, which the harness's child does not
have, so it runs in a small child of this module (``--pipeline``) built the same way. The
tests without a crash share one session in this process; docs/kafka.md's example with Spark's
own Kafka source runs in a process of its own, whose JVM starts with the connector.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import Producer
from kafka import KafkaAdminClient
from pyspark.sql.types import StringType, StructField, StructType

from integration_tests.conftest import ServiceControl
from integration_tests.example_runner import ExampleRunner
from integration_tests.sink_outputs import exactlyOnceReport
from integration_tests.spark_harness import Harness
from integration_tests.spark_processes import (
    FAST_JVM,
    REPO_ROOT,
    killExecutorJvmOnce,
    killSession,
    makeSparkHome,
    sharedSession,
    sparkKafkaConf,
)
from integration_tests.test_kafka_helpers import (
    Record,
    createTopic,
    privateBroker,
    readTopic,
    unique,
)
from twophase.coordinator import DecisionLog
from twophase.metrics.reading import transactionTimeoutSeconds
from twophase.settings import optionOf
from twophase.sinks.kafka import KafkaSettings, KafkaWriter
from twophase.spark.kafka import KafkaSink

SINK_SPEC = "integration_tests.test_kafka_spark:SequenceKafkaSink"


class SequenceKafkaSink(KafkaSink):
    """``twophase.kafka`` fed by the harness's sequence rows: ``key = id``, ``value = payload``.

    Option ``it.killExecutorAtBatch=<N>`` with ``it.killOnceFile=<path>``: in batch N, after the
    task's first records reached the broker (transaction open), SIGKILL the executor JVM that
    runs the task, once. Option ``it.randomPayload=true`` appends random bytes to each value,
    as a non-deterministic query would.
    """

    @classmethod
    def name(cls) -> str:
        return "it.kafka-sequence"

    def validate(self, schema: StructType) -> None:
        super().validate(
            StructType([StructField("key", StringType()), StructField("value", StringType())])
        )

    def createWriter(self) -> SequenceKafkaWriter:
        return SequenceKafkaWriter(self.settings(), self.options)


class SequenceKafkaWriter(KafkaWriter):
    """``KafkaWriter`` of sequence rows, and the test-only SIGKILL of its executor."""

    def __init__(self, settings: KafkaSettings, options: Mapping[str, str]) -> None:
        super().__init__(settings)
        self.options = dict(options)

    def write(self, txn: Any, batch: pa.RecordBatch) -> None:
        payload = batch.column("payload")
        if optionOf(self.options, "it.randomPayload") == "true":  # a non-deterministic query
            payload = pa.array([f"{p}-{os.urandom(4).hex()}" for p in payload.to_pylist()])
        converted = pa.RecordBatch.from_arrays(
            [pc.cast(batch.column("id"), pa.string()), payload],
            names=["key", "value"],
        )
        super().write(txn, converted)
        killAt = optionOf(self.options, "it.killExecutorAtBatch")
        if killAt is not None and int(killAt) == txn.ctx.batchId:
            _killExecutorOnce(txn, str(optionOf(self.options, "it.killOnceFile")))


def _killExecutorOnce(txn: Any, onceFile: str) -> None:
    if not os.path.exists(onceFile):
        txn.producer.flush(30)  # the records are in the log, the transaction open
    killExecutorJvmOnce(onceFile, txn.transactionalId)


# ---------------------------------------------------------------------------------------------
# Reading what a user sees.


def sequenceTable(records: list[Record]) -> pa.Table:
    ids = [int(r.key or b"-1") for r in records]
    payloads = [(r.value or b"").decode() for r in records]
    return pa.table({"id": pa.array(ids, pa.int64()), "payload": pa.array(payloads, pa.string())})


def openTransactions(bootstrap: str, prefix: str) -> list[str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        listing = admin.list_transactions(state_filters=["Ongoing"])
    finally:
        admin.close()
    return sorted(
        t.transactional_id
        for rows in listing.values()
        for t in rows
        if t.transactional_id.startswith(prefix + "-")
    )


class KafkaOutput:
    """What a user of the topic sees: the committed rows, and the sink's open transactions."""

    def __init__(self, bootstrap: str, topic: str, prefix: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.prefix = prefix

    def read(self, _: Path | None = None) -> pa.Table:
        return sequenceTable(readTopic(self.bootstrap, self.topic))

    def leftovers(self, _: Path | None = None) -> list[str]:
        return openTransactions(self.bootstrap, self.prefix)


def harness(
    tmp: Path, bootstrap: str, *, mode: str = "local", rows: int, perBatch: int, **options: str
) -> tuple[Harness, KafkaOutput, str]:
    topic = createTopic(bootstrap, partitions=3, prefix="it-kafka-spark")
    prefix = unique("it-spark")
    h = Harness(
        tmp / "query",
        mode,
        sink=SINK_SPEC,
        rows=rows,
        rowsPerBatch=perBatch,
        options={
            "kafka.bootstrap.servers": bootstrap,
            "topic": topic,
            "transactionalIdPrefix": prefix,
            **options,
        },
    )
    return h, KafkaOutput(bootstrap, topic, prefix), topic


def assertExactlyOnce(sink: KafkaOutput, h: Harness) -> None:
    report = exactlyOnceReport(sink.read(), h.rows)
    want = dict(rows=h.rows, duplicates=0, missing=0, unexpected=0, wrongPayloads=0)
    assert report == want, f"not exactly once: {report}\n{h.describeRuns()}"
    assert sink.leftovers() == [], "transactions of the sink left open"


def committedBatches(h: Harness) -> tuple[set[int], set[int]]:
    """(committed, decided) batch ids in the sink's decision log."""
    committed: set[int] = set()
    decided: set[int] = set()
    root = h.checkpoint / "twophase"
    for logDir in root.iterdir() if root.exists() else []:
        status = DecisionLog(str(logDir)).status()
        committed |= set(DecisionLog(str(logDir)).committedBatchIds())
        decided |= {b["batchId"] for b in status["outstanding"]}
    return committed, decided | committed


def batchIds(batches: set[int], perBatch: int) -> set[int]:
    return {i for b in batches for i in range(b * perBatch, (b + 1) * perBatch)}


def assertNothingUndecidedVisible(sink: KafkaOutput, h: Harness, window: str) -> None:
    """After a crash: no duplicate, every committed batch whole, nothing of an undecided one."""
    ids = sink.read().column("id").to_numpy()
    committed, decided = committedBatches(h)
    seen = set(ids.tolist())
    assert len(ids) == len(seen), f"after {window}: duplicates visible"
    assert batchIds(committed, h.rowsPerBatch) <= seen, f"after {window}: committed rows missing"
    assert seen <= batchIds(decided, h.rowsPerBatch), (
        f"after {window}: rows of undecided batches visible: "
        f"{sorted(seen - batchIds(decided, h.rowsPerBatch))[:10]}"
    )


# ---------------------------------------------------------------------------------------------
# Crashes of the driver, executors and the broker.

DRIVER_WINDOWS = [
    "driver.beforeDecision:1",  # tasks prepared, nothing decided
    "driver.afterDecision:2",  # decided, nothing committed
    "driver.duringRecovery",  # the restart rolled batch 2 forward, died before the sweep
    "driver.afterCommits:3",  # all committed, not marked in the log
    "driver.afterCommitted:4",  # marked, Spark's commits/ not written
]
"""The driver windows of one query's starts; ``driver.betweenCommits`` (one transaction of
the batch committed, the other open) is the crash of the Kafka -> Spark -> Kafka test."""


@pytest.mark.windows
@pytest.mark.timeout(1200)
def test_driver_sigkill_at_every_window_then_a_broker_crash_is_exactly_once(
    kafka_bootstrap: str, kafka_broker: ServiceControl, tmp_path: Path
) -> None:
    """One query, started again after each SIGKILL of its driver (``DRIVER_WINDOWS``); after
    each crash nothing undecided is visible and nothing twice; ``twophase recover`` finishes a
    crash; the last start survives a SIGKILL and restart of the broker mid-stream. (One query
    for all of it: every start of Spark costs half a minute on this machine.)"""
    h, sink, topic = harness(tmp_path, kafka_bootstrap, rows=8 * 40, perBatch=40)
    for number, window in enumerate(DRIVER_WINDOWS):
        h.crashRun(window, onceFile=h.onceFile(f"-{number}"))
        assertNothingUndecidedVisible(sink, h, window)
        if window == "driver.afterCommits:3":
            # The operator's way out without Spark: `twophase recover` finishes batch 3
            # (committing its transactions again is a no-op) and marks it committed.
            recovered = subprocess.run(
                [sys.executable, "-m", "twophase", "recover", "--checkpoint", str(h.checkpoint)],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=REPO_ROOT,
                env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
            )
            assert recovered.returncode == 0, recovered.stdout + recovered.stderr
            assert "[3]" in recovered.stdout, recovered.stdout
            visible = set(sink.read().column("id").to_numpy().tolist())
            assert batchIds({3}, h.rowsPerBatch) <= visible
            assert sink.leftovers() == []
        if window == "driver.beforeDecision:1":
            # Batch 1 is in the log, in open transactions, and invisible to read_committed.
            uncommitted = readTopic(kafka_bootstrap, topic, isolation="read_uncommitted")
            assert batchIds({1}, h.rowsPerBatch) <= {int(r.key or b"-1") for r in uncommitted}
            visible = set(sink.read().column("id").to_numpy().tolist())
            assert not batchIds({1}, h.rowsPerBatch) & visible
            assert sink.leftovers(), "the prepared transactions should be open"
    # The last start drains the source (batches 5-7); the broker dies under it.
    before = len(committedBatches(h)[0])
    runs: list[Any] = []
    worker = threading.Thread(target=lambda: runs.append(h.run()))
    worker.start()
    deadline = time.monotonic() + 400
    while worker.is_alive() and len(committedBatches(h)[0]) < before + 2:
        assert time.monotonic() < deadline, "the last start committed nothing"
        time.sleep(0.2)
    assert worker.is_alive(), "the query ended before the broker could be crashed"
    kafka_broker.kill()  # SIGKILL, mid-stream
    time.sleep(3)
    kafka_broker.start()
    worker.join(600)
    assert runs and runs[0].succeeded, "the query did not survive the broker crash: " + (
        runs[0].describe() if runs else "no run"
    )
    assert h.exhausted(), h.describeRuns()
    assertExactlyOnce(sink, h)


@pytest.mark.timeout(900)
def test_executor_jvm_sigkilled_mid_transaction_is_retried_exactly_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    once = tmp_path / "killed-executor"
    h, sink, _ = harness(
        tmp_path,
        kafka_bootstrap,
        mode="local-cluster",
        rows=4 * 50,
        perBatch=50,
        **{"it.killExecutorAtBatch": "1", "it.killOnceFile": str(once)},
    )
    h.conf["spark.task.maxFailures"] = "4"
    run = h.run()
    assert once.exists(), "the executor was never killed: " + run.describe()
    assert run.succeeded, "Spark did not recover from the lost executor: " + run.describe()
    assertExactlyOnce(sink, h)


def awaitOutage(bootstrap: str, prefix: str, seconds: float) -> None:
    """Keep the query down ``seconds`` and until the broker aborted every open transaction."""
    deadline = time.monotonic() + 120
    down = time.monotonic() + seconds
    while time.monotonic() < down or openTransactions(bootstrap, prefix):
        assert time.monotonic() < deadline, "the broker never aborted the transactions"
        time.sleep(1)


def rewriteRecords(h: Harness) -> list[dict[str, Any]]:
    return [
        json.loads(p.read_text())
        for p in sorted((h.checkpoint / "twophase").rglob("batch-*.rewrite.json"))
    ]


@pytest.mark.windows
@pytest.mark.timeout(1200)
def test_down_longer_than_the_transaction_timeout_loses_nothing(tmp_path: Path) -> None:
    """A broker whose transaction.max.timeout.ms is 10 s (so the sink's timeout is 10 s); the
    query is killed after deciding a batch and after committing half of one, and stays down
    2.5 times the timeout each time: the broker aborts the decided transactions, the restarts
    write exactly those partitions again. A replay with other records is refused clearly;
    a crash in the middle of committing the rewritten partitions is rolled forward."""
    maxTimeoutMs = 10_000
    outage = 2.5 * maxTimeoutMs / 1000
    for broker in privateBroker(tmp_path, TWOPHASE_KAFKA_TXN_MAX_TIMEOUT_MS=str(maxTimeoutMs)):
        h, sink, _ = harness(tmp_path, broker.bootstrap, rows=4 * 20, perBatch=20)
        prefix = h.options["transactionalIdPrefix"]
        # Killed right after deciding batch 1; down longer than the timeout.
        h.crashRun("driver.afterDecision:1", onceFile=h.onceFile("-decided"))
        awaitOutage(broker.bootstrap, prefix, outage)
        assert sink.read().num_rows == 20, "only batch 0 is visible"
        # A non-deterministic replay of batch 1: refused, nothing of it written.
        h.options["it.randomPayload"] = "true"
        run = h.run()
        assert not run.succeeded, run.describe()
        error = run.error + run.tail(400)
        assert "RewriteMismatchError" in error and "batch 1 was decided" in error, error
        assert "partitions [0, 1]" in error and "twophase.rewriteMismatch=write" in error
        assert sink.read().num_rows == 20 and sink.leftovers() == []
        # The deterministic replay matches; killed between the commits of its two partitions.
        del h.options["it.randomPayload"]
        h.crashRun("driver.betweenCommits:1", onceFile=h.onceFile("-rewrite"))
        # Killed after committing one of batch 2's two transactions; down again.
        h.crashRun("driver.betweenCommits:2", onceFile=h.onceFile("-half"))
        awaitOutage(broker.bootstrap, prefix, outage)
        h.restartUntilExhausted()
        assertExactlyOnce(sink, h)
        lost = {r["batchId"]: (r["lost"], len(r["replacements"])) for r in rewriteRecords(h)}
        assert lost[1] == ([0, 1], 2), lost
        assert lost[2][1] == 1 and len(lost[2][0]) == 1, f"one partition of batch 2: {lost}"
        # The timeout an operator's alert holds the oldest batch's age against is the one the
        # sink resolved from this broker.
        logs = [p for p in (h.checkpoint / "twophase").iterdir() if p.is_dir()]
        assert [transactionTimeoutSeconds(str(p)) for p in logs] == [maxTimeoutMs / 1000]


# ---------------------------------------------------------------------------------------------
# Kafka -> Spark -> Kafka.


def pipelineChild(args: argparse.Namespace) -> int:
    """One start of ``twophase.kafka`` (topic A) -> ``twophase.kafka`` (topic B)."""
    from twophase import faults

    faults.markQueryProcessGroup()
    from pyspark.sql import SparkSession

    import twophase

    spark = (
        SparkSession.builder.master("local[2,4]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", FAST_JVM)
        # A Python worker per task, gone when its task ends: prepared transactions must
        # outlive the process that opened them.
        .config("spark.python.worker.reuse", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    twophase.register(spark)
    if args.errors:
        Path(args.errors).write_text(json.dumps(badQueryErrors(spark, args)))
    query = (
        spark.readStream.format("twophase.kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.perBatch)
        # a task per topic partition: two transactions a batch, so a crash can fall between
        # their commits
        .option("minRecordsPerPartition", "0")
        .load()
        .selectExpr("key", "value")
        .writeStream.format("twophase.kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("topic", args.target)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()
    return 0


def badQueryErrors(spark: Any, args: argparse.Namespace) -> dict[str, str]:
    """How queries with bad options fail, as the user sees it (the exception's text)."""
    errors: dict[str, str] = {}
    sequence = spark.readStream.format("twophase.sequence").option("totalRows", 10).load()
    kafkaRows = sequence.selectExpr("cast(id as string) as value")
    cases = {
        "unreachable": (
            kafkaRows,
            {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t", "requestTimeoutSeconds": "3"},
        ),
        "noTopic": (kafkaRows, {"kafka.bootstrap.servers": args.bootstrap}),
        "noValue": (sequence, {"kafka.bootstrap.servers": args.bootstrap, "topic": "t"}),
        "javaOption": (
            kafkaRows,
            {
                "kafka.bootstrap.servers": args.bootstrap,
                "topic": "t",
                "kafka.ssl.truststore.location": "/x.jks",
            },
        ),
    }
    for name, (frame, options) in cases.items():
        writer = frame.writeStream.format("twophase.kafka").options(**options)
        writer = writer.option("checkpointLocation", f"{args.checkpoint}-bad-{name}")
        try:
            writer.trigger(availableNow=True).start().awaitTermination(120)
            errors[name] = "no error"
        except Exception as exc:
            errors[name] = str(exc)
    return errors


def runPipeline(
    tmp: Path,
    bootstrap: str,
    source: str,
    target: str,
    crashAt: str | None,
    errors: Path | None = None,
) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    env["SPARK_HOME"] = str(makeSparkHome(tmp / "spark-home"))
    env["PYTHONPATH"] = str(REPO_ROOT)
    for name in ("TWOPHASE_CRASH_AT", "TWOPHASE_CRASH_ONCE_FILE", "TWOPHASE_CRASH_PGID"):
        env.pop(name, None)
    if crashAt:
        env["TWOPHASE_CRASH_AT"] = crashAt
        env["TWOPHASE_CRASH_ONCE_FILE"] = str(tmp / "crashed")
    args = [sys.executable, "-m", "integration_tests.test_kafka_spark", "--pipeline"]
    args += ["--bootstrap", bootstrap, "--source", source, "--target", target]
    args += ["--checkpoint", str(tmp / "checkpoint"), "--per-batch", "40"]
    if errors is not None:
        args += ["--errors", str(errors)]
    with (tmp / "pipeline.log").open("ab") as log:
        child = subprocess.Popen(
            args,
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = child.wait(timeout=400)
        finally:
            killSession(child.pid)
    return subprocess.CompletedProcess(args, code)


def interleavedTransactions(
    bootstrap: str, topic: str, count: int, size: int, aborted: int
) -> tuple[Producer, list[str]]:
    """``count`` transactions of ``size`` records (key and value ``t<n>-r<i>``) into ``topic``,
    every third one from the ``aborted``-th aborted; the producer and the committed values."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("in")})
    producer.init_transactions(60)
    committed: list[str] = []
    for t in range(count):
        producer.begin_transaction()
        texts = [f"t{t}-r{i}" for i in range(size)]
        for text in texts:
            producer.produce(topic, text.encode(), key=text.encode())
        producer.flush(30)  # an abort racing its AddPartitionsToTxn is fatal (librdkafka)
        if t % 3 == aborted:
            producer.abort_transaction(60)
        else:
            producer.commit_transaction(60)
            committed += texts
    return producer, committed


@pytest.mark.timeout(900)
def test_kafka_to_spark_to_kafka_is_exactly_once_across_a_crash(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    source = createTopic(kafka_bootstrap, partitions=2, prefix="it-pipe-in")
    target = createTopic(kafka_bootstrap, partitions=2, prefix="it-pipe-out")
    _, expected = interleavedTransactions(kafka_bootstrap, source, 8, 20, aborted=2)
    errors = tmp_path / "errors.json"
    crashed = runPipeline(
        tmp_path, kafka_bootstrap, source, target, "driver.betweenCommits:1", errors
    )
    assert crashed.returncode == -signal.SIGKILL, (tmp_path / "pipeline.log").read_text()[-3000:]
    done = runPipeline(tmp_path, kafka_bootstrap, source, target, None)
    assert done.returncode == 0, (tmp_path / "pipeline.log").read_text()[-3000:]
    out = readTopic(kafka_bootstrap, target)
    got = sorted((r.value or b"").decode() for r in out)
    assert got == sorted(expected)  # each committed input record once, no aborted one
    assert all(r.key == r.value for r in out)
    # The same child first started queries with bad options: each failed with a clear error.
    failures = json.loads(errors.read_text())
    assert "cannot reach the cluster at 127.0.0.1:1" in failures["unreachable"]
    assert "no topic: add a 'topic' column or set .option('topic'" in failures["noTopic"]
    assert "the input needs a 'value' column" in failures["noValue"]
    assert "kafka.ssl.truststore.location" in failures["javaOption"]
    assert "kafka.ssl.ca.location" in failures["javaOption"]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from sharedSession("twophase-kafka-bad-records")


SPARK_SOURCE_SESSION = """import json
import sys

from pyspark.sql import SparkSession

builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
for key, value in json.loads(sys.argv[1]).items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
"""
"""A session with Spark's Kafka connector, ahead of the docs fragment: the packages reach a
JVM only when it starts, and this test process's JVM may have started without them."""


@pytest.mark.timeout(600)
def test_the_documented_spark_kafka_source_pipeline_writes_each_committed_record_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """docs/kafka.md, "Spark's own Kafka source into the sink": its example with this
    machine's addresses, over input that holds aborted transactions between the committed ones
    and, at its end, one still open. Started twice from the same checkpoint, in a process of
    its own: the second start adds nothing."""
    text = (REPO_ROOT / "docs" / "kafka.md").read_text()
    section = text.split("## Spark's own Kafka source into the sink", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]
    source = createTopic(kafka_bootstrap, partitions=2, prefix="it-spark-in")
    target = createTopic(kafka_bootstrap, partitions=2, prefix="it-spark-out")
    replaced = (
        code.replace('"broker1:9092,broker2:9092"', repr(kafka_bootstrap))
        .replace('"orders"', repr(source))
        .replace('"orders-upper"', repr(target))
        .replace('"/data/checkpoints/orders-upper"', repr(str(tmp_path / "checkpoint")))
    )
    assert replaced.count(repr(kafka_bootstrap)) == 2 and source in replaced, "update this test"
    producer, committed = interleavedTransactions(kafka_bootstrap, source, 6, 25, aborted=1)
    producer.begin_transaction()  # left open while the query runs
    for i in range(10):
        producer.produce(source, b"open-%d" % i, key=b"open")
    producer.flush(30)
    script = tmp_path / "spark_source_example.py"
    script.write_text(
        SPARK_SOURCE_SESSION + replaced + "query.processAllAvailable()\nquery.stop()\n"
    )
    runner = ExampleRunner(tmp_path)
    try:
        for _ in range(2):
            runner.run(script, [json.dumps(sparkKafkaConf())], {}, timeout=240)
            out = readTopic(kafka_bootstrap, target)
            assert sorted((r.value or b"").decode() for r in out) == sorted(
                text.upper() for text in committed
            )
    finally:
        runner.close()
        producer.abort_transaction(60)


def oversized(spark: Any, where: str) -> Any:
    """Three batches of 100 sequence rows as ``key``/``value``; rows ``where`` holds get a
    50,000-byte value."""
    return (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", 100)
        .option("totalRows", 300)
        .option("numPartitions", 2)
        .load()
        .selectExpr(
            "CAST(id AS STRING) AS key",
            f"CASE WHEN {where} THEN repeat('x', 50000) ELSE payload END AS value",
        )
    )


@pytest.mark.timeout(600)
def test_a_record_over_the_topic_s_limit_fails_the_query_naming_it_and_nothing_is_visible(
    spark: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Through ``twophase.foreachBatch``: the broker refuses the batch holding the record; the
    query stops naming the record's position and size, the topic's limit and the fix, and a
    read_committed reader sees batch 0 only."""
    import twophase

    topic = createTopic(kafka_bootstrap, config={"max.message.bytes": "20000"})
    checkpoint = str(tmp_path / "ckpt")
    stream = oversized(spark, "id = 163")
    write = twophase.foreachBatch(
        "twophase.kafka",
        {
            "kafka.bootstrap.servers": kafka_bootstrap,
            "topic": topic,
            "checkpointLocation": checkpoint,
        },
    )
    query = (
        stream.writeStream.foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception) as info:  # noqa: B017 - Spark's StreamingQueryException
        query.awaitTermination(240)
    message = str(info.value)
    assert "batch 1, partition" in message and f"topic {topic}" in message, message
    assert "the topic's max.message.bytes (20000 bytes)" in message
    # key "163" and the 50000-byte value; its position in the task that wrote it
    assert re.search(r"row \d+ of partition \d+ \(counting from 0\), 50003 bytes", message)
    assert "cannot fit in a batch of its own" in message and "--add-config" in message
    assert "x" * 100 not in message
    keys = sorted(int(r.key) for r in readTopic(kafka_bootstrap, topic))
    assert keys == list(range(100))  # batch 0, nothing of batch 1


@pytest.mark.timeout(600)
def test_bad_records_are_set_aside_in_a_dead_letter_topic_and_the_rest_written_once(
    spark: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """``writeStream.format("twophase.kafka")`` with ``badRecords``: the dead-letter topic is
    created at start, the two records over the producer's limit land there once each, every
    other record in the topic once, and a second start from the checkpoint adds nothing."""
    import twophase

    twophase.register(spark)
    topic, dead = createTopic(kafka_bootstrap), unique("it-dead")
    checkpoint = str(tmp_path / "ckpt")

    def run() -> None:
        stream = oversized(spark, "id IN (42, 250)")
        query = (
            stream.writeStream.format("twophase.kafka")
            .option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("topic", topic)
            .option("kafka.message.max.bytes", "20000")
            .option("badRecords", dead)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(240)
        assert query.exception() is None, query.exception()

    run()
    run()
    keys = sorted(int(r.key) for r in readTopic(kafka_bootstrap, topic))
    assert keys == [i for i in range(300) if i not in (42, 250)]
    letters = readTopic(kafka_bootstrap, dead)
    assert sorted(int(r.key) for r in letters) == [42, 250]
    for letter in letters:
        headers = {k: (v or b"").decode() for k, v in letter.headers}
        assert headers["twophase.error.reason"] == "too large"
        assert headers["twophase.error.batch"] == str(int(letter.key) // 100)
        assert letter.value == b"x" * 4096


def _main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--pipeline", action="store_true")
    p.add_argument("--bootstrap")
    p.add_argument("--source")
    p.add_argument("--target")
    p.add_argument("--checkpoint")
    p.add_argument("--per-batch", dest="perBatch", default="40")
    p.add_argument("--errors", help="first try queries with bad options; their errors here")
    return pipelineChild(p.parse_args())


if __name__ == "__main__":
    raise SystemExit(_main())
