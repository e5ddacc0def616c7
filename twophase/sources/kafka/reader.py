"""Reading one range ``[start, end)`` of a Kafka topic partition into Arrow batches.

A range always returns the same records: the reader stops at the first record at or after
``end``, or when the consumer reports the end of the partition at or past ``end``. The last
offsets of a range are often transaction markers, which no consumer ever receives, so "stop
at end - 1" would wait forever. Columns are those of Spark's Kafka source: ``key`` binary,
``value`` binary, ``topic`` string, ``partition`` int, ``offset`` long, ``timestamp``
timestamp, ``timestampType`` int (0 create time, 1 log append time), and with
``includeHeaders`` ``headers`` array<struct<key string, value binary>>. Spark-free: Spark's
tasks and verify both read through ``readRange``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from twophase.clients.kafka import newClient
from twophase.clients.kafka.logs import ClientLog
from twophase.redaction import getLogger, redact
from twophase.sources.kafka.errors import KafkaSourceError
from twophase.sources.kafka.offsets import KafkaRange
from twophase.sources.kafka.settings import KafkaSourceSettings

log = getLogger(__name__)

_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

CONSUME_TIMEOUT_SECONDS = 0.2
"""How long one consume call waits for the events it asked for (transaction markers at the end
of a range take offsets but yield no event, so the last call may wait this long)."""

_TIMESTAMP_TYPES = {0: -1, 1: 0, 2: 1}
"""librdkafka's timestamp types -> Kafka's (and Spark's) ids: none -1, create 0, append 1."""


def readRange(settings: KafkaSourceSettings, r: KafkaRange) -> Iterator[pa.RecordBatch]:
    """The records of ``[r.start, r.end)`` of one topic partition, in Arrow batches.

    Stops at the first record at or after ``r.end``, or when the consumer reports the end of
    the partition at or after ``r.end`` (the trailing offsets can be transaction markers or
    aborted records, which a ``read_committed`` consumer never receives).
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    config: dict[str, Any] = dict(settings.consumerConfig)
    config.setdefault("group.id", f"twophase-kafka-source-{uuid.uuid4().hex[:12]}")
    config.update(
        {"enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "error"}
    )
    config.setdefault("logger", ClientLog("consumer"))
    consumer = newClient(Consumer, config, "consumer")
    where = f"{r.topic}-{r.partition} [{r.start}, {r.end})"
    try:
        consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
        builder = RecordBatchBuilder(r.topic, r.partition, settings.includeHeaders)
        lastProgress = time.monotonic()
        nextOffset = r.start
        done = False
        while not done:
            # consume() returns when it has as many events as asked for, else at its timeout:
            # ask for no more than the range can still hold, so that the call that reads the
            # range's last record (offset end - 1) returns at once.
            wanted = min(settings.maxRecordsPerArrowBatch, max(1, r.end - nextOffset))
            messages = consumer.consume(wanted, CONSUME_TIMEOUT_SECONDS)
            if not messages:
                if time.monotonic() - lastProgress > settings.pollTimeoutSeconds:
                    raise KafkaSourceError(
                        f"kafka source: no progress reading {where} for "
                        f"{settings.pollTimeoutSeconds:.0f} s (broker down?)"
                    )
                continue
            lastProgress = time.monotonic()
            for message in messages:
                error = message.error()
                offset = message.offset()
                offset = -1 if offset is None else offset
                if error is not None:
                    code = error.code()
                    if code == KafkaError._PARTITION_EOF:
                        if offset >= r.end:
                            done = True
                            break
                        continue  # more records are being appended or replicated
                    if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        skipped = _outOfRange(settings, consumer, r, where, redact(error.str()))
                        if skipped is None:
                            done = True
                            break
                        consumer.assign([TopicPartition(r.topic, r.partition, skipped)])
                        break
                    raise KafkaSourceError(f"kafka source: reading {where}: {redact(error.str())}")
                if offset >= r.end:
                    done = True
                    break
                nextOffset = offset + 1
                builder.add(message)
                if offset == r.end - 1:
                    done = True
                    break
            if builder.rows >= settings.maxRecordsPerArrowBatch:
                yield builder.build()
        if builder.rows:
            yield builder.build()
    finally:
        consumer.close()


def _outOfRange(
    settings: KafkaSourceSettings, consumer: Any, r: KafkaRange, where: str, detail: str
) -> int | None:
    """Offsets of the range were deleted: fail, or return where to continue (None: nothing)."""
    from confluent_kafka import TopicPartition

    low, _ = consumer.get_watermark_offsets(
        TopicPartition(r.topic, r.partition), timeout=settings.pollTimeoutSeconds, cached=False
    )
    message = (
        f"offsets of {where} before {low} were deleted before they were read ({detail}); "
        "records lost to this query"
    )
    if settings.failOnDataLoss:
        raise KafkaSourceError(
            f"kafka source: {message}. Set option failOnDataLoss=false to skip them."
        )
    log.warning("kafka source: %s", message)
    return low if low < r.end else None


class RecordBatchBuilder:
    """Collects the messages of one topic partition column by column into Arrow batches."""

    def __init__(self, topic: str, partition: int, headers: bool) -> None:
        self.topic = topic
        self.partition = partition
        self.headers = headers
        self._reset()

    def _reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.timestampTypes: list[int] = []
        self.headerValues: list[list[dict[str, Any]] | None] = []

    @property
    def rows(self) -> int:
        return len(self.offsets)

    def add(self, message: Any) -> None:
        self.keys.append(message.key())
        self.values.append(message.value())
        self.offsets.append(message.offset())
        kind, stamp = message.timestamp()
        self.timestamps.append(stamp * 1000 if kind else None)
        self.timestampTypes.append(_TIMESTAMP_TYPES.get(kind, -1))
        if self.headers:
            raw = message.headers()
            self.headerValues.append(
                [{"key": k, "value": v} for k, v in raw] if raw is not None else None
            )

    def build(self) -> pa.RecordBatch:
        rows = self.rows
        arrays = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(self.topic, pa.string()), rows),
            pa.repeat(pa.scalar(self.partition, pa.int32()), rows),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
            pa.array(self.timestampTypes, pa.int32()),
        ]
        names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
        if self.headers:
            arrays.append(pa.array(self.headerValues, _HEADER_TYPE))
            names.append("headers")
        batch = pa.RecordBatch.from_arrays(arrays, names=names)
        self._reset()
        return batch


def recordSchema(includeHeaders: bool) -> pa.Schema:
    """The Arrow schema of the batches ``readRange`` returns."""
    return RecordBatchBuilder("", 0, includeHeaders).build().schema
