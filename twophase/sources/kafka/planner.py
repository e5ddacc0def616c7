"""Which offsets each micro-batch of the Kafka source reads, planned on the driver.

The end of a micro-batch is each partition's **last stable offset** under ``read_committed``
(its high watermark otherwise), so a batch never waits for an open transaction, capped by
``maxOffsetsPerTrigger``. New partitions are read from their first offset; deleted partitions
and offsets that went back are data loss, reported or skipped (``failOnDataLoss``). Spark-free:
``twophase.spark.kafka`` adapts it to PySpark's stream reader, verify uses it directly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from twophase.clients.kafka import adminClient, errorText
from twophase.redaction import getLogger
from twophase.settings import TwoPhaseConfigError
from twophase.sources.kafka.errors import KafkaSourceError
from twophase.sources.kafka.offsets import (
    EARLIEST,
    LATEST,
    KafkaRange,
    Offsets,
    Positions,
    cappedEnd,
    offsetsOf,
    rowsOf,
    splitRanges,
)
from twophase.sources.kafka.settings import KafkaSourceSettings

log = getLogger(__name__)


class KafkaPlanner:
    """Driver: the partitions the options select, their offsets now, and each batch's ranges.

    Holds an admin client (not pickled; created again on first use).
    """

    def __init__(self, settings: KafkaSourceSettings) -> None:
        self.settings = settings
        self.availableNowEnd: Positions | None = None
        self._admin: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_admin"] = None
        return state

    def _adminClient(self) -> Any:
        if self._admin is None:
            self._admin = adminClient(self.settings.consumerConfig)
        return self._admin

    def topicPartitions(self) -> list[tuple[str, int]]:
        """The topic partitions the options select, from the cluster's metadata now."""
        from confluent_kafka import KafkaException

        try:
            metadata = self._adminClient().list_topics(timeout=self.settings.requestTimeoutSeconds)
        except KafkaException as exc:
            raise KafkaSourceError(
                f"kafka source: cannot read metadata from "
                f"{self.settings.consumerConfig['bootstrap.servers']}: {errorText(exc)}"
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

    def listOffsets(
        self, partitions: Sequence[tuple[str, int]], spec: Literal["earliest", "latest"]
    ) -> Positions:
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
                f"{len(partitions)} partition(s): {errorText(exc)}"
            ) from None

    def initialOffset(self) -> Offsets:
        """Where a new query starts: ``startingOffsets`` resolved to numbers now."""
        partitions = self.topicPartitions()
        starting = self.settings.startingOffsets
        if starting == "earliest":
            return offsetsOf(self.listOffsets(partitions, "earliest"))
        if starting == "latest":
            return offsetsOf(self.listOffsets(partitions, "latest"))
        assert isinstance(starting, dict)
        wanted = rowsOf(starting)
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
        earliest = self.listOffsets([tp for tp, o in wanted.items() if o == EARLIEST], "earliest")
        latest = self.listOffsets([tp for tp, o in wanted.items() if o == LATEST], "latest")
        return offsetsOf({tp: earliest.get(tp, latest.get(tp, o)) for tp, o in wanted.items()})

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to the offsets available now, then stop."""
        partitions = self.topicPartitions()
        self.availableNowEnd = self.listOffsets(partitions, "latest")

    def latestOffset(self, start: Offsets, maxOffsets: int | None = None) -> Offsets:
        """The end of the next micro-batch: what is stable now, capped at ``maxOffsets``."""
        begin = rowsOf(start)
        partitions = self.topicPartitions()
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
        latest = self.listOffsets(partitions, "latest")
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
        if maxOffsets is not None:
            end = cappedEnd(begin, end, maxOffsets)
        return offsetsOf(end)

    def reportLatestOffset(self) -> Offsets:
        """The partitions' ends now, whatever the read limit (Spark's progress report)."""
        return offsetsOf(self.listOffsets(self.topicPartitions(), "latest"))

    def partitions(self, start: Offsets, end: Offsets) -> list[KafkaRange]:
        """One range per topic partition with new offsets, split up to ``minPartitions``."""
        begin = rowsOf(start)
        ranges: list[KafkaRange] = []
        for (topic, partition), stop in sorted(rowsOf(end).items()):
            first = begin.get((topic, partition), 0)
            if stop > first:
                ranges.append(KafkaRange(topic, partition, first, stop))
        wanted = self.settings.minPartitions
        if wanted and len(ranges) < wanted:
            ranges = splitRanges(ranges, wanted)
        return ranges

    def close(self) -> None:
        """Drop the admin client (the next call creates one again)."""
        self._admin = None

    def _dataLoss(self, message: str) -> None:
        if self.settings.failOnDataLoss:
            raise KafkaSourceError(
                f"kafka source ({self.settings.describeSubscription()}): {message}. Set option "
                "failOnDataLoss=false to skip such records with a warning instead."
            )
        log.warning("kafka source (%s): %s", self.settings.describeSubscription(), message)
