"""Reading ranges ``[start, end)`` of Kafka topic partitions into Arrow batches.

A range always returns the same records: the reader stops at the first record at or after
``end``, or when the consumer reports the end of the partition at or past ``end``. The last
offsets of a range are often transaction markers, which no consumer ever receives, so "stop
at end - 1" would wait forever. Columns are those of Spark's Kafka source: ``key`` binary,
``value`` binary, ``topic`` string, ``partition`` int, ``offset`` long, ``timestamp``
timestamp, ``timestampType`` int (0 create time, 1 log append time), and with
``includeHeaders`` ``headers`` array<struct<key string, value binary>>. Spark-free: Spark's
tasks (``readRanges``, several ranges with one consumer) and verify (``readRange``) read
through the same code.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from twophase.clients.kafka import newClient
from twophase.clients.kafka.logs import ClientLog
from twophase.redaction import getLogger, redact
from twophase.sources.kafka.errors import KafkaSourceError, KafkaSourceUnreachableError
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
    """The records of ``[r.start, r.end)`` of one topic partition, in Arrow batches."""
    for _, batch in readRanges(settings, (r,)):
        yield batch


def readRanges(
    settings: KafkaSourceSettings, ranges: Sequence[KafkaRange]
) -> Iterator[tuple[KafkaRange, pa.RecordBatch]]:
    """The records of each range, in Arrow batches of one range each, read by one consumer.

    The ranges of distinct topic partitions are fetched together (one consumer assigned to all
    of them, so their fetches share requests); two ranges of one topic partition are read one
    after the other. A range stops at its first record at or after its end, or when the
    consumer reports the end of the partition at or after it (the trailing offsets can be
    transaction markers or aborted records, which a ``read_committed`` consumer never gets).
    """
    from confluent_kafka import Consumer

    config: dict[str, Any] = dict(settings.consumerConfig)
    config.setdefault("group.id", f"twophase-kafka-source-{uuid.uuid4().hex[:12]}")
    config.update(
        {"enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "error"}
    )
    config.setdefault("logger", ClientLog("consumer"))
    consumer = newClient(Consumer, config, "consumer")
    try:
        for together in _rounds(ranges):
            yield from _readTogether(settings, consumer, together)
    finally:
        consumer.close()


def _rounds(ranges: Sequence[KafkaRange]) -> list[list[KafkaRange]]:
    """The ranges in rounds that hold each topic partition at most once, in order."""
    rounds: list[list[KafkaRange]] = []
    for r in ranges:
        for together in rounds:
            if all((o.topic, o.partition) != (r.topic, r.partition) for o in together):
                together.append(r)
                break
        else:
            rounds.append([r])
    return rounds


class _Reading:
    """One range being read: where it is, and its records not yet returned."""

    def __init__(self, r: KafkaRange, headers: bool) -> None:
        self.range = r
        self.next = r.start
        self.done = False
        self.builder = RecordBatchBuilder(r.topic, r.partition, headers)
        self.where = f"{r.topic}-{r.partition} [{r.start}, {r.end})"


def _readTogether(
    settings: KafkaSourceSettings, consumer: Any, ranges: Sequence[KafkaRange]
) -> Iterator[tuple[KafkaRange, pa.RecordBatch]]:
    """Ranges of distinct topic partitions, read with one assignment."""
    from confluent_kafka import KafkaError, TopicPartition

    reading = {(r.topic, r.partition): _Reading(r, settings.includeHeaders) for r in ranges}
    assigned = [TopicPartition(r.topic, r.partition, r.start) for r in ranges]
    consumer.assign(assigned)
    consumer.resume(assigned)  # a partition an earlier round paused
    lastProgress = time.monotonic()
    open_ = list(reading.values())
    while open_:
        # consume() returns when it has as many events as asked for, else at its timeout: ask
        # for no more than the ranges can still hold, so that the call that reads their last
        # records returns at once.
        left = sum(max(1, x.range.end - x.next) for x in open_)
        messages = consumer.consume(
            min(settings.maxRecordsPerArrowBatch, left), CONSUME_TIMEOUT_SECONDS
        )
        if not messages:
            if time.monotonic() - lastProgress > settings.pollTimeoutSeconds:
                raise KafkaSourceUnreachableError(
                    f"kafka source: no progress reading {', '.join(x.where for x in open_)} "
                    f"for {settings.pollTimeoutSeconds:.0f} s (broker down?)"
                )
            continue
        lastProgress = time.monotonic()
        for message in messages:
            x = reading.get((message.topic(), message.partition()))
            error = message.error()
            if x is None and error is not None:  # the client's, not a partition's
                where = ", ".join(o.where for o in open_)
                raise KafkaSourceUnreachableError(
                    f"kafka source: reading {where}: {redact(error.str())}"
                )
            if x is None or x.done:
                continue
            offset = message.offset()
            offset = -1 if offset is None else offset
            if error is not None:
                code = error.code()
                if code == KafkaError._PARTITION_EOF:
                    if offset >= x.range.end:
                        x.done = True
                    continue  # else more records are being appended or replicated
                if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    skipped = _outOfRange(settings, consumer, x.range, x.where, redact(error.str()))
                    if skipped is None:
                        x.done = True
                    else:
                        x.next = skipped
                        # Assign again from where each open range is: what was fetched of
                        # the others and not yet returned is fetched again.
                        consumer.assign(
                            [
                                TopicPartition(o.range.topic, o.range.partition, o.next)
                                for o in reading.values()
                                if not o.done
                            ]
                        )
                        break
                    continue
                failed = (
                    KafkaSourceError
                    if "AUTHORIZATION" in error.name()
                    else KafkaSourceUnreachableError
                )
                raise failed(f"kafka source: reading {x.where}: {redact(error.str())}")
            if offset >= x.range.end:
                x.done = True
                continue
            x.next = offset + 1
            x.builder.add(message)
            if offset == x.range.end - 1:
                x.done = True
        for x in open_:
            if x.builder.rows and (x.done or x.builder.rows >= settings.maxRecordsPerArrowBatch):
                yield x.range, x.builder.build()
        finished = [x for x in open_ if x.done]
        if finished:  # fetch no more of them
            consumer.pause([TopicPartition(x.range.topic, x.range.partition) for x in finished])
            open_ = [x for x in open_ if not x.done]


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
