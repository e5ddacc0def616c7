"""The Kafka source's planning without a broker: options, offsets, limits, partitions, columns.

The cluster's answers (partitions, earliest and stable offsets) are faked on the planner, so
each planning rule is checked directly, without Spark; one test checks the Spark adapter.
Reading real records, transaction markers and aborted transactions included, is in
integration_tests/test_kafka_source.py.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from twophase.settings import TwoPhaseConfigError
from twophase.sources.kafka import (
    BASE_SCHEMA,
    KafkaPlanner,
    KafkaRange,
    KafkaSourceError,
    KafkaSourceSettings,
    RecordBatchBuilder,
    cappedEnd,
    offsetsOf,
    parseOffsetsJson,
    recordSchema,
    rowsOf,
    splitRanges,
)

BOOTSTRAP = {"kafka.bootstrap.servers": "127.0.0.1:9"}


def settings(**options: str) -> KafkaSourceSettings:
    return KafkaSourceSettings.fromOptions({**BOOTSTRAP, "subscribe": "a", **options})


class FakeCluster:
    """Partitions and offsets the planner would get from the brokers; counts the requests."""

    def __init__(self, latest: dict[tuple[str, int], int], earliest: dict[Any, int] | None = None):
        self.latest = latest
        self.earliest = earliest or dict.fromkeys(latest, 0)
        self.requests = 0

    def install(self, planner: KafkaPlanner, monkeypatch: pytest.MonkeyPatch) -> None:
        def partitions() -> list[tuple[str, int]]:
            self.requests += 1
            return sorted(self.latest)

        def offsets(partitions: list[tuple[str, int]], spec: str) -> dict[Any, int]:
            self.requests += 1
            return {
                tp: (self.earliest if spec == "earliest" else self.latest)[tp] for tp in partitions
            }

        monkeypatch.setattr(planner, "topicPartitions", partitions)
        monkeypatch.setattr(planner, "listOffsets", offsets)


def planner(monkeypatch: pytest.MonkeyPatch, cluster: FakeCluster, **options: str) -> Any:
    r = KafkaPlanner(settings(**options))
    cluster.install(r, monkeypatch)
    return r


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


def test_starting_offsets_resolve_earliest_latest_and_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = FakeCluster({("a", 0): 50, ("a", 1): 70}, {("a", 0): 5, ("a", 1): 0})
    assert planner(monkeypatch, cluster).initialOffset() == {"a": {"0": 50, "1": 70}}
    earliest = planner(monkeypatch, cluster, startingOffsets="earliest")
    assert earliest.initialOffset() == {"a": {"0": 5, "1": 0}}
    given = planner(monkeypatch, cluster, startingOffsets=json.dumps({"a": {"0": -2, "1": 9}}))
    assert given.initialOffset() == {"a": {"0": 5, "1": 9}}
    partial = planner(monkeypatch, cluster, startingOffsets=json.dumps({"a": {"0": 1}}))
    with pytest.raises(TwoPhaseConfigError, match="missing: a-1"):
        partial.initialOffset()


def test_a_batch_ends_at_what_is_stable_now(monkeypatch: pytest.MonkeyPatch) -> None:
    r = planner(monkeypatch, FakeCluster({("a", 0): 120, ("a", 1): 40}))
    end = r.latestOffset({"a": {"0": 100, "1": 40}})
    assert end == {"a": {"0": 120, "1": 40}}
    assert r.partitions({"a": {"0": 100, "1": 40}}, end) == [KafkaRange("a", 0, 100, 120)]


def test_max_offsets_per_trigger_is_shared_in_proportion_to_the_backlog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = planner(
        monkeypatch, FakeCluster({("a", 0): 1000, ("a", 1): 100}), maxOffsetsPerTrigger="110"
    )
    end = r.latestOffset({"a": {"0": 0, "1": 0}}, r.settings.maxOffsetsPerTrigger)
    assert end == {"a": {"0": 100, "1": 10}}
    assert cappedEnd({("a", 0): 0}, {("a", 0): 3}, 10) == {("a", 0): 3}
    # rounding never loses the limit: 3 partitions, 10 offsets
    three = [("x", 0), ("y", 0), ("z", 0)]
    capped = cappedEnd(dict.fromkeys(three, 0), dict.fromkeys(three, 100), 10)
    assert sum(capped.values()) == 10


def test_new_partitions_are_read_from_their_first_offset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = planner(monkeypatch, FakeCluster({("a", 0): 10, ("a", 1): 4}))
    end = r.latestOffset({"a": {"0": 10}})
    assert end == {"a": {"0": 10, "1": 4}}
    assert r.partitions({"a": {"0": 10}}, end) == [KafkaRange("a", 1, 0, 4)]


def test_deleted_partitions_fail_the_query_by_name_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    start = {"a": {"0": 10, "1": 3}}
    strict = planner(monkeypatch, FakeCluster({("a", 0): 10}))
    with pytest.raises(KafkaSourceError, match=r"partition\(s\) a-1 no longer exist"):
        strict.latestOffset(start)
    lenient = planner(monkeypatch, FakeCluster({("a", 0): 12}), failOnDataLoss="false")
    assert lenient.latestOffset(start) == {"a": {"0": 12}}
    assert "a-1 no longer exist" in caplog.text


def test_offsets_that_went_back_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    r = planner(monkeypatch, FakeCluster({("a", 0): 5}))
    with pytest.raises(KafkaSourceError, match="went back"):
        r.latestOffset({"a": {"0": 10}})
    lenient = planner(monkeypatch, FakeCluster({("a", 0): 5}), failOnDataLoss="false")
    end = lenient.latestOffset({"a": {"0": 10}})
    assert end == {"a": {"0": 5}}
    assert lenient.partitions({"a": {"0": 10}}, end) == []


def test_available_now_stops_at_the_offsets_of_its_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in Spark's Kafka source, the offsets read when the trigger starts end every batch:
    no batch asks the cluster again, so a late or empty answer cannot end the run early."""
    cluster = FakeCluster({("a", 0): 10, ("a", 1): 4})
    r = planner(monkeypatch, cluster, maxOffsetsPerTrigger="6")
    r.prepareForTriggerAvailableNow()
    asked = cluster.requests
    cluster.latest = {("a", 0): 50, ("a", 1): 2, ("a", 2): 7}  # meanwhile: anything at all
    start: dict[str, Any] = {"a": {"0": 0, "1": 0}}
    ends = []
    while (end := r.latestOffset(start, r.settings.maxOffsetsPerTrigger)) != start:
        assert sum(end["a"].values()) - sum(start["a"].values()) <= 6
        ends.append(end)
        start = end
    assert len(ends) == 3 and start == {"a": {"0": 10, "1": 4}}
    assert r.reportLatestOffset() == {"a": {"0": 10, "1": 4}}
    assert cluster.requests == asked


def test_available_now_below_its_start_is_data_loss_not_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trigger's offsets below where the query stands (the topic was recreated between
    runs) fail the query; they never read as "nothing new", which would end it as drained."""
    strict = planner(monkeypatch, FakeCluster({("a", 0): 5, ("a", 1): 30}))
    strict.prepareForTriggerAvailableNow()
    with pytest.raises(KafkaSourceError, match=r"a-0 \(10 -> 5\) went back"):
        strict.latestOffset({"a": {"0": 10, "1": 20}})
    lenient = planner(monkeypatch, FakeCluster({("a", 0): 5, ("a", 1): 30}), failOnDataLoss="false")
    lenient.prepareForTriggerAvailableNow()
    assert lenient.latestOffset({"a": {"0": 10, "1": 20}}) == {"a": {"0": 5, "1": 30}}
    gone = planner(monkeypatch, FakeCluster({("a", 0): 5}))
    gone.prepareForTriggerAvailableNow()
    with pytest.raises(KafkaSourceError, match=r"a-1 no longer exist"):
        gone.latestOffset({"a": {"0": 0, "1": 3}})


def test_the_progress_report_is_the_last_plans_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark asks for the latest offsets after every plan, for its progress report: the plan's
    own listing answers it, without two more requests per batch."""
    cluster = FakeCluster({("a", 0): 120})
    r = planner(monkeypatch, cluster)
    assert r.reportLatestOffset() is None
    r.latestOffset({"a": {"0": 100}}, 5)
    asked = cluster.requests
    assert r.reportLatestOffset() == {"a": {"0": 120}}
    assert cluster.requests == asked


def test_min_partitions_splits_the_largest_ranges() -> None:
    ranges = splitRanges([KafkaRange("a", 0, 0, 100), KafkaRange("a", 1, 0, 10)], 4)
    assert len(ranges) == 4
    covered = sorted((r.partition, r.start, r.end) for r in ranges)
    assert covered == [(0, 0, 25), (0, 25, 50), (0, 50, 100), (1, 0, 10)]
    assert splitRanges([KafkaRange("a", 0, 0, 1)], 3) == [KafkaRange("a", 0, 0, 1)]


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


# -- the Spark adapter ----------------------------------------------------------------------


def test_sparks_read_limits_reach_the_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from twophase.spark.kafka import KafkaStreamReader

    r = KafkaStreamReader(settings(maxOffsetsPerTrigger="110"))
    FakeCluster({("a", 0): 1000, ("a", 1): 100}).install(r.planner, monkeypatch)
    limit = r.getDefaultReadLimit()
    assert isinstance(limit, ReadMaxRows) and limit.max_rows == 110
    start = {"a": {"0": 0, "1": 0}}
    assert r.latestOffset(start, limit) == {"a": {"0": 100, "1": 10}}
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {"a": {"0": 1000, "1": 100}}
    assert [p.value for p in r.partitions(start, end)] == [
        KafkaRange("a", 0, 0, 1000),
        KafkaRange("a", 1, 0, 100),
    ]
    assert isinstance(KafkaStreamReader(settings()).getDefaultReadLimit(), ReadAllAvailable)
