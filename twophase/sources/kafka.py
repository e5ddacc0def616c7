"""``twophase.kafka`` (source): Kafka topics as a replayable stream, ``read_committed`` by default.

Options and output columns are those of Spark's own Kafka source, so a query moves between the
two by changing the format name:

- ``subscribe`` (comma-separated topics), ``subscribePattern`` (a regular expression matched
  against whole topic names) or ``assign`` (JSON ``{"topic": [0, 1]}``): exactly one;
- ``startingOffsets``: ``latest`` (default), ``earliest`` or JSON
  ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest; every partition named);
- ``maxOffsetsPerTrigger``: at most this many offsets per micro-batch, shared between
  partitions in proportion to their backlog;
- ``minPartitions``: split large ranges so a batch has at least this many tasks;
- ``failOnDataLoss`` (default true): fail when offsets were deleted before they were read, or a
  partition disappeared; false skips them with a warning;
- ``includeHeaders`` (default false): add the ``headers`` column;
- ``kafka.<name>``: librdkafka consumer properties; ``kafka.isolation.level`` defaults to
  ``read_committed`` (Spark's source defaults to ``read_uncommitted``), so a pipeline Kafka ->
  Spark -> ``twophase.kafka`` stays exactly-once.

Columns: ``key`` binary, ``value`` binary, ``topic`` string, ``partition`` int, ``offset``
long, ``timestamp`` timestamp, ``timestampType`` int (0 create time, 1 log append time), and
with ``includeHeaders`` ``headers`` array<struct<key string, value binary>>.

Offsets are Spark's JSON (``{"topic": {"partition": offset}}``), the next offset to read. The end
of a micro-batch is the partition's **last stable offset** under ``read_committed`` (its high
watermark otherwise), so a batch never waits for an open transaction. A range ``[start, end)``
always returns the same records: a task stops at the first record at or after ``end``, or when
the consumer reports the end of the partition at or past ``end``. The last offsets of a range
are often transaction markers, which no consumer ever receives, so "stop at end - 1" would
wait forever. New partitions are read from their first offset; deleted ones are reported.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from twophase.settings import (
    TwoPhaseConfigError,
    boolOption,
    floatOption,
    intOption,
    optionOf,
)
from twophase.sinks._kafka_config import librdkafkaConfig, librdkafkaError
from twophase.worker_gc import freezeWorkerHeap

log = logging.getLogger(__name__)

Offsets = dict[str, dict[str, int]]
"""Spark's Kafka offsets: topic -> partition (as a string) -> next offset."""

EARLIEST = -2
LATEST = -1

BASE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS_SCHEMA = "headers array<struct<key: string, value: binary>>"
_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

_FORBIDDEN_CONSUMER_OPTIONS = {
    "auto.offset.reset": "use the startingOffsets option (as with Spark's Kafka source)",
    "enable.auto.commit": "the source keeps its offsets in Spark's checkpoint and never commits",
    "group.instance.id": "the source assigns partitions itself and joins no group",
}

_CONSUMER_DEFAULTS = {"isolation.level": "read_committed"}


class KafkaSourceError(RuntimeError):
    """The source cannot go on: data loss, a deleted partition, or the cluster cannot be read."""


def _rows(offsets: Offsets) -> dict[tuple[str, int], int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


def _offsets(positions: Mapping[tuple[str, int], int]) -> Offsets:
    result: Offsets = {}
    for (topic, partition), offset in sorted(positions.items()):
        result.setdefault(topic, {})[str(partition)] = int(offset)
    return result


@dataclass(frozen=True)
class KafkaSourceSettings:
    """The Kafka source's options, validated once (``KafkaSourceSettings.fromOptions``)."""

    consumerConfig: dict[str, str] = field(hash=False)
    subscribe: tuple[str, ...] = ()
    subscribePattern: str | None = None
    assign: tuple[tuple[str, int], ...] = ()
    startingOffsets: str | Offsets = "latest"
    maxOffsetsPerTrigger: int | None = None
    minPartitions: int | None = None
    failOnDataLoss: bool = True
    includeHeaders: bool = False
    pollTimeoutSeconds: float = 120.0
    requestTimeoutSeconds: float = 30.0
    maxRecordsPerArrowBatch: int = 10000

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> KafkaSourceSettings:
        config = dict(_CONSUMER_DEFAULTS)
        config.update(librdkafkaConfig(options, forbidden=_FORBIDDEN_CONSUMER_OPTIONS))
        isolation = config["isolation.level"].strip().lower()
        if isolation not in ("read_committed", "read_uncommitted"):
            raise TwoPhaseConfigError(
                f"option kafka.isolation.level={isolation!r} must be read_committed or "
                "read_uncommitted"
            )
        config["isolation.level"] = isolation
        subscribe = optionOf(options, "subscribe")
        pattern = optionOf(options, "subscribePattern")
        assign = optionOf(options, "assign")
        chosen = [
            n
            for n, v in (
                ("subscribe", subscribe),
                ("subscribePattern", pattern),
                ("assign", assign),
            )
            if v is not None and v.strip()
        ]
        if len(chosen) != 1:
            raise TwoPhaseConfigError(
                "the kafka source needs exactly one of the options subscribe, subscribePattern "
                f"or assign; got {', '.join(chosen) or 'none'}"
            )
        topics: tuple[str, ...] = ()
        if subscribe:
            topics = tuple(t.strip() for t in subscribe.split(",") if t.strip())
        if pattern:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise TwoPhaseConfigError(
                    f"option subscribePattern={pattern!r} is not a regular expression: {exc}"
                ) from None
        assigned: tuple[tuple[str, int], ...] = ()
        if assign:
            assigned = _parseAssign(assign)
        starting: str | Offsets = "latest"
        text = (optionOf(options, "startingOffsets") or "latest").strip()
        if text.lower() in ("earliest", "latest"):
            starting = text.lower()
        else:
            starting = _parseOffsetsJson(text, "startingOffsets")
        maxOffsets = intOption(options, "maxOffsetsPerTrigger", 0, minimum=0) or None
        minPartitions = intOption(options, "minPartitions", 0, minimum=0) or None
        return cls(
            consumerConfig=config,
            subscribe=topics,
            subscribePattern=pattern.strip() if pattern else None,
            assign=assigned,
            startingOffsets=starting,
            maxOffsetsPerTrigger=maxOffsets,
            minPartitions=minPartitions,
            failOnDataLoss=boolOption(options, "failOnDataLoss", True),
            includeHeaders=boolOption(options, "includeHeaders", False),
            pollTimeoutSeconds=intOption(options, "kafkaConsumer.pollTimeoutMs", 120000, minimum=1)
            / 1000,
            requestTimeoutSeconds=floatOption(options, "requestTimeoutSeconds", 30.0),
            maxRecordsPerArrowBatch=intOption(options, "maxRecordsPerArrowBatch", 10000, minimum=1),
        )

    @property
    def readCommitted(self) -> bool:
        return self.consumerConfig["isolation.level"] == "read_committed"

    def schema(self) -> str:
        return f"{BASE_SCHEMA}, {HEADERS_SCHEMA}" if self.includeHeaders else BASE_SCHEMA

    def describeSubscription(self) -> str:
        if self.subscribe:
            return f"subscribe={','.join(self.subscribe)}"
        if self.subscribePattern:
            return f"subscribePattern={self.subscribePattern}"
        return f"assign={json.dumps(_assignJson(self.assign))}"


def _assignJson(assigned: Sequence[tuple[str, int]]) -> dict[str, list[int]]:
    result: dict[str, list[int]] = {}
    for topic, partition in assigned:
        result.setdefault(topic, []).append(partition)
    return result


def _parseAssign(text: str) -> tuple[tuple[str, int], ...]:
    try:
        value = json.loads(text)
        pairs = tuple((str(topic), int(p)) for topic, parts in value.items() for p in parts)
    except (ValueError, AttributeError, TypeError):
        raise TwoPhaseConfigError(
            f'option assign={text!r} must be JSON like {{"topicA": [0, 1], "topicB": [2]}}'
        ) from None
    if not pairs:
        raise TwoPhaseConfigError("option assign names no partition")
    return pairs


def _parseOffsetsJson(text: str, option: str) -> Offsets:
    try:
        value = json.loads(text)
        result = {
            str(topic): {str(int(p)): int(o) for p, o in parts.items()}
            for topic, parts in value.items()
        }
    except (ValueError, AttributeError, TypeError):
        raise TwoPhaseConfigError(
            f"option {option}={text!r} must be earliest, latest or JSON like "
            '{"topicA": {"0": 23, "1": -2}} (-2 earliest, -1 latest)'
        ) from None
    for topic, parts in result.items():
        for p, o in parts.items():
            if o < EARLIEST:
                raise TwoPhaseConfigError(
                    f"option {option}: offset {o} of {topic}-{p} is not valid (-2 earliest, "
                    "-1 latest, or 0 and more)"
                )
    return result


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """The offsets ``[start, end)`` of one topic partition that one task reads."""

    topic: str
    partition: int
    start: int
    end: int


class KafkaSource(DataSource):
    """Kafka as a stream: ``spark.readStream.format("twophase.kafka")`` after ``register``."""

    @classmethod
    def name(cls) -> str:
        return "twophase.kafka"

    def schema(self) -> str:
        freezeWorkerHeap()
        return KafkaSourceSettings.fromOptions(self.options).schema()

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        freezeWorkerHeap()
        return KafkaStreamReader(KafkaSourceSettings.fromOptions(self.options))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans offset ranges on the driver (admin requests) and reads them on executors."""

    def __init__(self, settings: KafkaSourceSettings) -> None:
        self.settings = settings
        self.availableNowEnd: dict[tuple[str, int], int] | None = None
        self._admin: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_admin"] = None
        return state

    # -- driver: planning -------------------------------------------------------------------

    def _adminClient(self) -> Any:
        if self._admin is None:
            from confluent_kafka import KafkaException
            from confluent_kafka.admin import AdminClient

            try:
                self._admin = AdminClient(dict(_clientConfig(self.settings.consumerConfig)))
            except KafkaException as exc:
                problem = librdkafkaError(exc, "admin client")
                if problem is not None:
                    raise problem from None
                raise
        return self._admin

    def _partitions(self) -> list[tuple[str, int]]:
        """The topic partitions the options select, from the cluster's metadata now."""
        from confluent_kafka import KafkaException

        try:
            metadata = self._adminClient().list_topics(timeout=self.settings.requestTimeoutSeconds)
        except KafkaException as exc:
            raise KafkaSourceError(
                f"kafka source: cannot read metadata from "
                f"{self.settings.consumerConfig['bootstrap.servers']}: {_errorText(exc)}"
            ) from None
        existing = {
            name: sorted(t.partitions)
            for name, t in metadata.topics.items()
            if t.error is None and not name.startswith("__")
        }
        if self.settings.assign:
            return sorted((t, p) for t, p in self.settings.assign if p in existing.get(t, ()))
        if self.settings.subscribe:
            names = [t for t in self.settings.subscribe if t in existing]
        else:
            pattern = re.compile(str(self.settings.subscribePattern))
            names = [t for t in existing if pattern.fullmatch(t)]
        return sorted((t, p) for t in names for p in existing[t])

    def _listOffsets(
        self, partitions: Sequence[tuple[str, int]], spec: str
    ) -> dict[tuple[str, int], int]:
        """Earliest offsets, or latest (the last stable offset under read_committed)."""
        if not partitions:
            return {}
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        offsetSpec = OffsetSpec.earliest() if spec == "earliest" else OffsetSpec.latest()
        isolation = (
            IsolationLevel.READ_COMMITTED
            if self.settings.readCommitted
            else IsolationLevel.READ_UNCOMMITTED
        )
        request = {TopicPartition(t, p): offsetSpec for t, p in partitions}
        try:
            futures = self._adminClient().list_offsets(
                request,
                isolation_level=isolation,
                request_timeout=self.settings.requestTimeoutSeconds,
            )
            return {(tp.topic, tp.partition): int(f.result().offset) for tp, f in futures.items()}
        except KafkaException as exc:
            raise KafkaSourceError(
                f"kafka source: cannot list {spec} offsets of "
                f"{len(partitions)} partition(s): {_errorText(exc)}"
            ) from None

    def initialOffset(self) -> Offsets:
        """Where a new query starts: ``startingOffsets`` resolved to numbers now."""
        partitions = self._partitions()
        starting = self.settings.startingOffsets
        if starting == "earliest":
            return _offsets(self._listOffsets(partitions, "earliest"))
        if starting == "latest":
            return _offsets(self._listOffsets(partitions, "latest"))
        assert isinstance(starting, dict)
        wanted = _rows(starting)
        missing = sorted(set(partitions) - set(wanted))
        if missing:
            raise TwoPhaseConfigError(
                "option startingOffsets must give an offset for every partition the query reads"
                f"; missing: {', '.join(f'{t}-{p}' for t, p in missing)}"
            )
        unknown = sorted(set(wanted) - set(partitions))
        if unknown:
            raise TwoPhaseConfigError(
                "option startingOffsets names partitions that do not exist or are not selected: "
                + ", ".join(f"{t}-{p}" for t, p in unknown)
            )
        earliest = self._listOffsets([tp for tp, o in wanted.items() if o == EARLIEST], "earliest")
        latest = self._listOffsets([tp for tp, o in wanted.items() if o == LATEST], "latest")
        return _offsets({tp: earliest.get(tp, latest.get(tp, o)) for tp, o in wanted.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.settings.maxOffsetsPerTrigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to the offsets available now, then stop."""
        partitions = self._partitions()
        self.availableNowEnd = self._listOffsets(partitions, "latest")

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        """The end of the next micro-batch: what is stable now, capped by the read limit."""
        begin = _rows(start)
        partitions = self._partitions()
        current = set(partitions)
        gone = sorted(set(begin) - current)
        if gone:
            self._dataLoss(
                "partition(s) "
                + ", ".join(f"{t}-{p}" for t, p in gone)
                + " no longer exist (topic deleted or recreated?); their unread records are lost "
                "to this query",
            )
            for tp in gone:
                begin.pop(tp)
        for tp in partitions:
            if tp not in begin:
                log.info("kafka source: new partition %s-%d, read from its first offset", *tp)
                begin[tp] = 0
        latest = self._listOffsets(partitions, "latest")
        if self.availableNowEnd is not None:
            latest = {tp: min(o, self.availableNowEnd.get(tp, 0)) for tp, o in latest.items()}
            for tp in partitions:
                if tp not in self.availableNowEnd:
                    latest[tp] = begin[tp]  # appeared after the trigger started
        end = {tp: latest.get(tp, begin[tp]) for tp in partitions}
        shrunk = sorted(tp for tp in partitions if end[tp] < begin[tp])
        if shrunk and self.availableNowEnd is None:
            self._dataLoss(
                "the last offsets of "
                + ", ".join(f"{t}-{p} ({begin[(t, p)]} -> {end[(t, p)]})" for t, p in shrunk)
                + " went back (topic recreated, or records lost in an unclean leader election)"
            )
        for tp in shrunk:
            if self.availableNowEnd is not None:
                end[tp] = begin[tp]
        if isinstance(limit, ReadMaxRows):
            end = _capped(begin, end, int(limit.max_rows))
        return _offsets(end)

    def reportLatestOffset(self) -> Offsets | None:
        partitions = self._partitions()
        return _offsets(self._listOffsets(partitions, "latest"))

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[KafkaRange]:
        """One range per topic partition with new offsets, split up to ``minPartitions``."""
        begin = _rows(start)
        ranges: list[KafkaRange] = []
        for (topic, partition), stop in sorted(_rows(end).items()):
            first = begin.get((topic, partition), 0)
            if stop > first:
                ranges.append(KafkaRange(topic, partition, first, stop))
        wanted = self.settings.minPartitions
        if wanted and len(ranges) < wanted:
            ranges = _split(ranges, wanted)
        return ranges

    def commit(self, end: Offsets) -> None:
        """Nothing to release: offsets live in Spark's checkpoint, never in a consumer group."""

    def stop(self) -> None:
        self._admin = None

    def _dataLoss(self, message: str) -> None:
        if self.settings.failOnDataLoss:
            raise KafkaSourceError(
                f"kafka source ({self.settings.describeSubscription()}): {message}. Set option "
                "failOnDataLoss=false to skip such records with a warning instead."
            )
        log.warning("kafka source (%s): %s", self.settings.describeSubscription(), message)

    # -- executor: reading ------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor: the records of ``[start, end)`` of one topic partition, as Arrow batches."""
        assert isinstance(partition, KafkaRange)
        freezeWorkerHeap()
        yield from readRange(self.settings, partition)


def _capped(
    begin: Mapping[tuple[str, int], int], end: Mapping[tuple[str, int], int], limit: int
) -> dict[tuple[str, int], int]:
    """At most ``limit`` offsets in all, shared in proportion to each partition's backlog."""
    backlog = {tp: max(0, end[tp] - begin[tp]) for tp in end}
    total = sum(backlog.values())
    if total <= limit:
        return dict(end)
    capped: dict[tuple[str, int], int] = {}
    for tp, lag in backlog.items():
        if end[tp] < begin[tp]:
            capped[tp] = end[tp]  # went back: nothing to read, continue from there
            continue
        share = math.floor(limit * lag / total) if total else 0
        capped[tp] = begin[tp] + min(lag, share)
    granted = sum(max(0, capped[tp] - begin[tp]) for tp in capped)
    for tp, lag in sorted(backlog.items(), key=lambda item: -item[1]):
        if granted >= limit:
            break
        if 0 <= capped[tp] - begin[tp] < lag:
            capped[tp] += 1
            granted += 1
    return capped


def _split(ranges: list[KafkaRange], wanted: int) -> list[KafkaRange]:
    """Split the largest ranges until there are ``wanted`` ranges (or all are one offset)."""
    result = list(ranges)
    while len(result) < wanted:
        largest = max(result, key=lambda r: r.end - r.start, default=None)
        if largest is None or largest.end - largest.start < 2:
            break
        result.remove(largest)
        middle = largest.start + (largest.end - largest.start) // 2
        result.append(KafkaRange(largest.topic, largest.partition, largest.start, middle))
        result.append(KafkaRange(largest.topic, largest.partition, middle, largest.end))
    return sorted(result, key=lambda r: (r.topic, r.partition, r.start))


def _clientConfig(config: Mapping[str, str]) -> dict[str, str | int | float | bool]:
    consumerOnly = ("isolation.level", "group.id", "enable.partition.eof", "fetch.", "session.")
    return {k: v for k, v in config.items() if not k.startswith(consumerOnly)}


def _errorText(exc: BaseException) -> str:
    error = exc.args[0] if exc.args else None
    text = getattr(error, "str", None)
    return str(text()) if callable(text) else str(exc)


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
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    config: dict[str, Any] = dict(settings.consumerConfig)
    config.setdefault("group.id", f"twophase-kafka-source-{uuid.uuid4().hex[:12]}")
    config.update(
        {"enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "error"}
    )
    try:
        consumer = Consumer(config)
    except KafkaException as exc:
        problem = librdkafkaError(exc, "consumer")
        if problem is not None:
            raise problem from None
        raise
    where = f"{r.topic}-{r.partition} [{r.start}, {r.end})"
    try:
        consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
        builder = _BatchBuilder(r.topic, r.partition, settings.includeHeaders)
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
                        skipped = _outOfRange(settings, consumer, r, where, error.str())
                        if skipped is None:
                            done = True
                            break
                        consumer.assign([TopicPartition(r.topic, r.partition, skipped)])
                        break
                    raise KafkaSourceError(f"kafka source: reading {where}: {error.str()}")
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


class _BatchBuilder:
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


__all__ = [
    "KafkaRange",
    "KafkaSource",
    "KafkaSourceError",
    "KafkaSourceSettings",
    "KafkaStreamReader",
    "readRange",
]
