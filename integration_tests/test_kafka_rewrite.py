"""Decided Kafka transactions the broker aborted (its transaction timeout), written again once.

The coordinator and the Kafka sink against the real broker, no Spark: a batch whose commit comes
after the timeout of some of its transactions, the restart's recovery, and the replay's handles
for the lost partitions, checked against the decided fingerprints. What a user sees is read with
a ``read_committed`` consumer. The Spark end to end runs are in test_kafka_spark.py.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest

from integration_tests.test_kafka_helpers import createTopic, readTopic, values
from integration_tests.test_kafka_participant import prepare, sink, state
from twophase.cli.status import status
from twophase.coordinator import Coordinator, CoordinatorSettings, DecisionLog
from twophase.coordinator.errors import RewriteMismatchError, RewritePendingError
from twophase.protocol import TaskResult
from twophase.sinks.kafka import KafkaCommitter, KafkaWriter

TIMEOUT = {"kafka.transaction.timeout.ms": "3000"}


def result(handle: dict[str, Any] | None, partition: int, rows: int = 0) -> TaskResult:
    return TaskResult("it-sink", "q", 0, partition, 0, handle, rows)


def timedOut(bootstrap: str, w: KafkaWriter, *texts: str, partition: int) -> dict[str, Any]:
    """A prepared handle whose transaction the broker has aborted (timeout + its sweep)."""
    handle = prepare(w, *texts, partition=partition)
    deadline = time.monotonic() + 60
    while state(bootstrap, handle["transactionalId"]) != "CompleteAbort":
        assert time.monotonic() < deadline, "the broker never aborted the transaction"
        time.sleep(0.5)
    return handle


def logOf(checkpoint: Path) -> DecisionLog:
    return DecisionLog(str(checkpoint / "twophase" / "it-sink"))


def coordinator(c: KafkaCommitter, checkpoint: Path, **settings: Any) -> Coordinator:
    """A coordinator as a fresh process would build it (nothing kept between calls)."""
    return Coordinator(
        c, logOf(checkpoint), "it-sink", CoordinatorSettings(commitRetries=2, **settings)
    )


@pytest.mark.timeout(180)
def test_a_batch_committed_after_the_timeout_is_rewritten_once_by_its_replay(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = createTopic(kafka_bootstrap)
    w, c = sink(kafka_bootstrap, topic, **TIMEOUT)
    late = timedOut(kafka_bootstrap, w, "b0", "b1", partition=1)  # a slow batch's first task
    early = prepare(w, "a0", "a1", partition=0)
    with pytest.raises(RewritePendingError) as info:
        coordinator(c, tmp_path).commitBatch(0, [result(early, 0, 2), result(late, 1, 2)])
    text = str(info.value)
    assert "batch 0" in text and "partitions [1]" in text and "restart the query" in text
    assert info.value.again == [] and "kafka.transaction.timeout.ms" not in text
    assert sorted(values(readTopic(kafka_bootstrap, topic))) == ["a0", "a1"]

    # The restart: recovery leaves partition 1 for the replay, the batch stays decided.
    report = coordinator(c, tmp_path).recover()
    assert dict(report.awaitingRewrite) == {0: (1,)} and report.batchesFinished == ()
    state0 = logOf(tmp_path).state(0)
    assert state0 is not None and state0.awaitingRewrite == (1,)
    shown = io.StringIO()
    status(str(tmp_path), None, False, shown)
    assert "partitions [1] were aborted by the system" in shown.getvalue(), shown.getvalue()

    # A replay as slow as the batch was: its own transaction outlives the timeout as well, and
    # the error says restarting alone will not do.
    slow = timedOut(kafka_bootstrap, KafkaWriter(w.settings), "b0", "b1", partition=1)
    with pytest.raises(RewritePendingError) as info:
        coordinator(c, tmp_path).commitBatch(0, [result(None, 0), result(slow, 1, 2)])
    text = str(info.value)
    assert info.value.again == [1] and "kafka.transaction.timeout.ms" in text, text
    assert coordinator(c, tmp_path).recover().awaitingRewrite == {0: (1,)}

    # The replay: the same records in another order, from a new producer; partition 0 skipped.
    writer = KafkaWriter(w.settings)
    again = prepare(writer, "b1", "b0", partition=1)
    assert again["fingerprint"] == late["fingerprint"]
    outcome = coordinator(c, tmp_path).commitBatch(0, [result(None, 0), result(again, 1, 2)])
    assert outcome.handles == 2
    assert sorted(values(readTopic(kafka_bootstrap, topic))) == ["a0", "a1", "b0", "b1"]
    done = logOf(tmp_path).state(0)
    assert done is not None and done.awaitingRewrite == () and done.lostPartitions == (1,)
    # A second replay of the committed batch writes nothing more.
    assert coordinator(c, tmp_path).recover().idle
    assert sorted(values(readTopic(kafka_bootstrap, topic))) == ["a0", "a1", "b0", "b1"]


@pytest.mark.timeout(180)
def test_a_replay_with_other_records_is_refused_unless_the_option_accepts_it(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = createTopic(kafka_bootstrap)
    w, c = sink(kafka_bootstrap, topic, **TIMEOUT)
    lost = timedOut(kafka_bootstrap, w, "x", "y", partition=0)
    with pytest.raises(RewritePendingError):
        coordinator(c, tmp_path).commitBatch(0, [result(lost, 0, 2)])
    assert coordinator(c, tmp_path).recover().awaitingRewrite == {0: (0,)}

    other = prepare(KafkaWriter(w.settings), "x", "z", partition=0)
    with pytest.raises(RewriteMismatchError) as info:
        coordinator(c, tmp_path).commitBatch(0, [result(other, 0, 2)])
    text = str(info.value)
    assert "batch 0" in text and "partition 0: the same 2 records in number" in text
    assert "twophase.rewriteMismatch=write" in text
    assert readTopic(kafka_bootstrap, topic, isolation="read_uncommitted") != []
    assert readTopic(kafka_bootstrap, topic) == []  # nothing of the replay is visible
    assert state(kafka_bootstrap, other["transactionalId"]) == "CompleteAbort"

    fewer = prepare(KafkaWriter(w.settings), "x", partition=0)
    accepting = coordinator(c, tmp_path, rewriteMismatch="write")
    accepting.commitBatch(0, [result(fewer, 0, 1)])
    assert values(readTopic(kafka_bootstrap, topic)) == ["x"]
    assert coordinator(c, tmp_path).recover().idle


@pytest.mark.timeout(180)
def test_a_replay_that_gives_the_lost_partitions_records_to_each_other_is_taken(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Spark's Kafka source may order a batch's topic partitions otherwise after a restart:
    the lost partitions' records come back in one another's tasks. Each replay handle matches
    one lost partition's fingerprint, so all are taken, each record once. A replay that moves
    a committed partition's records into a lost one's task is refused, nothing doubled."""
    topic = createTopic(kafka_bootstrap)
    w, c = sink(kafka_bootstrap, topic, **TIMEOUT)
    first = timedOut(kafka_bootstrap, w, "p0", partition=0)
    second = timedOut(kafka_bootstrap, w, "p1a", "p1b", partition=1)
    with pytest.raises(RewritePendingError):
        coordinator(c, tmp_path).commitBatch(0, [result(first, 0, 1), result(second, 1, 2)])
    assert coordinator(c, tmp_path).recover().awaitingRewrite == {0: (0, 1)}
    writer = KafkaWriter(w.settings)
    swapped = [prepare(writer, "p1a", "p1b", partition=0), prepare(writer, "p0", partition=1)]
    coordinator(c, tmp_path).commitBatch(0, [result(swapped[0], 0, 2), result(swapped[1], 1, 1)])
    assert sorted(values(readTopic(kafka_bootstrap, topic))) == ["p0", "p1a", "p1b"]
    assert coordinator(c, tmp_path).recover().idle

    checkpoint = tmp_path / "one-lost"
    lost = timedOut(kafka_bootstrap, w, "q1", partition=1)
    kept = prepare(w, "q0", partition=0)
    with pytest.raises(RewritePendingError):
        coordinator(c, checkpoint).commitBatch(0, [result(kept, 0, 1), result(lost, 1, 1)])
    assert coordinator(c, checkpoint).recover().awaitingRewrite == {0: (1,)}
    moved = prepare(KafkaWriter(w.settings), "q0", partition=1)  # partition 0's, committed
    with pytest.raises(RewriteMismatchError):
        coordinator(c, checkpoint).commitBatch(0, [result(None, 0), result(moved, 1, 1)])
    assert sorted(values(readTopic(kafka_bootstrap, topic))) == ["p0", "p1a", "p1b", "q0"]
