"""The Kafka source's pure pieces without a broker: options, offsets, limits, ranges, columns.

What needs the cluster's answers is against the real broker: the planning rules (starting
offsets, batch ends, new and gone partitions, AvailableNow, the Spark adapter's limits) in
integration_tests/test_kafka_planning.py, reading records, transaction markers and aborted
transactions included, in integration_tests/test_kafka_source.py.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from twophase.settings import TwoPhaseConfigError
from twophase.sources.kafka import (
    BASE_SCHEMA,
    KafkaRange,
    KafkaSourceSettings,
    RecordBatchBuilder,
    cappedEnd,
    offsetsOf,
    packRanges,
    parseOffsetsJson,
    recordSchema,
    rowsOf,
    splitRanges,
)

BOOTSTRAP = {"kafka.bootstrap.servers": "127.0.0.1:9"}


def settings(**options: str) -> KafkaSourceSettings:
    return KafkaSourceSettings.fromOptions({**BOOTSTRAP, "subscribe": "a", **options})


# -- options --------------------------------------------------------------------------------


def test_read_committed_is_the_default_and_read_uncommitted_can_be_chosen() -> None:
    assert settings().consumerConfig["isolation.level"] == "read_committed"
    assert settings().readCommitted
    uncommitted = settings(**{"kafka.isolation.level": "read_uncommitted"})
    assert not uncommitted.readCommitted
    with pytest.raises(TwoPhaseConfigError, match="isolation.level"):
        settings(**{"kafka.isolation.level": "snapshot"})


def test_exactly_one_subscription_option() -> None:
    with pytest.raises(TwoPhaseConfigError, match="exactly one of"):
        KafkaSourceSettings.fromOptions(BOOTSTRAP)
    with pytest.raises(TwoPhaseConfigError, match="subscribe, subscribePattern"):
        settings(subscribePattern="a.*")
    assert settings().subscribe == ("a",)
    pattern = KafkaSourceSettings.fromOptions({**BOOTSTRAP, "subscribePattern": "orders-.*"})
    assert pattern.subscribePattern == "orders-.*"
    assigned = KafkaSourceSettings.fromOptions({**BOOTSTRAP, "assign": '{"a": [0, 2]}'})
    assert assigned.assign == (("a", 0), ("a", 2))
    with pytest.raises(TwoPhaseConfigError, match="assign"):
        KafkaSourceSettings.fromOptions({**BOOTSTRAP, "assign": "a:0"})


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("startingOffsets", "{bad", "startingOffsets"),
        ("startingOffsets", '{"a": {"0": -3}}', "not valid"),
        ("kafka.auto.offset.reset", "earliest", "startingOffsets"),
        ("kafka.enable.auto.commit", "true", "never commits"),
        ("kafka.value.deserializer", "x", "binary columns"),
        ("maxOffsetsPerTrigger", "-1", "at least 0"),
        ("failOnDataLoss", "maybe", "boolean"),
        ("fetchOffset.numRetries", "-1", "at least 0"),
        ("fetchOffset.retryIntervalMs", "soon", "not an integer"),
        ("minRecordsPerPartition", "-5", "at least 0"),
    ],
)
def test_bad_options_are_refused_by_name(option: str, value: str, message: str) -> None:
    with pytest.raises(TwoPhaseConfigError, match=message):
        settings(**{option: value})


def test_headers_are_a_column_only_when_asked_for_as_in_spark() -> None:
    assert settings().schema() == BASE_SCHEMA
    assert (
        settings(includeHeaders="true")
        .schema()
        .endswith("headers array<struct<key: string, value: binary>>")
    )


# -- planning -------------------------------------------------------------------------------


def test_max_offsets_per_trigger_is_shared_in_proportion_to_the_backlog() -> None:
    a0, a1 = ("a", 0), ("a", 1)
    assert cappedEnd({a0: 0, a1: 0}, {a0: 1000, a1: 100}, 110) == {a0: 100, a1: 10}
    assert cappedEnd({a0: 0}, {a0: 3}, 10) == {a0: 3}
    # rounding never loses the limit: 3 partitions, 10 offsets
    three = [("x", 0), ("y", 0), ("z", 0)]
    capped = cappedEnd(dict.fromkeys(three, 0), dict.fromkeys(three, 100), 10)
    assert sum(capped.values()) == 10
    # a partition that went back reads nothing and goes on from where it is now
    assert cappedEnd({a0: 10, a1: 0}, {a0: 5, a1: 100}, 10) == {a0: 5, a1: 10}


def test_min_partitions_splits_the_largest_ranges() -> None:
    ranges = splitRanges([KafkaRange("a", 0, 0, 100), KafkaRange("a", 1, 0, 10)], 4)
    assert len(ranges) == 4
    covered = sorted((r.partition, r.start, r.end) for r in ranges)
    assert covered == [(0, 0, 25), (0, 25, 50), (0, 50, 100), (1, 0, 10)]
    assert splitRanges([KafkaRange("a", 0, 0, 1)], 3) == [KafkaRange("a", 0, 0, 1)]


def test_small_ranges_are_read_together_up_to_min_records_per_partition() -> None:
    def r(p: int, n: int, topic: str = "a") -> KafkaRange:
        return KafkaRange(topic, p, 100, 100 + n)

    assert settings().minRecordsPerPartition == 10000
    small = [r(0, 250), r(1, 250), r(2, 250), r(3, 250)]
    assert packRanges(small, 10000) == [tuple(small)]
    # joined until a group holds at least the minimum; a large range stays alone, in order
    assert packRanges([r(0, 6), r(1, 6), r(2, 20), r(3, 3), r(0, 4, "b")], 10) == [
        (r(0, 6), r(1, 6)),
        (r(2, 20),),
        (r(3, 3), r(0, 4, "b")),
    ]
    # never two ranges of one topic partition in a group (minPartitions' split ranges)
    halves = [KafkaRange("a", 0, 0, 5), KafkaRange("a", 0, 5, 10), KafkaRange("a", 1, 0, 5)]
    assert packRanges(halves, 100) == [(halves[0],), (halves[1], halves[2])]
    # 0: one Spark partition per range, as Spark's own Kafka source plans
    assert packRanges(small, 0) == [(x,) for x in small]
    assert packRanges([], 10) == []


# -- columns --------------------------------------------------------------------------------


class Message:
    def __init__(self, offset: int, headers: list[tuple[str, bytes]] | None = None) -> None:
        self._offset = offset
        self._headers = headers

    def key(self) -> bytes | None:
        return None if self._offset % 2 else b"k%d" % self._offset

    def value(self) -> bytes:
        return b"v%d" % self._offset

    def topic(self) -> str:
        return "a"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000 + self._offset)

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers


def test_records_become_sparks_kafka_columns() -> None:
    builder = RecordBatchBuilder("a", 0, headers=True)
    builder.add(Message(4, [("h", b"x")]))
    builder.add(Message(5))
    batch = builder.build()
    assert batch.schema.names == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert batch.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    rows = batch.to_pylist()
    assert rows[0]["key"] == b"k4" and rows[1]["key"] is None
    assert rows[0]["timestampType"] == 0  # create time, as Kafka's Java client numbers it
    assert rows[0]["headers"] == [{"key": "h", "value": b"x"}]
    assert rows[1]["headers"] is None
    assert builder.rows == 0  # the builder starts over after a batch
    assert recordSchema(True) == batch.schema


# -- offsets --------------------------------------------------------------------------------


def test_offsets_json_rows_and_back() -> None:
    offsets = parseOffsetsJson('{"a": {"1": 7, "0": -2}, "b": {"0": 3}}', "endingOffsets")
    assert rowsOf(offsets) == {("a", 1): 7, ("a", 0): -2, ("b", 0): 3}
    assert offsetsOf(rowsOf(offsets)) == {"a": {"0": -2, "1": 7}, "b": {"0": 3}}
    with pytest.raises(TwoPhaseConfigError, match="option endingOffsets"):
        parseOffsetsJson("[1]", "endingOffsets")
