"""The Kafka sink's writer and committer against the real broker, window by window, no Spark.

Each test drives ``KafkaWriter`` (``beginTransaction`` -> ``write`` -> ``preCommit``) and
``KafkaCommitter`` (``commit``/``abort``/``recoverAndAbort``) as the binding and the
coordinator do, and reads the topic the way users do: with a ``read_committed`` consumer.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pyarrow as pa
import pytest
from kafka import KafkaAdminClient
from kafka.protocol.broker_version_data import BrokerVersionData

from integration_tests.conftest import (
    ServiceControl,
    callsDuring,
    callsDuringAFreeze,
    failedWithin,
)
from integration_tests.docs_blocks import oneLine, sectionBlocks
from integration_tests.test_kafka_helpers import Record, createTopic, readTopic, unique, values
from integration_tests.toxiproxy import Toxiproxy
from twophase.protocol import (
    RecoveryScope,
    TransactionContext,
    TransactionLostError,
    TransientCommitError,
)
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.kafka import (
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    KafkaCommitter,
    KafkaSettings,
    KafkaUnreachableError,
    KafkaWriteError,
    KafkaWriter,
    RecordTooLargeError,
    brokerTransactionMaxTimeoutMs,
    ownedIds,
    pooledTransactionalIds,
)
from twophase.sinks.kafka.txn import sharedClient
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


def awaitState(bootstrap: str, tid: str, wanted: str, seconds: float = 60.0) -> None:
    """Wait for the coordinator to report ``wanted``: an EndTxn is answered once the decision
    is in the transaction log, and the markers that make its records readable follow."""
    deadline = time.monotonic() + seconds
    while (now := state(bootstrap, tid)) != wanted:
        assert time.monotonic() < deadline, f"{tid} still {now}, not {wanted}"
        time.sleep(0.2)


def test_the_handle_holds_the_broker_s_producer_id_and_epoch_and_any_committer_commits_it(
    kafka_bootstrap: str,
) -> None:
    """What the contract suite does not see: the producer id and epoch the handle takes from
    librdkafka's log are the broker's, and a committer of another transactionalIdPrefix ends the
    transaction from the handle alone (the handle, not the committer's options, names it)."""
    topic = createTopic(kafka_bootstrap, partitions=3)
    w, _ = sink(kafka_bootstrap, topic)
    handle = prepare(w, "a", "b", "c")
    assert handle["records"] == 3 and handle["producerId"] >= 0
    assert ownedIds(w.settings.prefixFor("it-sink")).match(handle["transactionalId"])
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        described = admin.describe_transactions([handle["transactionalId"]])
        row = described[handle["transactionalId"]]
        assert (row.producer_id, row.producer_epoch) == (
            handle["producerId"],
            handle["producerEpoch"],
        )
    finally:
        admin.close()
    _, driver = sink(kafka_bootstrap, topic, transactionalIdPrefix="unused")
    driver.commit(handle)
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
    awaitState(kafka_bootstrap, handle["transactionalId"], "CompleteAbort")
    with pytest.raises(TransactionLostError, match="longer than its transaction.timeout.ms"):
        c.commit(handle)
    assert readTopic(kafka_bootstrap, topic) == []


def test_a_pooled_producer_goes_on_with_the_same_id_and_epoch_in_the_next_batch(
    kafka_bootstrap: str,
) -> None:
    topic = createTopic(kafka_bootstrap)
    w, c = sink(kafka_bootstrap, topic)
    first = prepare(w, "batch-0", batch=0)
    c.commit(first)
    # A repeat before the next batch begins: a no-op (CONCURRENT_TRANSACTIONS, which the
    # coordinator retries, while the broker still writes the first commit's markers).
    retrying(c.commit, first)
    second = prepare(w, "batch-1", batch=1)  # the worker's producer, its transaction settled
    assert second["transactionalId"] == first["transactionalId"]
    assert (second["producerId"], second["producerEpoch"]) == (
        first["producerId"],
        first["producerEpoch"],
    )
    assert values(readTopic(kafka_bootstrap, topic)) == ["batch-0"]
    retrying(c.commit, second)
    assert values(readTopic(kafka_bootstrap, topic)) == ["batch-0", "batch-1"]


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
    assertNothingOpen(kafka_bootstrap, w, topic)


def assertNothingOpen(bootstrap: str, w: KafkaWriter, topic: str) -> None:
    """The failed task's transaction ends aborted: nothing open, nothing visible.

    The task aborts it itself, best effort (an executor's ``abort_transaction`` is bounded, and
    under load it can run out of time); what is still open then, the sweep of the failed
    batch aborts, as the driver's abort of that batch does. Either way it must go (a
    transaction nobody aborts stays open until its timeout, and so does this assertion)."""
    _, c = sink(bootstrap, topic)
    prefix = w.settings.prefixFor("it-sink") + "-"
    deadline = time.monotonic() + 15
    while c.client().listOngoing(prefix) and time.monotonic() < deadline:
        time.sleep(0.5)
    if c.client().listOngoing(prefix):
        KafkaCommitter(w.settings).recoverAndAbort(RecoveryScope("it-sink"))
    deadline = time.monotonic() + 15
    while left := c.client().listOngoing(prefix):
        assert time.monotonic() < deadline, [(t.transactionalId, t.state) for t in left]
        time.sleep(0.5)
    assert readTopic(bootstrap, topic) == []


def sized(*sizes: int, topic: str | None = None) -> pa.RecordBatch:
    """Records whose values have these sizes (bytes), optionally with a topic column."""
    columns: dict[str, Any] = {"value": [str(i % 10) * n for i, n in enumerate(sizes)]}
    if topic is not None:
        columns["topic"] = [topic] * len(sizes)
    return pa.RecordBatch.from_pydict(columns)


@pytest.mark.parametrize("path", ["one-topic", "topic-column"])
def test_a_record_over_the_producer_s_limit_is_named_by_position_and_size_with_the_fix(
    kafka_bootstrap: str, path: str
) -> None:
    """librdkafka refuses the record when it is produced (``produce_batch`` for one topic,
    ``produce`` per record otherwise): the row's position, its size and the limit."""
    topic = createTopic(kafka_bootstrap)
    w, c = sink(
        kafka_bootstrap,
        topic if path == "one-topic" else None,
        **{"kafka.message.max.bytes": "4000"},
    )
    column = topic if path == "topic-column" else None
    batches = [sized(10, 10, topic=column), sized(10, 5000, 10, topic=column)]
    with pytest.raises(RecordTooLargeError) as info:
        runTask(lambda: w, ctx(batch=2, partition=1), iter(batches), alreadyDecided=False)
    message = str(info.value)
    assert f"batch 2, partition 1 (attempt 0), topic {topic}" in message
    assert "row 3 of partition 1 (counting from 0) is 5000 bytes" in message, message
    assert "over the producer's message.max.bytes of 4000" in message
    assert "option kafka.message.max.bytes" in message and "topic's max.message.bytes" in message
    assert "restart the query" in message and "MSG_SIZE_TOO_LARGE" in str(info.value.__cause__)
    assertNothingOpen(kafka_bootstrap, w, topic)
    txn = w.beginTransaction(ctx(batch=3, partition=1))
    w.write(txn, sized(3, 4, topic=column))
    c.commit(w.preCommit(txn))
    assert sorted(len(r.value) for r in readTopic(kafka_bootstrap, topic)) == [3, 4]


def test_a_record_over_the_topic_s_limit_is_named_by_position_and_size_with_the_fix(
    kafka_bootstrap: str,
) -> None:
    """The broker refuses the whole record batch that holds it; the task names its largest
    record, which cannot fit in a batch of its own under the topic's max.message.bytes."""
    topic = createTopic(kafka_bootstrap, config={"max.message.bytes": "2000"})
    w, c = sink(kafka_bootstrap, topic)
    batches = [sized(10, 10), sized(10, 5000, 10)]
    with pytest.raises(RecordTooLargeError) as info:
        runTask(lambda: w, ctx(batch=2, partition=1), iter(batches), alreadyDecided=False)
    message = str(info.value)
    assert f"batch 2, partition 1 (attempt 0), topic {topic}" in message
    assert "max.message.bytes (2000 bytes)" in message
    assert "row 3 of partition 1 (counting from 0), 5000 bytes" in message, message
    assert "cannot fit in a batch of its own (about 1930 bytes can)" in message
    assert f"--entity-name {topic} --add-config max.message.bytes=" in message
    assert "MSG_SIZE_TOO_LARGE" in str(info.value.__cause__)
    assertNothingOpen(kafka_bootstrap, w, topic)
    c.commit(prepare(w, "later", "good", batch=3, partition=1))
    assert values(readTopic(kafka_bootstrap, topic)) == ["good", "later"]


def test_batches_over_the_topic_s_limit_say_so_and_the_fix_they_name_works(
    kafka_bootstrap: str,
) -> None:
    """No record is too large, the producer's batches are: the message says to bound them by
    kafka.message.max.bytes, and with it the same records commit."""
    topic = createTopic(kafka_bootstrap, config={"max.message.bytes": "2000"})
    w, _ = sink(kafka_bootstrap, topic)
    records = sized(*[100] * 60)
    with pytest.raises(RecordTooLargeError) as info:
        runTask(lambda: w, ctx(batch=2, partition=1), iter([records]), alreadyDecided=False)
    message = str(info.value)
    assert "No record is too large alone" in message, message
    assert "set the option kafka.message.max.bytes=2000" in message
    assertNothingOpen(kafka_bootstrap, w, topic)
    fixed, c = sink(kafka_bootstrap, topic, **{"kafka.message.max.bytes": "2000"})
    txn = fixed.beginTransaction(ctx(batch=3, partition=1))
    fixed.write(txn, records)
    c.commit(fixed.preCommit(txn))
    assert len(readTopic(kafka_bootstrap, topic)) == 60


def keyed(sizes: list[int], topics: list[str | None] | None = None) -> pa.RecordBatch:
    """Records keyed ``k<position>`` whose values have these sizes, optionally with a topic
    column (``None``: a null topic)."""
    columns: dict[str, Any] = {
        "key": [f"k{i}" for i in range(len(sizes))],
        "value": [str(i % 10) * n for i, n in enumerate(sizes)],
    }
    if topics is not None:
        columns["topic"] = topics
    return pa.RecordBatch.from_pydict(columns)


def headersOf(record: Record) -> dict[str, str]:
    return {k: (v or b"").decode() for k, v in record.headers}


@pytest.mark.parametrize("path", ["one-topic", "topic-column"])
def test_bad_records_go_to_the_dead_letter_topic_in_the_task_s_own_transaction(
    kafka_bootstrap: str, path: str
) -> None:
    """``badRecords=<topic>``: a record over the producer's limit becomes a dead-letter record
    in the same transaction, invisible while prepared, committed with the batch exactly once;
    an aborted batch leaves none. It keeps the head of the value, its size and its hash."""
    topic, dead = createTopic(kafka_bootstrap), createTopic(kafka_bootstrap, prefix="it-dlq")
    options = {"kafka.message.max.bytes": "20000", "badRecords": dead}
    w, c = sink(kafka_bootstrap, topic if path == "one-topic" else None, **options)
    column = [topic] * 5 if path == "topic-column" else None
    txn = w.beginTransaction(ctx(batch=2, partition=1))
    w.write(txn, keyed([10, 10], column and column[:2]))
    w.write(txn, keyed([10, 30000, 10], column and column[:3]))
    handle = w.preCommit(txn)
    assert handle["setAside"] == 1 and handle["records"] == 5
    assert readTopic(kafka_bootstrap, dead) == [] and readTopic(kafka_bootstrap, topic) == []
    c.commit(handle)
    assert sorted(r.key for r in readTopic(kafka_bootstrap, topic)) == [b"k0", b"k0", b"k1", b"k2"]
    [letter] = readTopic(kafka_bootstrap, dead)
    whole = b"1" * 30000
    assert letter.key == b"k1" and letter.value == whole[:4096]
    h = headersOf(letter)
    assert h["twophase.error.reason"] == "too large" and h["twophase.error.topic"] == topic
    assert (
        "30002 bytes (key and value) over the producer's message.max.bytes of 20000"
        in (h["twophase.error.message"])
    )
    assert (h["twophase.error.sink"], h["twophase.error.batch"]) == ("it-sink", "2")
    assert (h["twophase.error.partition"], h["twophase.error.row"]) == ("1", "3")
    assert h["twophase.error.bytes"] == "30002" and h["twophase.error.truncated"] == "value"
    assert h["twophase.error.value.sha256"] == hashlib.sha256(whole).hexdigest()

    aborted = w.beginTransaction(ctx(batch=3, partition=1))
    w.write(aborted, keyed([30000, 10], column and column[:2]))
    w.abortTransaction(aborted)
    assertNothingOpenAfter(kafka_bootstrap, w)
    assert len(readTopic(kafka_bootstrap, dead)) == 1


def assertNothingOpenAfter(bootstrap: str, w: KafkaWriter) -> None:
    _, c = sink(bootstrap, None)
    prefix = w.settings.prefixFor("it-sink") + "-"
    deadline = time.monotonic() + 30
    while left := c.client().listOngoing(prefix):
        assert time.monotonic() < deadline, [(t.transactionalId, t.state) for t in left]
        time.sleep(0.5)


def test_a_replay_in_another_order_sets_the_same_rows_aside_with_the_same_fingerprint(
    kafka_bootstrap: str,
) -> None:
    """What a replay of a lost transaction is checked against covers the dead-letter records
    but not their positions: Spark may replay a shuffled partition in another order. A row
    with a null topic (no default topic) is set aside whole."""
    topic, dead = createTopic(kafka_bootstrap), createTopic(kafka_bootstrap, prefix="it-dlq")
    options = {"kafka.message.max.bytes": "20000", "badRecords": dead}
    w, c = sink(kafka_bootstrap, None, **options)
    sizes, topics = [10, 30000, 20, 40], [topic, topic, None, topic]
    first = w.beginTransaction(ctx(batch=4, partition=0))
    w.write(first, keyed(sizes, topics))
    handle = w.preCommit(first)
    forward = keyed(sizes, topics)
    backward = forward.take(pa.array([3, 2, 1, 0]))
    replay = w.beginTransaction(ctx(batch=4, partition=0, attempt=1))
    w.write(replay, backward)
    again = w.preCommit(replay)
    assert handle["fingerprint"] == again["fingerprint"] and again["setAside"] == 2
    c.abort(again)
    c.commit(handle)
    letters = {r.key: headersOf(r) for r in readTopic(kafka_bootstrap, dead)}
    assert letters[b"k2"]["twophase.error.reason"] == "null topic"
    assert letters[b"k1"]["twophase.error.reason"] == "too large"
    assert sorted(r.key for r in readTopic(kafka_bootstrap, topic)) == [b"k0", b"k3"]
    [nullTopic] = [r for r in readTopic(kafka_bootstrap, dead) if r.key == b"k2"]
    assert nullTopic.value == b"2" * 20 and "twophase.error.truncated" not in letters[b"k2"]


def test_bad_records_must_name_another_topic(kafka_bootstrap: str) -> None:
    with pytest.raises(TwoPhaseConfigError, match="names the sink's own topic"):
        KafkaSettings.fromOptions(sinkOptions(kafka_bootstrap, "events", badRecords="events"))
    with pytest.raises(TwoPhaseConfigError, match="must be 'fail' or a topic name"):
        KafkaSettings.fromOptions(sinkOptions(kafka_bootstrap, "events", badRecords="a b"))
    assert (
        KafkaSettings.fromOptions(sinkOptions(kafka_bootstrap, "e", badRecords="FAIL")).badRecords
        is None
    )


def test_the_documented_rejection_is_what_the_sink_says(kafka_bootstrap: str) -> None:
    """docs/kafka.md, "A record the target rejects": the example is real output (the
    document's topic ``events`` and sink ``events``)."""
    topic = createTopic(kafka_bootstrap, config={"max.message.bytes": "2000"})
    w, _ = sink(kafka_bootstrap, topic)
    documentedCtx = TransactionContext("events", "q", 7, 2, 0)
    with pytest.raises(RecordTooLargeError) as info:
        runTask(lambda: w, documentedCtx, iter([sized(10, 10, 10, 5000)]), alreadyDecided=False)

    def documented(text: str) -> str:  # how librdkafka groups the records may vary
        return re.sub(r"a batch of \d+ record", "a batch of <n> record", oneLine(text))

    actual = documented(str(info.value).replace(topic, "events"))
    assert [actual] == [
        documented(b) for b in sectionBlocks("kafka.md", "A record the target rejects")
    ]


@pytest.mark.parametrize("listing", ["listed", "unlisted"])
def test_pooled_ids_across_batches_commit_each_decided_task_once_and_nothing_else(
    kafka_bootstrap: str, listing: str
) -> None:
    """Several "tasks" per batch in one worker; each batch's producers are the next's.

    Batch 1 leaves what a real run can leave on a pooled id: a task whose handle no decision
    holds (a discarded attempt, still open) and one the driver aborted. When batch 2 takes
    those ids again, the first is aborted, the second refused locally and taken over: neither
    is ever committed; a taken-over id has a new producer, whose ``init_transactions`` bumps
    the epoch. ``unlisted``: the worker's brokers cannot list transactions (ListTransactions
    came with Kafka 3.0; the test broker is newer, so the worker's own client is told what an
    older broker answers to ApiVersions, the one external answer replaced): every reused id is
    taken over by a new producer.
    """
    topic = createTopic(kafka_bootstrap, partitions=3)
    options = sinkOptions(kafka_bootstrap, topic)
    c = KafkaCommitter.fromOptions(options)
    if listing == "listed":
        w = KafkaWriter.fromOptions(options)
    else:  # a client id of its own: the worker's client, not the driver's
        w = KafkaWriter.fromOptions({**options, "kafka.client.id": unique("it-old-broker")})
        worker = sharedClient(
            w.settings.producerConfig, timeoutSeconds=w.settings.requestTimeoutSeconds
        )
        worker._client()._manager.broker_version_data = BrokerVersionData((2, 8))
    prefix = w.settings.prefixFor("it-sink")
    if listing == "unlisted":
        assert worker.listOngoing(prefix + "-") is None
    b0 = [prepare(w, f"b0-p{p}", batch=0, partition=p) for p in range(3)]
    ids0 = {h["transactionalId"] for h in b0}
    assert len(ids0) == 3
    for h in b0:
        c.commit(h)
    b1 = [prepare(w, f"b1-p{p}", batch=1, partition=p) for p in range(2)]
    undecided = prepare(w, "b1-undecided", batch=1, partition=2)
    aborted = prepare(w, "b1-aborted", batch=1, partition=2, attempt=1)
    assert {h["transactionalId"] for h in b1 + [undecided]} == ids0  # reused, not new
    retrying(c.abort, aborted)
    for h in b1:
        c.commit(h)
    b2 = [prepare(w, f"b2-p{p}", batch=2, partition=p) for p in range(4)]
    for h in b2:
        c.commit(h)
    assert len([t for t in pooledTransactionalIds() if t.startswith(prefix)]) == 4
    epochs = {h["transactionalId"]: h["producerEpoch"] for h in [*b1, undecided, aborted]}
    assert {h["transactionalId"] for h in b2} == set(epochs)  # every id of batch 1 reused
    takenOver = {
        h["transactionalId"] for h in b2 if h["producerEpoch"] > epochs[h["transactionalId"]]
    }
    if listing == "listed":  # the committed ones go on with their producer
        assert takenOver == {undecided["transactionalId"], aborted["transactionalId"]}
    else:
        assert takenOver == set(epochs)
    expected = [f"b{b}-p{p}" for b, n in ((0, 3), (1, 2), (2, 4)) for p in range(n)]
    assert sorted(values(readTopic(kafka_bootstrap, topic))) == sorted(expected)
    assert c.client().listOngoing(prefix + "-") == []  # the undecided one was aborted
    with pytest.raises(TransactionLostError):
        retrying(c.commit, undecided)


def test_a_restarted_query_takes_over_the_pooled_ids_its_previous_run_left_open(
    kafka_bootstrap: str,
) -> None:
    """Same worker, new run id (the query restarted in the same Spark application): the old
    run's undecided transactions are swept by recovery, its decided one committed; the new
    run's tasks reuse the ids (the swept ones through a new producer) and batch ids that go
    back (a replay of batch 1) do not matter."""
    topic = createTopic(kafka_bootstrap, partitions=2)
    w, c = sink(kafka_bootstrap, topic)

    def task(run: str, batch: int, partition: int, text: str) -> dict[str, Any]:
        result = runTask(
            lambda: w,
            TransactionContext("it-sink", "q", batch, partition, 0, runId=run),
            iter([rows(text)]),
            alreadyDecided=False,
        )
        assert result.handle is not None
        return result.handle

    decided = task("old", 1, 0, "old-decided")
    undecided = task("old", 1, 1, "old-undecided")
    # Restart: recovery commits the decided handle, then sweeps what no decision keeps.
    c.recoverAndCommit(decided)
    swept = c.recoverAndAbort(RecoveryScope("it-sink", keep=(decided,)))
    assert [h["transactionalId"] for h in swept] == [undecided["transactionalId"]]
    replay = [task("new", 1, p, f"new-b1-p{p}") for p in range(2)]
    assert {h["transactionalId"] for h in replay} == {
        decided["transactionalId"],
        undecided["transactionalId"],
    }
    for h in replay:
        c.commit(h)
    assert sorted(values(readTopic(kafka_bootstrap, topic))) == [
        "new-b1-p0",
        "new-b1-p1",
        "old-decided",
    ]


KILLED_WORKER = """
import json, os, sys
import pyarrow as pa
from twophase.protocol import TransactionContext
from twophase.sinks.kafka import KafkaWriter
options, partitions = json.loads(sys.argv[1]), int(sys.argv[2])
w = KafkaWriter.fromOptions(options)
for p in range(partitions):
    txn = w.beginTransaction(TransactionContext("it-sink", "q", 0, p, 0, runId="old"))
    w.write(txn, pa.RecordBatch.from_pydict({"value": [f"b0-p{p}"]}))
    print(json.dumps(w.preCommit(txn)), flush=True)
os.kill(os.getpid(), 9)  # SIGKILL with every pooled producer holding its transaction
"""


def test_a_killed_worker_s_pooled_transactions_are_committed_or_swept_in_another_shape(
    kafka_bootstrap: str,
) -> None:
    """A worker holding 4 prepared pooled producers is SIGKILLed; batch 0 is decided with 2
    of them (the others are attempts no decision holds). The restarted query runs with 2
    partitions in a new worker (new ids): recovery commits the decided handles, the sweep
    finds the dead worker's other ids by pattern and aborts them."""
    topic = createTopic(kafka_bootstrap, partitions=2)
    options = sinkOptions(kafka_bootstrap, topic)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLED_WORKER), json.dumps(options), "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr[-2000:]
    handles = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert len({h["transactionalId"] for h in handles}) == 4
    w, c = KafkaWriter.fromOptions(options), KafkaCommitter.fromOptions(options)
    decided = handles[:2]
    for h in decided:
        c.recoverAndCommit(h)
    aborted = c.recoverAndAbort(RecoveryScope("it-sink", keep=tuple(decided)))
    assert sorted(h["transactionalId"] for h in aborted) == sorted(
        h["transactionalId"] for h in handles[2:]
    )
    b1 = [
        runTask(
            lambda: w,
            TransactionContext("it-sink", "q", 1, p, 0, runId="new"),
            iter([rows(f"b1-p{p}")]),
            alreadyDecided=False,
        ).handle
        for p in range(2)
    ]
    for h in b1:
        assert h is not None and h["transactionalId"] not in {x["transactionalId"] for x in handles}
        c.commit(h)
    assert sorted(values(readTopic(kafka_bootstrap, topic))) == ["b0-p0", "b0-p1", "b1-p0", "b1-p1"]
    assert c.recoverAndAbort(RecoveryScope("it-sink")) == []


def test_the_transaction_timeout_defaults_to_one_minute_within_the_brokers_maximum(
    kafka_bootstrap: str,
) -> None:
    assert brokerTransactionMaxTimeoutMs({"bootstrap.servers": kafka_bootstrap}) == 900_000
    topic = createTopic(kafka_bootstrap)
    w, c = sink(kafka_bootstrap, topic)
    handle = prepare(w, "t")
    assert handle["transactionTimeoutMs"] == DEFAULT_TRANSACTION_TIMEOUT_MS == 60_000
    assert c.fingerprint(handle) == handle["fingerprint"] and handle["fingerprint"].startswith("1:")
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
    # After a restart the markers can lag the answer to EndTxn for a while.
    awaitState(kafka_bootstrap, second["transactionalId"], "CompleteCommit")
    assert values(readTopic(kafka_bootstrap, topic)) == ["across", "before"]


def test_a_frozen_broker_fails_the_flush_and_the_commit_in_bounded_time_then_commits_once(
    kafka_bootstrap: str, kafka_broker: ServiceControl
) -> None:
    """A frozen broker (its process stopped: connections open, nothing answered) must not hold
    a task's flush or the driver's EndTxn forever: the flush fails after flushTimeoutSeconds,
    the commit after requestTimeoutSeconds with a retryable error; once the broker resumes the
    decided transaction commits, and the task's unflushed one never becomes visible."""
    topic = createTopic(kafka_bootstrap, partitions=2)
    w, c = sink(kafka_bootstrap, topic, requestTimeoutSeconds="3", flushTimeoutSeconds="3")
    first = prepare(w, "before", partition=0)
    c.commit(first)  # the driver's client is connected
    second = prepare(w, "decided", partition=1)
    txn = w.beginTransaction(ctx(batch=1, partition=2))
    w.write(txn, rows("never"))

    def writeAndPrepare() -> None:  # sent while the server is frozen
        w.write(txn, rows("never, sent frozen"))
        w.preCommit(txn)

    outcomes = callsDuringAFreeze(
        kafka_broker,
        {
            "preCommit": writeAndPrepare,
            "commit": lambda: c.commit(second),
        },
    )
    flushError = failedWithin(outcomes, "preCommit", KafkaWriteError, 8)
    assert "within 3 s" in str(flushError), flushError
    failedWithin(outcomes, "commit", TransientCommitError, 10)
    w.abortTransaction(txn)
    retrying(c.commit, second, seconds=60)
    retrying(c.commit, second, seconds=60)  # again, as after a lost reply: a no-op
    assert values(readTopic(kafka_bootstrap, topic)) == ["before", "decided"]


def test_a_lost_reply_to_end_txn_fails_in_bounded_time_and_the_retry_finds_it_done(
    kafka_bootstrap: str, proxies: Toxiproxy
) -> None:
    """The network loses the broker's answer to ``EndTxn(commit)`` (the request arrived and
    the transaction committed): the driver's commit fails after requestTimeoutSeconds,
    retryably, and the coordinator's retry of the same EndTxn is answered with success (the
    broker ends a transaction once; the same producer id and epoch again is a no-op), so every
    record is there once. Writer and committer bootstrap through the proxy, and the broker's
    metadata keeps them there. The partition's previous batch was committed first, as in a
    running query: the driver then knows the transaction's coordinator and sends EndTxn alone
    (a lookup whose answer is lost would keep EndTxn from being sent at all)."""
    topic = createTopic(kafka_bootstrap, partitions=2)
    proxy = proxies.proxy("kafka")
    w, c = sink(proxy.listen, topic, requestTimeoutSeconds="3")
    c.commit(prepare(w, "before", batch=0, partition=1))
    decided = prepare(w, "decided", batch=1, partition=1)
    outcomes = callsDuring(proxy.loseReplies, proxy.heal, {"commit": lambda: c.commit(decided)})
    failedWithin(outcomes, "commit", TransientCommitError, 8)
    # Read directly, not through the proxy: the request did reach the broker.
    assert values(readTopic(kafka_bootstrap, topic)) == ["before", "decided"]
    c.commit(decided)  # the coordinator's retry
    assert values(readTopic(kafka_bootstrap, topic)) == ["before", "decided"]


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
