"""The Kafka sink's writer and committer against the real broker, window by window, no Spark.

Each test drives ``KafkaWriter`` (``beginTransaction`` -> ``write`` -> ``preCommit``) and
``KafkaCommitter`` (``commit``/``abort``/``recoverAndAbort``) as the binding and the
coordinator do, and reads the topic the way users do: with a ``read_committed`` consumer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pyarrow as pa
import pytest
from kafka import KafkaAdminClient

from integration_tests.conftest import ServiceControl
from integration_tests.test_kafka_helpers import createTopic, readTopic, unique, values
from twophase.protocol import (
    RecoveryScope,
    TransactionContext,
    TransactionLostError,
    TransientCommitError,
)
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.kafka import (
    KafkaCommitter,
    KafkaUnreachableError,
    KafkaWriteError,
    KafkaWriter,
    brokerTransactionMaxTimeoutMs,
    retainedTransactionalIds,
)
from twophase.spark.kafka import KafkaSink
from twophase.spark.task import runTask


def sinkOptions(bootstrap: str, topic: str | None, **options: str) -> dict[str, str]:
    base = {"kafka.bootstrap.servers": bootstrap, "transactionalIdPrefix": unique("it-p")}
    if topic:
        base["topic"] = topic
    return {**base, **options}


def sink(bootstrap: str, topic: str | None, **options: str) -> tuple[KafkaWriter, KafkaCommitter]:
    """The writer and the committer of one sink (one transactional id prefix)."""
    chosen = sinkOptions(bootstrap, topic, **options)
    return KafkaWriter.fromOptions(chosen), KafkaCommitter.fromOptions(chosen)


def ctx(batch: int = 0, partition: int = 0, attempt: int = 0) -> TransactionContext:
    return TransactionContext("it-sink", "q", batch, partition, attempt)


def rows(*texts: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"value": list(texts)})


def prepare(w: KafkaWriter, *texts: str, **where: int) -> dict[str, Any]:
    txn = w.beginTransaction(ctx(**where))
    w.write(txn, rows(*texts))
    return w.preCommit(txn)


def retrying(call: Any, handle: dict[str, Any], seconds: float = 60.0) -> None:
    """Call as the coordinator does: again after a TransientCommitError, until a deadline."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return call(handle)
        except TransientCommitError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def state(bootstrap: str, tid: str) -> str:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return str(admin.describe_transactions([tid])[tid].state.value)
    finally:
        admin.close()


def test_prepared_records_are_invisible_until_the_driver_commits_once(
    kafka_bootstrap: str,
) -> None:
    topic = createTopic(kafka_bootstrap, partitions=3)
    w, _ = sink(kafka_bootstrap, topic)
    handle = prepare(w, "a", "b", "c")
    assert handle["records"] == 3 and handle["producerId"] >= 0
    assert handle["transactionalId"].endswith("-0")
    assert readTopic(kafka_bootstrap, topic) == []
    assert len(readTopic(kafka_bootstrap, topic, isolation="read_uncommitted")) == 3
    _, driver = sink(kafka_bootstrap, topic, transactionalIdPrefix="unused")
    driver.commit(handle)
    assert values(readTopic(kafka_bootstrap, topic)) == ["a", "b", "c"]
    driver.commit(handle)  # idempotent
    driver.recoverAndCommit(handle)
    assert values(readTopic(kafka_bootstrap, topic)) == ["a", "b", "c"]


TASK = """
import json, sys
import pyarrow as pa
from twophase.protocol import TransactionContext
from twophase.sinks.kafka import KafkaWriter
options = json.loads(sys.argv[1])
w = KafkaWriter.fromOptions(options)
txn = w.beginTransaction(TransactionContext("it-sink", "q", 0, 1, 0))
w.write(txn, pa.RecordBatch.from_pydict({"value": ["from", "a", "task"]}))
print(json.dumps(w.preCommit(txn)))
if sys.argv[2] == "drop":
    del txn, w
    import gc; gc.collect()
# the worker ends here: the producer is never closed, so its transaction stays open
"""


@pytest.mark.parametrize("ending", ["exit", "drop"])
def test_the_transaction_survives_the_end_of_the_task_process(
    kafka_bootstrap: str, ending: str
) -> None:
    topic = createTopic(kafka_bootstrap)
    options = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "topic": topic,
        "transactionalIdPrefix": unique("it-exit"),
    }
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TASK), json.dumps(options), ending],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    handle = json.loads(done.stdout.strip().splitlines()[-1])
    assert state(kafka_bootstrap, handle["transactionalId"]) == "Ongoing"
    assert readTopic(kafka_bootstrap, topic) == []
    KafkaCommitter.fromOptions(options).commit(handle)
    assert values(readTopic(kafka_bootstrap, topic)) == ["a", "from", "task"]


def test_a_commit_after_an_abort_is_a_lost_transaction_not_a_success(
    kafka_bootstrap: str,
) -> None:
    topic = createTopic(kafka_bootstrap)
    w, c = sink(kafka_bootstrap, topic)
    handle = prepare(w, "gone", partition=4)
    retrying(c.abort, handle)
    retrying(c.abort, handle)  # idempotent
    with pytest.raises(TransactionLostError) as info:
        retrying(c.commit, handle)
    text = str(info.value)
    assert "batch 0 partition 4" in text and handle["transactionalId"] in text
    assert "not visible to read_committed" in text
    assert readTopic(kafka_bootstrap, topic) == []


@pytest.mark.timeout(120)
def test_a_transaction_the_broker_timed_out_fails_the_commit_loudly(
    kafka_bootstrap: str,
) -> None:
    topic = createTopic(kafka_bootstrap)
    w, c = sink(kafka_bootstrap, topic, **{"kafka.transaction.timeout.ms": "3000"})
    handle = prepare(w, "too", "late")
    deadline = time.monotonic() + 60
    while state(kafka_bootstrap, handle["transactionalId"]) != "CompleteAbort":
        assert time.monotonic() < deadline
        time.sleep(1)
    with pytest.raises(TransactionLostError, match="longer than its transaction.timeout.ms"):
        c.commit(handle)
    assert readTopic(kafka_bootstrap, topic) == []


def test_a_repeat_commit_after_the_id_was_reused_is_still_a_success(
    kafka_bootstrap: str,
) -> None:
    topic = createTopic(kafka_bootstrap)
    w, c = sink(kafka_bootstrap, topic)
    first = prepare(w, "batch-0", batch=0)
    c.commit(first)
    second = prepare(w, "batch-1", batch=1)  # same partition: same id, fenced epoch
    assert second["transactionalId"] == first["transactionalId"]
    assert second["producerEpoch"] > first["producerEpoch"]
    c.commit(first)  # EndTxn says PRODUCER_FENCED; the record is visible: committed before
    c.commit(second)
    assert values(readTopic(kafka_bootstrap, topic)) == ["batch-0", "batch-1"]


def test_recovery_aborts_lingering_transactions_but_not_kept_ones(kafka_bootstrap: str) -> None:
    topic = createTopic(kafka_bootstrap, partitions=2)
    w, c = sink(kafka_bootstrap, topic)
    kept = prepare(w, "decided", partition=0)
    lingering = prepare(w, "undecided", partition=1)
    retried = prepare(w, "zombie", partition=1, attempt=1)
    assert retried["transactionalId"].endswith("-1-a1")
    aborted = c.recoverAndAbort(RecoveryScope("it-sink", keep=(kept,)))
    assert sorted(h["transactionalId"] for h in aborted) == sorted(
        [lingering["transactionalId"], retried["transactionalId"]]
    )
    # Fenced: aborted, and the id now belongs to the (closed) fencing producer.
    assert state(kafka_bootstrap, lingering["transactionalId"]) in ("Empty", "CompleteAbort")
    assert state(kafka_bootstrap, kept["transactionalId"]) == "Ongoing"
    assert c.recoverAndAbort(RecoveryScope("it-sink", keep=(kept,))) == []  # idempotent
    c.commit(kept)
    assert values(readTopic(kafka_bootstrap, topic)) == ["decided"]
    with pytest.raises(TransactionLostError):
        retrying(c.commit, lingering)


def test_spark_kafka_columns_keys_partitions_headers_and_tombstones(kafka_bootstrap: str) -> None:
    from kafka.partitioner.default import murmur2

    topic = createTopic(kafka_bootstrap, partitions=4)
    other = createTopic(kafka_bootstrap, partitions=1)
    w, c = sink(kafka_bootstrap, None)
    txn = w.beginTransaction(ctx())
    schema = pa.schema(
        [
            ("key", pa.string()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        ]
    )
    keyed = pa.RecordBatch.from_pydict(
        {
            "key": [f"key-{i}" for i in range(40)],
            "value": [f"v{i}".encode() for i in range(40)],
            "topic": [topic] * 40,
            "partition": [None] * 40,
            "headers": [None] * 40,
        },
        schema=schema,
    )
    w.write(txn, keyed)
    mixed = pa.RecordBatch.from_pydict(
        {
            "key": [None, None, None],
            "value": [b"h", None, b"pinned"],
            "topic": [topic, other, topic],
            "partition": [None, None, 3],
            "headers": [[{"key": "trace", "value": b"1"}], None, []],
        },
        schema=schema,
    )
    w.write(txn, mixed)
    c.commit(w.preCommit(txn))
    records = readTopic(kafka_bootstrap, topic)
    for record in records:
        if record.key is not None:  # Java's partitioner: murmur2(key) mod partitions
            assert record.partition == (murmur2(record.key) & 0x7FFFFFFF) % 4, record
    assert len([r for r in records if r.key is not None]) == 40
    byValue = {r.value: r for r in records}
    assert byValue[b"h"].headers == (("trace", b"1"),)
    assert byValue[b"pinned"].partition == 3
    tombstones = readTopic(kafka_bootstrap, other)
    assert [(r.key, r.value) for r in tombstones] == [(None, None)]


def test_a_record_the_broker_refuses_fails_the_task_and_leaves_nothing(
    kafka_bootstrap: str,
) -> None:
    topic = createTopic(kafka_bootstrap)
    w, _ = sink(kafka_bootstrap, topic)
    batches = [rows("fine"), rows("x" * 2_000_000)]  # above the broker's message.max.bytes
    with pytest.raises(KafkaWriteError, match="MSG_SIZE_TOO_LARGE|too large"):
        runTask(lambda: w, ctx(), iter(batches), alreadyDecided=False)
    # The failed task aborted its transaction itself: nothing open, nothing visible.
    assert state(kafka_bootstrap, f"{w.settings.prefixFor('it-sink')}-0") != "Ongoing"
    assert readTopic(kafka_bootstrap, topic) == []


def test_a_worker_keeps_only_the_producers_that_may_still_matter(kafka_bootstrap: str) -> None:
    topic = createTopic(kafka_bootstrap, partitions=2)
    w, c = sink(kafka_bootstrap, topic)
    prefix = w.settings.prefixFor("it-sink")
    b0 = [prepare(w, "x", batch=0, partition=i) for i in range(2)]
    mine = [t for t in retainedTransactionalIds() if t.startswith(prefix)]
    assert mine == [f"{prefix}-0", f"{prefix}-1"]
    for h in b0:
        c.commit(h)
    prepare(w, "y", batch=1, partition=0)
    mine = [t for t in retainedTransactionalIds() if t.startswith(prefix)]
    assert mine == [f"{prefix}-0"]  # batch 0's producers are released: their batch committed


def test_the_transaction_timeout_defaults_to_the_brokers_maximum(kafka_bootstrap: str) -> None:
    assert brokerTransactionMaxTimeoutMs({"bootstrap.servers": kafka_bootstrap}) == 900_000
    topic = createTopic(kafka_bootstrap)
    w, c = sink(kafka_bootstrap, topic)
    handle = prepare(w, "t")
    assert handle["transactionTimeoutMs"] == 900_000
    c.abort(handle)


def test_unreachable_brokers_and_bad_options_fail_clearly(kafka_bootstrap: str) -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField("value", StringType())])
    options = {
        "kafka.bootstrap.servers": "127.0.0.1:1",
        "topic": "t",
        "checkpointLocation": "/tmp/unused",
        "requestTimeoutSeconds": "3",
    }
    started = time.monotonic()
    with pytest.raises(KafkaUnreachableError, match=r"cannot reach the cluster at 127\.0\.0\.1:1"):
        KafkaSink(dict(options)).validate(schema)
    assert time.monotonic() - started < 30
    bad = {**options, "kafka.bootstrap.servers": kafka_bootstrap, "kafka.no.such.thing": "1"}
    with pytest.raises(TwoPhaseConfigError, match="kafka.no.such.thing"):
        prepare(KafkaWriter.fromOptions(bad), "x")
    tooLong = {**options, "kafka.bootstrap.servers": kafka_bootstrap}
    tooLong["kafka.transaction.timeout.ms"] = "99999999"
    with pytest.raises(TwoPhaseConfigError, match="transaction.max.timeout.ms=900000"):
        KafkaSink(tooLong).validate(schema)


def test_a_task_without_rows_prepares_nothing_to_commit(kafka_bootstrap: str) -> None:
    topic = createTopic(kafka_bootstrap)
    w, c = sink(kafka_bootstrap, topic)
    txn = w.beginTransaction(ctx(partition=5))  # the producer starts in the background
    handle = w.preCommit(txn)
    assert handle["records"] == 0 and "producerId" not in handle
    c.commit(handle)
    c.abort(handle)
    assert state(kafka_bootstrap, handle["transactionalId"]) == "Empty"  # never began remotely
    assert readTopic(kafka_bootstrap, topic, isolation="read_uncommitted") == []


@pytest.mark.timeout(300)
def test_a_commit_waits_for_a_crashed_broker_to_come_back(
    kafka_bootstrap: str, kafka_broker: ServiceControl
) -> None:
    topic = createTopic(kafka_bootstrap, partitions=2)
    w, c = sink(kafka_bootstrap, topic)
    first = prepare(w, "before", partition=0)
    c.commit(first)  # the driver's client is connected
    second = prepare(w, "across", partition=1)
    kafka_broker.kill()  # SIGKILL: the open transaction must survive the broker's crash
    restart = threading.Thread(target=kafka_broker.start)
    restart.start()
    try:
        retrying(c.commit, second, seconds=120)
    finally:
        restart.join()
    assert values(readTopic(kafka_bootstrap, topic)) == ["across", "before"]


def test_secret_options_librdkafka_does_not_use_on_plaintext_change_nothing(
    kafka_bootstrap: str,
) -> None:
    """OAUTHBEARER settings and PEM keys are accepted, unused, on a PLAINTEXT cluster."""
    topic = createTopic(kafka_bootstrap)
    w, c = sink(
        kafka_bootstrap,
        topic,
        **{
            "kafka.security.protocol": "PLAINTEXT",
            "kafka.sasl.oauthbearer.config": "principal=it clientSecret=FAKE-OAUTH-SECRET",
            "kafka.ssl.key.pem": "-----BEGIN PRIVATE KEY-----\nFAKE\n-----END PRIVATE KEY-----",
            "kafka.ssl.key.password": "FAKE-KEY-PASSWORD",
        },
    )
    c.commit(prepare(w, "with", "fake", "secrets"))
    assert values(readTopic(kafka_bootstrap, topic)) == ["fake", "secrets", "with"]
    assert c.recoverAndAbort(RecoveryScope("it-sink")) == []
