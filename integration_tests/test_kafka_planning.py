"""The Kafka source's planning rules against the real broker, on one topic for the module.

Starting offsets, the end of a batch, ``maxOffsetsPerTrigger``, new and gone partitions, offsets
that went back, ``Trigger.AvailableNow`` and the progress report: the planner asks the broker
itself (metadata, earliest and stable offsets), as it does in a query. Partitions the start
offsets name beyond the topic's stand for deleted ones, start offsets beyond its end for a
topic that went back. Reading records is in test_kafka_source.py.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from integration_tests.test_kafka_helpers import createTopic
from twophase.settings import TwoPhaseConfigError
from twophase.sources.kafka import KafkaPlanner, KafkaRange, KafkaSourceError, KafkaSourceSettings

FIRST = 2  # partition 0's records below this offset are deleted: its earliest offset


@pytest.fixture(scope="module")
def topic(kafka_bootstrap: str) -> str:
    """Two partitions: 0 holds offsets FIRST..9 (the first ones deleted), 1 holds 0..3."""
    name = createTopic(kafka_bootstrap, partitions=2, prefix="it-plan")
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    for partition, count in ((0, 10), (1, 4)):
        for i in range(count):
            plain.produce(name, f"{partition}-{i}".encode(), partition=partition)
    assert plain.flush(30) == 0, "records not delivered"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    deleted = TopicPartition(name, 0, FIRST)
    assert admin.delete_records([deleted])[deleted].result(60).low_watermark == FIRST
    return name


def planner(bootstrap: str, topic: str, **options: str) -> KafkaPlanner:
    return KafkaPlanner(
        KafkaSourceSettings.fromOptions(
            {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **options}
        )
    )


_lister: dict[str, KafkaPlanner] = {}


def ends(bootstrap: str, topic: str) -> tuple[int, int]:
    """Partition 0's and 1's last offsets now (a test may have added records)."""
    lister = _lister.setdefault(topic, planner(bootstrap, topic))  # one admin client for all
    now = lister.initialOffset()[topic]
    return now["0"], now["1"]


def at(topic: str, *offsets: int) -> dict[str, Any]:
    return {topic: {str(p): o for p, o in enumerate(offsets)}}


def test_starting_offsets_resolve_earliest_latest_and_json(
    kafka_bootstrap: str, topic: str
) -> None:
    end0, end1 = ends(kafka_bootstrap, topic)
    assert planner(kafka_bootstrap, topic).initialOffset() == at(topic, end0, end1)
    earliest = planner(kafka_bootstrap, topic, startingOffsets="earliest")
    assert earliest.initialOffset() == at(topic, FIRST, 0)
    given = json.dumps({topic: {"0": -2, "1": 3}})
    assert planner(kafka_bootstrap, topic, startingOffsets=given).initialOffset() == at(
        topic, FIRST, 3
    )
    partial = planner(kafka_bootstrap, topic, startingOffsets=json.dumps({topic: {"0": 1}}))
    with pytest.raises(TwoPhaseConfigError, match=f"missing: {topic}-1"):
        partial.initialOffset()
    extra = json.dumps({topic: {"0": 1, "1": 1, "2": 1}})
    with pytest.raises(TwoPhaseConfigError, match=f"do not exist or are not selected: {topic}-2"):
        planner(kafka_bootstrap, topic, startingOffsets=extra).initialOffset()


def test_a_batch_ends_at_what_is_stable_now_capped_in_proportion_to_the_backlog(
    kafka_bootstrap: str, topic: str
) -> None:
    end0, end1 = ends(kafka_bootstrap, topic)
    r = planner(kafka_bootstrap, topic)
    start = at(topic, end0 - 2, end1)
    end = r.latestOffset(start)
    assert end == at(topic, end0, end1)
    assert r.partitions(start, end) == [KafkaRange(topic, 0, end0 - 2, end0)]
    behind = at(topic, end0 - 8, end1 - 4)  # backlogs 8 and 4: a limit of 6 reads 4 and 2
    assert r.latestOffset(behind, 6) == at(topic, end0 - 4, end1 - 2)


def test_new_partitions_are_read_from_their_first_offset(kafka_bootstrap: str, topic: str) -> None:
    end0, end1 = ends(kafka_bootstrap, topic)
    r = planner(kafka_bootstrap, topic)
    start = {topic: {"0": end0}}  # partition 1 is new to the query
    end = r.latestOffset(start)
    assert end == at(topic, end0, end1)
    assert r.partitions(start, end) == [KafkaRange(topic, 1, 0, end1)]


def test_gone_partitions_fail_the_query_by_name_unless_told_otherwise(
    kafka_bootstrap: str, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    end0, end1 = ends(kafka_bootstrap, topic)
    start = at(topic, end0, end1, 3)  # partition 2 does not exist (deleted, say)
    with pytest.raises(KafkaSourceError, match=rf"partition\(s\) {topic}-2 no longer exist"):
        planner(kafka_bootstrap, topic).latestOffset(start)
    lenient = planner(kafka_bootstrap, topic, failOnDataLoss="false")
    with caplog.at_level(logging.WARNING, logger="twophase.sources.kafka"):
        assert lenient.latestOffset(start) == at(topic, end0, end1)
    assert f"{topic}-2 no longer exist" in caplog.text


def test_offsets_that_went_back_are_reported(kafka_bootstrap: str, topic: str) -> None:
    end0, end1 = ends(kafka_bootstrap, topic)
    start = at(topic, end0 + 5, end1)  # the query read further than the topic holds now
    with pytest.raises(KafkaSourceError, match=rf"{topic}-0 \({end0 + 5} -> {end0}\) went back"):
        planner(kafka_bootstrap, topic).latestOffset(start)
    lenient = planner(kafka_bootstrap, topic, failOnDataLoss="false")
    end = lenient.latestOffset(start)
    assert end == at(topic, end0, end1)
    assert lenient.partitions(start, end) == []


def test_available_now_stops_at_the_offsets_of_its_start_and_below_them_is_data_loss(
    kafka_bootstrap: str, topic: str
) -> None:
    """As in Spark's Kafka source, the offsets read when the trigger starts end every batch:
    records that arrive later are left to the next run, and the trigger's offsets below where
    the query stands fail it rather than read as "nothing new", which would end it drained."""
    end0, end1 = ends(kafka_bootstrap, topic)
    r = planner(kafka_bootstrap, topic, maxOffsetsPerTrigger="6")
    r.prepareForTriggerAvailableNow()
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    plain.produce(topic, b"late", partition=1)
    assert plain.flush(30) == 0
    assert ends(kafka_bootstrap, topic) == (end0, end1 + 1)
    start = at(topic, end0 - 8, end1 - 4)
    batches = []
    while (end := r.latestOffset(start, r.settings.maxOffsetsPerTrigger)) != start:
        assert sum(end[topic].values()) - sum(start[topic].values()) <= 6
        batches.append(end)
        start = end
    assert len(batches) == 2 and start == at(topic, end0, end1)
    assert r.reportLatestOffset() == at(topic, end0, end1)
    with pytest.raises(KafkaSourceError, match=rf"{topic}-0 \({end0 + 1} -> {end0}\) went back"):
        r.latestOffset(at(topic, end0 + 1, end1))


def test_the_progress_report_is_the_last_plans_listing(kafka_bootstrap: str, topic: str) -> None:
    """Spark asks for the latest offsets after every plan, for its progress report: the plan's
    own listing answers it, without asking the broker again (records added since are not in
    it)."""
    end0, end1 = ends(kafka_bootstrap, topic)
    r = planner(kafka_bootstrap, topic)
    assert r.reportLatestOffset() is None
    assert r.latestOffset(at(topic, end0 - 4, end1), 1) == at(topic, end0 - 3, end1)
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    plain.produce(topic, b"later", partition=0)
    assert plain.flush(30) == 0
    assert r.reportLatestOffset() == at(topic, end0, end1)


def test_sparks_read_limits_reach_the_planner(kafka_bootstrap: str, topic: str) -> None:
    """The Spark adapter, without a session: its default limit and both kinds of limit."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from twophase.spark.kafka import KafkaStreamReader

    end0, end1 = ends(kafka_bootstrap, topic)
    settings = planner(kafka_bootstrap, topic, maxOffsetsPerTrigger="6").settings
    r = KafkaStreamReader(settings)
    limit = r.getDefaultReadLimit()
    assert isinstance(limit, ReadMaxRows) and limit.max_rows == 6
    start = at(topic, end0 - 8, end1 - 4)
    assert r.latestOffset(start, limit) == at(topic, end0 - 4, end1 - 2)
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == at(topic, end0, end1)
    both = (KafkaRange(topic, 0, end0 - 8, end0), KafkaRange(topic, 1, end1 - 4, end1))
    assert [p.value for p in r.partitions(start, end)] == [both]  # few records: one task
    r.stop()
    unlimited = KafkaStreamReader(planner(kafka_bootstrap, topic).settings)
    assert isinstance(unlimited.getDefaultReadLimit(), ReadAllAvailable)
