"""A ``read_committed`` consumer reading a Kafka pipeline's output while its chaos runs.

Kafka's own transaction tests run such a reader beside the writers: whatever the faults do to
the writers, a ``read_committed`` reader must never see a record of an aborted transaction,
nor a record twice. This one follows the output topic from the first start until the source
is drained and it has caught up, and its records are compared with what the source offered,
as ``twophase verify`` compares the topic afterwards.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pyarrow as pa

POLL_SECONDS = 0.5
STALL_SECONDS = 60.0
"""A reader that got nothing for this long while committed records wait past its positions is
stuck (seen once per 1,000 faults: a librdkafka consumer that stopped fetching after its
connections timed out through a frozen then partitioned broker); it is replaced by a new
consumer at the same positions, and the report counts it."""


class LiveReader:
    """Consumes ``topic`` at ``bootstrap`` in a thread from :meth:`start` to :meth:`finish`.

    Every call on the consumer is made by that thread: a consumer is not shared across threads.
    """

    def __init__(self, bootstrap: str, topic: str, stallSeconds: float = STALL_SECONDS) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.stallSeconds = stallSeconds
        self.replaced: list[str] = []
        """Each stuck consumer replaced: where it stood."""
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.errors: list[str] = []
        self.lastRecordAt: float | None = None
        """When the last record arrived (``time.monotonic``)."""
        self.positions: list[tuple[int, int, int]] = []
        """At the end: each partition's position and high watermark, when they could be read."""
        self._finishBy: float | None = None
        self._finishing = threading.Event()
        self._pausing = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"live-reader-{topic}", daemon=True)

    def start(self) -> LiveReader:
        self._thread.start()
        return self

    def pause(self) -> None:
        """Stop the consumer fetching, as a stuck client does, until it is replaced."""
        self._pausing.set()

    def _consumer(self, positions: list[Any] | None) -> Any:
        """A new consumer, assigned (not subscribed: a group rebalance, when the broker is cut
        off for longer than the session timeout, would start it again from the beginning) at
        ``positions``, or at the beginning of every partition."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"chaos-live-reader-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "log.connection.close": False,  # faults close connections: that is the point
            }
        )
        if positions is None:
            topic = consumer.list_topics(self.topic, timeout=30).topics[self.topic]
            positions = [
                TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in sorted(topic.partitions)
            ]
        consumer.assign(positions)
        return consumer

    def _run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING

        consumer = self._consumer(None)
        try:
            checked = time.monotonic()
            while True:
                if self._pausing.is_set():
                    consumer.pause(consumer.assignment())
                    self._pausing.clear()
                for message in consumer.consume(num_messages=500, timeout=POLL_SECONDS):
                    if message.error():
                        self.errors.append(str(message.error()))
                        continue
                    self.keys.append(message.key())
                    self.values.append(message.value())
                    self.lastRecordAt = time.monotonic()
                if self._finishing.is_set() and (
                    time.monotonic() > (self._finishBy or 0) or self._caughtUp(consumer)
                ):
                    self.positions = self._ends(consumer)
                    return
                now = time.monotonic()
                quiet = now - max(self.lastRecordAt or 0.0, checked)
                if quiet > self.stallSeconds:
                    checked = now
                    if self._waiting(consumer):  # committed records wait: stuck
                        stuck = consumer.position(consumer.assignment())
                        self.replaced.append(
                            ", ".join(f"p{tp.partition} at {tp.offset}" for tp in stuck)
                        )
                        for tp in stuck:  # nothing read there yet: from the beginning
                            tp.offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                        consumer.close()
                        consumer = self._consumer(stuck)
        finally:
            consumer.close()

    def _ends(self, consumer: Any) -> list[tuple[int, int, int]]:
        """Each assigned partition's position and high watermark (empty when unreadable)."""
        from confluent_kafka import TopicPartition

        try:
            return [
                (
                    tp.partition,
                    tp.offset,
                    consumer.get_watermark_offsets(
                        TopicPartition(tp.topic, tp.partition), timeout=10
                    )[1],
                )
                for tp in consumer.position(consumer.assignment())
            ]
        except Exception as e:
            self.errors.append(f"positions: {e}")
            return []

    def diagnosis(self) -> str:
        """For a reader that missed records: when it last got one, where it stood, its errors."""
        since = (
            f"{time.monotonic() - self.lastRecordAt:.0f} s before the end"
            if self.lastRecordAt is not None
            else "never"
        )
        ends = ", ".join(f"p{p} at {pos} of {high}" for p, pos, high in self.positions)
        errors = "; ".join(self.errors[-5:]) or "none"
        replaced = "; ".join(self.replaced) or "none"
        return (
            f"last record {since}; positions {ends or 'unknown'}; "
            f"{len(self.errors)} error(s), the last: {errors}; stuck consumers replaced: "
            f"{replaced}"
        )

    def _waiting(self, consumer: Any) -> bool:
        """Whether committed records lie past the reader's position in some partition (a
        read_committed consumer's watermark query answers the last stable offset)."""
        from confluent_kafka import TopicPartition

        try:
            for tp in consumer.position(consumer.assignment()):
                _, stable = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=10, cached=False
                )
                if stable > max(tp.offset, 0):
                    return True
        except Exception as e:  # a broker that does not answer: not the reader's fault
            self.errors.append(f"positions: {e}")
        return False

    def _caughtUp(self, consumer: Any) -> bool:
        """Whether the reader's positions are the partitions' ends (a transaction still open
        holds a read_committed reader back until it ends)."""
        from confluent_kafka import TopicPartition

        try:
            assigned = consumer.assignment()
            if not assigned:
                return False
            for tp in consumer.position(assigned):
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=10
                )
                if tp.offset < high:
                    return False
            return True
        except Exception as e:  # a broker that does not answer yet: try again
            self.errors.append(f"positions: {e}")
            return False

    def finish(self, limit: float = 90.0) -> pa.Table:
        """Once the topic's ends are read, or ``limit`` seconds passed, stop; the records."""
        self._finishBy = time.monotonic() + limit
        self._finishing.set()
        self._thread.join(timeout=limit + 60)
        return pa.table(
            {"key": pa.array(self.keys, pa.binary()), "value": pa.array(self.values, pa.binary())}
        )
