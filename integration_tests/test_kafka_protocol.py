"""What the Kafka sink relies on, checked against the real broker (Kafka 4.1, default settings).

- The broker runs transaction version 2 (KIP-890), as every freshly formatted Kafka 4.x does.
- librdkafka nevertheless opens transaction-version-1 transactions (its request versions).
- EndTxn from another client (kafka-python, pinned to v3) commits such a transaction, and a
  repeat answers success; an abort after the commit is refused (INVALID_TXN_STATE).
- EndTxn v5 on the same kind of transaction would bump the epoch, after which a TV1 repeat looks
  fenced: the reason the sink pins EndTxn below v5.
- A transaction the broker aborts on its timeout is fenced (PRODUCER_FENCED, epoch bumped).
- A producer that is dropped without ``close()`` (garbage collection, interpreter exit) leaves
  its transaction open; ``close()`` aborts it.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka import KafkaAdminClient

from integration_tests.test_kafka_helpers import createTopic, readTopic, unique, values
from twophase.sinks.kafka import txn as wire
from twophase.sinks.kafka.txn import TransactionClient


class Stats:
    def __init__(self) -> None:
        self.eos: dict[str, Any] = {}

    def __call__(self, text: str) -> None:
        self.eos = json.loads(text)["eos"]


def openTransaction(
    bootstrap: str, topic: str, values: list[str], **config: Any
) -> tuple[Producer, str, int, int]:
    """A librdkafka transaction with ``values`` produced and flushed, left open."""
    stats = Stats()
    tid = unique("it-protocol-tx")
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": tid,
            "statistics.interval.ms": 50,
            "stats_cb": stats,
            **config,
        }
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value.encode())
    assert producer.flush(30) == 0
    deadline = time.monotonic() + 10
    while not stats.eos or stats.eos.get("producer_id", -1) < 0:
        assert time.monotonic() < deadline, "no statistics from librdkafka"
        producer.poll(0.05)
    return producer, tid, int(stats.eos["producer_id"]), int(stats.eos["producer_epoch"])


def describe(bootstrap: str, tid: str) -> Any:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return admin.describe_transactions([tid])[tid]
    finally:
        admin.close()


def test_the_broker_runs_the_kafka_4_default_transaction_version_2(kafka_bootstrap: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        features = admin.describe_features()
    finally:
        admin.close()
    assert features["transaction.version"]["finalized"][1] >= 2, features


def test_librdkafka_opens_transaction_version_1_transactions(kafka_bootstrap: str) -> None:
    """If this fails after a confluent-kafka upgrade, librdkafka started KIP-890 transactions:
    the EndTxn version pinned in twophase/sinks/kafka/txn.py must follow it."""
    topic = createTopic(kafka_bootstrap)
    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger(unique("it-rdkafka"))
    logger.addHandler(Capture())
    logger.setLevel(logging.DEBUG)
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": unique("it-protocol-tx"),
            "debug": "protocol",
            "logger": logger,
        }
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, b"x")
    producer.flush(30)
    producer.commit_transaction(60)
    producer.poll(0.1)
    sent: dict[str, set[int]] = {}
    for line in lines:
        match = re.search(r"Sent (\w+)Request \(v(\d+)", line)
        if match:
            sent.setdefault(match.group(1), set()).add(int(match.group(2)))
    assert sent.get("EndTxn") and max(sent["EndTxn"]) <= 4, sent
    assert sent.get("Produce") and max(sent["Produce"]) < 12, sent  # v12+ is KIP-890 part 2
    assert "AddPartitionsToTxn" in sent, sent  # TV2 clients let the broker add partitions


def test_end_txn_from_another_client_commits_and_a_repeat_is_a_no_op(
    kafka_bootstrap: str,
) -> None:
    topic = createTopic(kafka_bootstrap)
    producer, tid, pid, epoch = openTransaction(kafka_bootstrap, topic, ["a", "b", "c"])
    assert readTopic(kafka_bootstrap, topic) == []
    client = TransactionClient({"bootstrap.servers": kafka_bootstrap})
    try:
        assert client.endTransaction(tid, pid, epoch, commit=True) == wire.NONE
        assert values(readTopic(kafka_bootstrap, topic)) == ["a", "b", "c"]
        # Repeats (a crash after the commit, Spark calling commit twice) succeed, change nothing.
        for _ in range(2):
            assert client.endTransaction(tid, pid, epoch, commit=True) == wire.NONE
        assert describe(kafka_bootstrap, tid).producer_epoch == epoch  # TV1: no epoch bump
        # An abort cannot undo it.
        assert client.endTransaction(tid, pid, epoch, commit=False) == wire.INVALID_TXN_STATE
        assert values(readTopic(kafka_bootstrap, topic)) == ["a", "b", "c"]
    finally:
        client.close()
    del producer  # never close(): it would try to abort


def test_end_txn_v5_would_bump_the_epoch_and_make_a_repeat_look_fenced(
    kafka_bootstrap: str,
) -> None:
    from kafka.protocol.metadata import FindCoordinatorRequest
    from kafka.protocol.producer.transaction import EndTxnRequest

    topic = createTopic(kafka_bootstrap)
    producer, tid, pid, epoch = openTransaction(kafka_bootstrap, topic, ["x"])
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    manager = admin._manager

    async def endTxn(version: int) -> Any:
        found = await manager.send(
            FindCoordinatorRequest(key_type=1, coordinator_keys=[tid], min_version=4)
        )
        node = found.coordinators[0].node_id
        request = EndTxnRequest(
            transactional_id=tid,
            producer_id=pid,
            producer_epoch=epoch,
            committed=True,
            version=version,
        )
        return await manager.send(request, node_id=node)

    try:
        first = manager.run(endTxn, 5)
        assert first.error_code == wire.NONE
        assert first.producer_epoch == epoch + 1  # KIP-890: the broker bumped the epoch
        deadline = time.monotonic() + 30
        while describe(kafka_bootstrap, tid).state.value != "CompleteCommit":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        # The same commit repeated the TV1 way is now indistinguishable from a fenced producer.
        assert manager.run(endTxn, 3).error_code == wire.PRODUCER_FENCED
    finally:
        admin.close()
    assert values(readTopic(kafka_bootstrap, topic)) == ["x"]
    del producer


@pytest.mark.timeout(120)
def test_a_transaction_the_broker_times_out_is_fenced(kafka_bootstrap: str) -> None:
    topic = createTopic(kafka_bootstrap)
    producer, tid, pid, epoch = openTransaction(
        kafka_bootstrap, topic, ["late"], **{"transaction.timeout.ms": 3000}
    )
    deadline = time.monotonic() + 60  # the broker checks every 10 s (cleanup interval)
    while describe(kafka_bootstrap, tid).state.value != "CompleteAbort":
        assert time.monotonic() < deadline, describe(kafka_bootstrap, tid)
        time.sleep(1)
    assert describe(kafka_bootstrap, tid).producer_epoch == epoch + 1
    client = TransactionClient({"bootstrap.servers": kafka_bootstrap})
    try:
        assert client.endTransaction(tid, pid, epoch, commit=True) == wire.PRODUCER_FENCED
    finally:
        client.close()
    assert readTopic(kafka_bootstrap, topic) == []
    del producer


CHILD = """
import gc, json, sys, time
from confluent_kafka import Producer
bootstrap, topic, tid, mode = sys.argv[1:5]
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
producer.init_transactions(60)
producer.begin_transaction()
producer.produce(topic, b"kept")
assert producer.flush(30) == 0
if mode == "gc":
    del producer
    gc.collect()
    time.sleep(1)
elif mode == "close":
    producer.close()
# mode "exit": the interpreter ends with the producer still referenced
"""


@pytest.mark.parametrize(
    ("mode", "state"), [("gc", "Ongoing"), ("exit", "Ongoing"), ("close", "CompleteAbort")]
)
def test_only_close_aborts_an_open_transaction(kafka_bootstrap: str, mode: str, state: str) -> None:
    topic = createTopic(kafka_bootstrap)
    tid = unique(f"it-protocol-{mode}")
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), kafka_bootstrap, topic, tid, mode],
        check=True,
        timeout=120,
    )
    assert describe(kafka_bootstrap, tid).state.value == state
