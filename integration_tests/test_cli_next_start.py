"""What the operator's commands say the next start will do, against the real Kafka broker.

- a decided Kafka transaction the broker aborted at its timeout (``kafka.transaction.timeout.ms``
  of 3 s, the commit after it), as a long outage leaves it: ``status``, ``doctor`` and
  ``recover`` (with and without ``--dry-run``) say the same sentence of it, offer the restart
  alone, and exit 1; recover commits the batch's other partition and leaves the batch decided;
- a Kafka cut off through its Toxiproxy while a batch is planned (its recovery retries the
  broker): the batch's own figures look ordinary, and ``status`` shows its whole duration from
  Spark's ``offsets/N`` and ``commits/N``, the part before its decision, and a line saying the
  time went outside its tasks' prepare.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from integration_tests.checkpoints import SinkCheckpoint
from integration_tests.spark_processes import sharedSession
from integration_tests.test_kafka_helpers import createTopic, readTopic, values
from integration_tests.test_kafka_participant import state
from integration_tests.toxiproxy import Toxiproxy
from twophase import cli
from twophase.coordinator import Coordinator, CoordinatorSettings
from twophase.coordinator.errors import RewritePendingError
from twophase.doctor.nextstart import Unfinished
from twophase.spark.kafka import KafkaSink

STALL_SECONDS = 10.0


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = cli.main(list(argv))
    return status, capsys.readouterr().out


@pytest.mark.timeout(180)
def test_a_kafka_transaction_lost_at_its_timeout_is_the_restarts_in_every_command(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = createTopic(kafka_bootstrap, partitions=2)
    sink = KafkaSink(
        {
            "kafka.bootstrap.servers": kafka_bootstrap,
            "topic": topic,
            "transactionalIdPrefix": f"it-next-{uuid.uuid4().hex[:8]}",
            "checkpointLocation": str(tmp_path / "ckpt"),
            "kafka.transaction.timeout.ms": "3000",
        }
    )
    crashed = SinkCheckpoint(sink, tmp_path / "ckpt")
    writer = sink.createWriter()

    def prepare(partition: int) -> dict[str, Any]:
        txn = writer.beginTransaction(crashed.context(0, partition))
        batch = pa.RecordBatch.from_pydict({"value": [f"v{partition}"], "partition": [partition]})
        writer.write(txn, batch)
        return dict(writer.preCommit(txn))

    late = prepare(1)  # a task whose transaction outlived the broker's timeout
    deadline = time.monotonic() + 60
    while state(kafka_bootstrap, late["transactionalId"]) != "CompleteAbort":
        assert time.monotonic() < deadline, "the broker never aborted the transaction"
        time.sleep(0.5)
    early = prepare(0)
    coordinator = Coordinator(
        sink.createCommitter(), crashed.log, crashed.sinkId, CoordinatorSettings(commitRetries=2)
    )
    with pytest.raises(RewritePendingError):  # what the query failed with
        coordinator.commitBatch(0, [crashed.result(0, 0, early), crashed.result(0, 1, late)])
    assert values(readTopic(kafka_bootstrap, topic)) == ["v0"]
    batch = crashed.log.state(0)
    assert batch is not None and batch.awaitingRewrite == (1,)
    said, fix = Unfinished.of(batch).describe(), Unfinished.of(batch).fix("")
    assert said.startswith("batch 0 is decided, and the transactions of partitions [1] were ")
    ckpt = str(crashed.path)

    status, out = run(capsys, "status", "--checkpoint", ckpt)
    assert status == 1 and said in out and f"to finish batch 0: {fix}" in out, out
    assert "twophase recover --checkpoint" not in out
    status, out = run(capsys, "doctor", "--checkpoint", ckpt, "--json")
    findings = json.loads(out)["sinks"][0]["findings"]
    assert status == 1 and [f["finding"] for f in findings] == ["awaiting-rewrite"], findings
    assert (findings[0]["summary"], findings[0]["fix"]) == (said, fix)
    for dryRun in (["--dry-run"], []):
        status, out = run(capsys, "recover", "--checkpoint", ckpt, *dryRun)
        assert status == 1, (dryRun, out)
        assert f"{said}\n" in out and f"left for the next start of the query: {fix}\n" in out
    assert values(readTopic(kafka_bootstrap, topic)) == ["v0"]  # committed once, no rewrite
    assert [s.batchId for s in crashed.log.outstanding()] == [0]
    status, out = run(capsys, "status", "--checkpoint", ckpt, "--json")
    assert status == 1 and json.loads(out)["nextStart"][0]["onlyRestart"] is True


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from sharedSession("twophase-next-start")


@pytest.mark.timeout(300)
def test_a_batch_stalled_before_its_decision_shows_where_its_time_went(
    spark: Any,
    kafka_bootstrap: str,
    proxies: Toxiproxy,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    proxy = proxies.proxy("kafka")
    topic = createTopic(kafka_bootstrap, partitions=2)
    ckpt = tmp_path / "ckpt"
    cut: dict[str, float] = {}

    def cutDuringBatch1() -> None:
        deadline = time.monotonic() + 180
        while not (ckpt / "offsets" / "1").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        proxy.partition()  # Spark planned batch 1: its planning's recovery meets no broker
        cut["at"] = time.monotonic()
        time.sleep(STALL_SECONDS)
        proxy.heal()

    cutter = threading.Thread(target=cutDuringBatch1, daemon=True)
    cutter.start()
    query = (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", 500)
        .option("totalRows", 1500)
        .option("numPartitions", 2)
        .load()
        .selectExpr("CAST(id AS STRING) AS value")
        .writeStream.format("twophase.kafka")
        .option("kafka.bootstrap.servers", proxy.listen)
        .option("topic", topic)
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    cutter.join(60)
    assert query.exception() is None and "at" in cut
    assert len(readTopic(kafka_bootstrap, topic)) == 1500

    status, out = run(capsys, "status", "--checkpoint", str(ckpt), "--json")
    batches = {b["batchId"]: b for b in json.loads(out)["recentBatches"]}
    stalled = batches[1]
    assert status == 0 and stalled["outcome"] == "committed"
    # What the log's own figures say of it looks ordinary ...
    assert stalled["prepareSeconds"] < 5 and stalled["commitSeconds"] < 5, stalled
    # ... and Spark's files bound the whole of it.
    assert stalled["batchSeconds"] >= STALL_SECONDS - 3, stalled
    assert stalled["toDecisionSeconds"] >= STALL_SECONDS - 3, stalled
    assert batches[2]["batchSeconds"] < STALL_SECONDS - 3, batches[2]  # after the heal
    status, out = run(capsys, "status", "--checkpoint", str(ckpt))
    lines = out.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("         1 "))
    assert "passed before its decision, and its slowest decided task prepared in" in lines[row + 1]
