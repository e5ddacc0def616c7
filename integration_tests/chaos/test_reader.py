"""The chaos harness's live reader: a stuck consumer is replaced at its positions."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from integration_tests.chaos.reader import LiveReader
from integration_tests.test_kafka_helpers import createTopic, unique


def produceCommitted(bootstrap: str, topic: str, keys: range) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("it-reader")})
    producer.init_transactions(60)
    producer.begin_transaction()
    for i in keys:
        producer.produce(topic, b"v%d" % i, key=b"%d" % i, partition=i % 2)
    producer.commit_transaction(60)


def waitFor(reader: LiveReader, count: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while len(reader.keys) < count and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.mark.timeout(180)
def test_a_reader_that_stops_fetching_is_replaced_and_misses_nothing(kafka_bootstrap: str) -> None:
    """A consumer that fetches nothing while committed records wait (here: paused, as a
    client that stopped fetching) is replaced by one at the same positions; the records are
    then all read, once each, and the replacement is reported."""
    topic = createTopic(kafka_bootstrap, partitions=2)
    reader = LiveReader(kafka_bootstrap, topic, stallSeconds=3).start()
    try:
        produceCommitted(kafka_bootstrap, topic, range(100))
        waitFor(reader, 100, 60)
        assert len(reader.keys) == 100 and reader.replaced == []
        reader.pause()
        time.sleep(1.5)  # the pause lands before the next records
        produceCommitted(kafka_bootstrap, topic, range(100, 200))
        waitFor(reader, 200, 60)
    finally:
        table = reader.finish(30)
    keys = sorted(int(k) for k in table.column("key").to_pylist())
    assert keys == list(range(200))
    assert len(reader.replaced) == 1 and "stuck consumers replaced: p" in reader.diagnosis()
