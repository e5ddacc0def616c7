"""How the Kafka committer settles a commit the broker will not end, against the real broker.

EndTxn refuses a transaction whose producer id or epoch is no longer current; the committer then
reads the transaction's last record back: visible (committed before), not readable yet (still
open), or deleted (cannot be told). Each answer is made by the broker itself on one topic: a
fencing producer, an open transaction, deleted records. Also the warning for an old transaction
and recovery on a cluster that cannot list transactions.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pyarrow as pa
import pytest
import tenacity
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka.protocol.broker_version_data import BrokerVersionData

from integration_tests.test_kafka_helpers import createTopic, unique
from twophase.protocol import CommitStatus, RecoveryScope, TransactionContext, TransientCommitError
from twophase.sinks.kafka import KafkaCommitError, KafkaCommitter, KafkaWriter


@pytest.fixture(scope="module")
def topic(kafka_bootstrap: str) -> str:
    return createTopic(kafka_bootstrap, prefix="it-outcome")


def sink(bootstrap: str, topic: str) -> tuple[KafkaWriter, KafkaCommitter]:
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "topic": topic,
        "transactionalIdPrefix": unique("it-o"),
    }
    return KafkaWriter.fromOptions(options), KafkaCommitter.fromOptions(options)


def prepare(w: KafkaWriter, *texts: str) -> dict[str, Any]:
    txn = w.beginTransaction(TransactionContext("it-sink", "q", 0, 0, 0))
    w.write(txn, pa.RecordBatch.from_pydict({"value": list(texts)}))
    return w.preCommit(txn)


def retried(call: Any, handle: dict[str, Any]) -> Any:
    """As the coordinator calls: again after a TransientCommitError (EndTxn right after another
    EndTxn of the same id answers CONCURRENT_TRANSACTIONS until the first completes), for at
    most 30 s."""
    again = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(TransientCommitError),
        stop=tenacity.stop_after_delay(30),
        wait=tenacity.wait_fixed(0.1),
        reraise=True,
    )
    return again(call, handle)


def fence(bootstrap: str, transactionalId: str) -> None:
    """What a newer producer of the same id does: bump the epoch, so EndTxn refuses the old."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactionalId})
    producer.init_transactions(30)


def test_a_commit_refused_for_a_transaction_committed_before_is_already_committed(
    kafka_bootstrap: str, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    w, c = sink(kafka_bootstrap, topic)
    handle = prepare(w, "once")
    nowMs = int(time.time() * 1000)
    with caplog.at_level(logging.WARNING, logger="twophase.sinks.kafka"):
        assert c.commit({**handle, "startedAtMs": nowMs, "transactionTimeoutMs": 60000}) is None
        assert "open for" not in caplog.text
        old = {**handle, "startedAtMs": nowMs - 40000, "transactionTimeoutMs": 60000}
        assert retried(c.commit, old) is None  # again with the same epoch: the broker's NONE
    assert "has been open for 40 s" in caplog.text and "transaction.timeout.ms" in caplog.text
    fence(kafka_bootstrap, handle["transactionalId"])
    assert retried(c.commit, handle) is CommitStatus.ALREADY_COMMITTED  # refused, but visible
    retried(c.abort, handle)  # refused too: the transaction is gone, nothing to abort
    retried(c.abort, handle)
    assert retried(c.commit, handle) is CommitStatus.ALREADY_COMMITTED  # still visible
    # Retention (or an administrator) deleted the records: nobody can tell any more.
    probe = handle["probe"]
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    upTo = TopicPartition(topic, probe["partition"], -1)  # -1: up to the high watermark
    admin.delete_records([upTo])[upTo].result(60)
    with pytest.raises(KafkaCommitError, match="cannot be told"):
        retried(c.commit, handle)


def test_a_commit_refused_while_the_transaction_is_open_is_retried(
    kafka_bootstrap: str, topic: str
) -> None:
    """The broker refuses another producer id on the transactional id; the transaction's
    records sit above the last stable offset, so the outcome is not readable yet."""
    w, c = sink(kafka_bootstrap, topic)
    handle = prepare(w, "open")
    with pytest.raises(TransientCommitError, match="not readable yet"):
        c.commit({**handle, "producerId": handle["producerId"] + 1000})
    retried(c.abort, handle)


def test_without_a_transaction_listing_recovery_warns_once(
    kafka_bootstrap: str, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker older than Kafka 3.0 has no ListTransactions. The test broker is newer, so the
    driver's client is told what such a broker answers to ApiVersions (the one external answer
    replaced); the client, the committer and the sweep run as they are."""
    options = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "topic": topic,
        "kafka.client.id": unique("it-old-broker"),  # a client of its own, not the shared one
    }
    c = KafkaCommitter.fromOptions(options)
    c.client()._client()._manager.broker_version_data = BrokerVersionData((2, 8))
    with caplog.at_level(logging.WARNING, logger="twophase.sinks.kafka"):
        assert c.recoverAndAbort(RecoveryScope("s")) == []
        assert c.recoverAndAbort(RecoveryScope("s")) == []
    assert caplog.text.count("cannot list transactions") == 1
