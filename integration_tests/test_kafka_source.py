"""The Kafka source against the real broker: what a micro-batch plans and what a task reads.

The planner and the range reader are driven the way Spark's stream reader drives them
(``initialOffset``, ``latestOffset``, ``partitions``, ``read``) without a JVM: transaction
markers, aborted and open transactions, new and deleted partitions, deleted records, admission
limits and replays; the last test goes through the Spark adapter itself.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from integration_tests.test_kafka_helpers import createTopic, unique
from integration_tests.toxiproxy import Toxiproxy
from twophase.sources.kafka import (
    KafkaPlanner,
    KafkaRange,
    KafkaSourceError,
    KafkaSourceSettings,
    readRange,
    readRanges,
)


def reader(bootstrap: str, topics: str, **options: str) -> KafkaPlanner:
    settings = KafkaSourceSettings.fromOptions(
        {"kafka.bootstrap.servers": bootstrap, "subscribe": topics, **options}
    )
    return KafkaPlanner(settings)


def readAll(r: KafkaPlanner, start: dict[str, Any], end: dict[str, Any]) -> list[dict]:
    """What a batch's tasks read: each group of ranges the planner chose, as Spark's reader."""
    rows: list[dict] = []
    for group in r.groups(start, end):
        for _, batch in readRanges(r.settings, group):
            rows.extend(batch.to_pylist())
    return rows


def transactional(bootstrap: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("it-src")})
    producer.init_transactions(60)
    return producer


def write(producer: Producer, topic: str, texts: list[str], *, commit: bool | None) -> None:
    """A transaction of ``texts``: committed, aborted, or (None) left open."""
    producer.begin_transaction()
    for text in texts:
        producer.produce(topic, text.encode(), key=text.encode())
    producer.flush(30)
    if commit is True:
        producer.commit_transaction(60)
    elif commit is False:
        producer.abort_transaction(60)


def texts(rows: list[dict]) -> list[str]:
    return [r["value"].decode() for r in rows]


def test_a_range_ending_in_a_transaction_marker_is_read_to_its_end(kafka_bootstrap: str) -> None:
    topic = createTopic(kafka_bootstrap)
    producer = transactional(kafka_bootstrap)
    write(producer, topic, ["aborted-1", "aborted-2"], commit=False)
    write(producer, topic, ["a", "b", "c"], commit=True)
    r = reader(kafka_bootstrap, topic, startingOffsets="earliest")
    start = r.initialOffset()
    end = r.latestOffset(start)
    # 2 aborted records + abort marker + 3 records + commit marker: the range ends on a marker
    assert end == {topic: {"0": 7}}
    started = time.monotonic()
    rows = readAll(r, start, end)
    assert time.monotonic() - started < 10  # no waiting for an offset that never comes
    assert texts(rows) == ["a", "b", "c"]
    assert [row["offset"] for row in rows] == [3, 4, 5]
    assert rows[0]["key"] == b"a" and rows[0]["topic"] == topic and rows[0]["partition"] == 0
    assert rows[0]["timestampType"] == 0 and rows[0]["timestamp"] is not None
    assert readAll(r, start, end) == rows  # a replay of the range gives the same records


def test_an_open_transaction_ends_the_batch_at_the_last_stable_offset(
    kafka_bootstrap: str,
) -> None:
    topic = createTopic(kafka_bootstrap)
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    plain.produce(topic, b"before")
    plain.flush(30)
    producer = transactional(kafka_bootstrap)
    write(producer, topic, ["open-1", "open-2"], commit=None)
    plain.produce(topic, b"after")  # committed, but behind the open transaction
    plain.flush(30)
    r = reader(kafka_bootstrap, topic, startingOffsets="earliest")
    start = r.initialOffset()
    first = r.latestOffset(start)
    assert first == {topic: {"0": 1}}
    assert texts(readAll(r, start, first)) == ["before"]
    producer.commit_transaction(60)
    # commit_transaction returns once the coordinator has logged the decision; the markers,
    # and with them the last stable offset, follow asynchronously (a later batch sees them).
    deadline = time.monotonic() + 30
    second = r.latestOffset(first)
    while second == first and time.monotonic() < deadline:
        time.sleep(0.05)
        second = r.latestOffset(first)
    assert texts(readAll(r, first, second)) == ["open-1", "open-2", "after"]
    uncommitted = reader(
        kafka_bootstrap,
        topic,
        startingOffsets="earliest",
        **{"kafka.isolation.level": "read_uncommitted"},
    )
    assert uncommitted.latestOffset(start) == {topic: {"0": 5}}


def test_ranges_of_several_partitions_are_read_together_exactly_as_one_by_one(
    kafka_bootstrap: str,
) -> None:
    """One consumer reads a group of ranges: each range's records, no more, markers and
    aborted transactions skipped, whatever range ends first; batches hold one partition each."""
    topic = createTopic(kafka_bootstrap, partitions=3)
    producer = transactional(kafka_bootstrap)
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    for round_ in range(3):
        producer.begin_transaction()
        for p in range(3):
            for i in range(5 + 10 * p):
                producer.produce(topic, f"t{round_}-p{p}-{i}".encode(), partition=p)
        producer.flush(30)
        if round_ == 1:
            producer.abort_transaction(60)
        else:
            producer.commit_transaction(60)
        plain.produce(topic, f"plain{round_}".encode(), partition=round_)
        plain.flush(30)
    r = reader(kafka_bootstrap, topic, startingOffsets="earliest")
    start = r.initialOffset()
    # 3 transactions' records, their 3 markers and one plain record in each partition; the
    # last markers may follow commit_transaction's return
    want = {topic: {str(p): 3 * (5 + 10 * p) + 3 + 1 for p in range(3)}}
    deadline = time.monotonic() + 30
    end = r.latestOffset(start)
    while end != want and time.monotonic() < deadline:
        time.sleep(0.1)
        end = r.latestOffset(start)
    assert end == want
    assert [len(g) for g in r.groups(start, end)] == [3]  # all small: one Spark partition
    alone = {
        part.partition: [row["value"] for b in readRange(r.settings, part) for row in b.to_pylist()]
        for part in r.partitions(start, end)
    }
    together: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    for part, batch in readRanges(r.settings, r.groups(start, end)[0]):
        assert set(batch.column("partition").to_pylist()) == {part.partition}
        together[part.partition] += batch.column("value").to_pylist()
    assert together == alone
    for p in range(3):
        expected = [f"t{k}-p{p}-{i}".encode() for k in (0, 2) for i in range(5 + 10 * p)]
        assert sorted(together[p]) == sorted([*expected, f"plain{p}".encode()])
    # two ranges of one partition in a group are read one after the other
    whole = r.partitions(start, end)[2]
    middle = (whole.start + whole.end) // 2
    halves = (KafkaRange(topic, 2, whole.start, middle), KafkaRange(topic, 2, middle, whole.end))
    read = [row["value"] for _, b in readRanges(r.settings, halves) for row in b.to_pylist()]
    assert read == alone[2]
    # a small minimum splits the batch into more groups, reading the same records
    split = reader(kafka_bootstrap, topic, startingOffsets="earliest", minRecordsPerPartition="60")
    assert [len(g) for g in split.groups(start, end)] == [2, 1]
    assert sorted(texts(readAll(split, start, end))) == sorted(texts(readAll(r, start, end)))


def test_max_offsets_per_trigger_and_split_ranges_stop_where_planned(
    kafka_bootstrap: str,
) -> None:
    topic = createTopic(kafka_bootstrap, partitions=2)
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(40):
        plain.produce(topic, f"r{i}".encode(), partition=i % 2)
    plain.flush(30)
    r = reader(
        kafka_bootstrap,
        topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="10",
        minPartitions="4",
    )
    start = r.initialOffset()
    seen: list[str] = []
    while True:
        end = r.latestOffset(start, r.settings.maxOffsetsPerTrigger)
        if end == start:
            break
        parts = r.partitions(start, end)
        assert len(parts) == 4 and sum(p.end - p.start for p in parts) == 10
        seen += texts(readAll(r, start, end))
        start = end
    assert sorted(seen) == sorted(f"r{i}" for i in range(40))


def test_new_partitions_are_picked_up_and_deleted_topics_reported(kafka_bootstrap: str) -> None:
    topic = createTopic(kafka_bootstrap, partitions=1)
    doomed = createTopic(kafka_bootstrap, partitions=1)
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    plain.produce(topic, b"p0")
    plain.produce(doomed, b"d0")
    plain.flush(30)
    r = reader(kafka_bootstrap, f"{topic},{doomed}", startingOffsets="earliest")
    start = r.initialOffset()
    end = r.latestOffset(start)
    assert sorted(texts(readAll(r, start, end))) == ["d0", "p0"]
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_partitions([NewPartitions(topic, 2)])[topic].result(timeout=60)
    deadline = time.monotonic() + 30
    while len(plain.list_topics(topic, timeout=10).topics[topic].partitions) < 2:
        assert time.monotonic() < deadline, "the new partition never reached the producer"
        time.sleep(0.2)
    plain.produce(topic, b"p1", partition=1)
    plain.flush(30)
    deadline = time.monotonic() + 30
    while True:  # metadata of the new partition reaches the reader a little later
        nxt = r.latestOffset(end)
        if "1" in nxt[topic] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert nxt[topic] == {"0": 1, "1": 1}
    assert texts(readAll(r, end, nxt)) == ["p1"]
    admin.delete_topics([doomed])[doomed].result(timeout=60)
    deadline = time.monotonic() + 30
    with pytest.raises(KafkaSourceError, match=rf"{doomed}-0 no longer exist"):
        while time.monotonic() < deadline:
            r.latestOffset(nxt)
            time.sleep(0.5)
    lenient = reader(kafka_bootstrap, f"{topic},{doomed}", failOnDataLoss="false")
    assert doomed not in lenient.latestOffset(nxt)


def test_deleted_records_fail_the_read_unless_told_to_skip(kafka_bootstrap: str) -> None:
    topic = createTopic(kafka_bootstrap)
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(10):
        plain.produce(topic, f"r{i}".encode())
    plain.flush(30)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.delete_records([TopicPartition(topic, 0, 6)])[TopicPartition(topic, 0, 6)].result(60)
    strict = reader(kafka_bootstrap, topic)
    with pytest.raises(KafkaSourceError, match="deleted before they were read"):
        list(readRange(strict.settings, KafkaRange(topic, 0, 2, 10)))
    lenient = reader(kafka_bootstrap, topic, failOnDataLoss="false")
    ranged = readRange(lenient.settings, KafkaRange(topic, 0, 2, 10))
    rows = [row for batch in ranged for row in batch.to_pylist()]
    assert texts(rows) == ["r6", "r7", "r8", "r9"]


def test_offsets_the_broker_never_answered_are_asked_again_never_taken(
    kafka_bootstrap: str, proxies: Toxiproxy
) -> None:
    """librdkafka answers a ListOffsets that timed out with offset -1001 and no error: taken
    for an offset, it read as "offsets went back" and under AvailableNow as "nothing new", so
    a run ended as if drained. Through a partitioned proxy the listing now fails naming the
    partitions and the options that bound it; healed while asked again, it is the real one."""
    topic = createTopic(kafka_bootstrap, partitions=2)
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(10):
        plain.produce(topic, f"r{i}".encode(), partition=i % 2)
    plain.flush(30)
    proxy = proxies.proxy("kafka")
    bounds = {"requestTimeoutSeconds": "2", "fetchOffset.retryIntervalMs": "200"}
    strict = reader(proxy.listen, topic, **bounds, **{"fetchOffset.numRetries": "1"})
    patient = reader(proxy.listen, topic, **bounds, **{"fetchOffset.numRetries": "6"})
    partitions = strict.topicPartitions()
    assert strict.listOffsets(partitions, "latest") == {(topic, 0): 5, (topic, 1): 5}
    assert patient.listOffsets(partitions, "latest") == {(topic, 0): 5, (topic, 1): 5}
    proxy.partition()
    started = time.monotonic()
    with pytest.raises(
        KafkaSourceError,
        match=rf"cannot list latest offsets of 2 partition\(s\): no answer for {topic}-0, "
        rf"{topic}-1 within requestTimeoutSeconds \(2 s\) \(2 tries; .*fetchOffset.numRetries",
    ):
        strict.listOffsets(partitions, "latest")
    assert time.monotonic() - started < 12
    healing = threading.Timer(3.0, proxy.heal)
    healing.start()
    try:
        assert patient.listOffsets(partitions, "latest") == {(topic, 0): 5, (topic, 1): 5}
    finally:
        healing.join()


def test_an_unreachable_cluster_is_a_clear_error() -> None:
    r = reader("127.0.0.1:1", "t", requestTimeoutSeconds="3")
    started = time.monotonic()
    with pytest.raises(KafkaSourceError, match=r"cannot read metadata from 127\.0\.0\.1:1"):
        r.initialOffset()
    assert time.monotonic() - started < 30


def test_max_rows_limit_from_spark_is_honoured(kafka_bootstrap: str) -> None:
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from twophase.spark.kafka import KafkaStreamReader

    topic = createTopic(kafka_bootstrap)
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(5):
        plain.produce(topic, f"r{i}".encode())
    plain.flush(30)
    r = KafkaStreamReader(reader(kafka_bootstrap, topic, startingOffsets="earliest").settings)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(3))
    assert end == {topic: {"0": 3}}
    parts = r.partitions(start, end)
    got = [row["value"] for p in parts for batch in r.read(p) for row in batch.to_pylist()]
    assert got == [b"r0", b"r1", b"r2"]
    r.stop()
