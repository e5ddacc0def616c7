"""Which offsets each micro-batch of the Kafka source reads, planned on the driver.

The end of a micro-batch is each partition's **last stable offset** under ``read_committed``
(its high watermark otherwise), so a batch never waits for an open transaction, capped by
``maxOffsetsPerTrigger``. New partitions are read from their first offset; deleted partitions
and offsets that went back are data loss, reported or skipped (``failOnDataLoss``). Under
``Trigger.AvailableNow`` the offsets read when the trigger starts are the end of every batch,
as in Spark's Kafka source: no batch asks the cluster again, so no late answer can end the run
early. A request the cluster does not answer is asked again (``fetchOffset.numRetries``), then
fails the query by name; librdkafka answers a timed-out ``ListOffsets`` with offset -1001 and no
error, which is never taken for an offset. Spark-free: ``twophase.spark.kafka`` adapts it to
PySpark's stream reader, verify uses it directly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import tenacity

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
    packRanges,
    rowsOf,
    splitRanges,
)
from twophase.sources.kafka.settings import KafkaSourceSettings

log = getLogger(__name__)

T = TypeVar("T")


def _names(partitions: Sequence[tuple[str, int]]) -> str:
    """``t-0, t-1``: topic partitions as errors and logs name them."""
    return ", ".join(f"{t}-{p}" for t, p in partitions)


class _NoAnswer(Exception):
    """One request the cluster did not answer (in time, or at all); asked again."""


class KafkaPlanner:
    """Driver: the partitions the options select, their offsets now, and each batch's ranges.

    Holds an admin client (not pickled; created again on first use).
    """

    def __init__(self, settings: KafkaSourceSettings) -> None:
        self.settings = settings
        self.availableNowEnd: Positions | None = None
        self.lastListed: Positions | None = None
        """The latest offsets the last plan read: Spark's progress report, without asking again."""
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

        def ask() -> Any:
            try:
                return self._adminClient().list_topics(timeout=self.settings.requestTimeoutSeconds)
            except KafkaException as exc:
                raise _NoAnswer(errorText(exc)) from None

        where = self.settings.consumerConfig["bootstrap.servers"]
        metadata = self._asked(f"cannot read metadata from {where}", ask)
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

        def ask() -> Positions:
            try:
                futures = self._adminClient().list_offsets(
                    request,
                    isolation_level=isolation,
                    request_timeout=self.settings.requestTimeoutSeconds,
                )
                listed = {
                    (tp.topic, tp.partition): int(f.result().offset) for tp, f in futures.items()
                }
            except KafkaException as exc:
                raise _NoAnswer(errorText(exc)) from None
            # A timed-out request comes back as offset -1001 (OFFSET_INVALID) without an error;
            # no partition's first or last offset is ever negative.
            unanswered = sorted(tp for tp, offset in listed.items() if offset < 0)
            if unanswered:
                raise _NoAnswer(
                    f"no answer for {_names(unanswered)} within "
                    f"requestTimeoutSeconds ({self.settings.requestTimeoutSeconds:g} s)"
                )
            return listed

        return self._asked(f"cannot list {spec} offsets of {len(partitions)} partition(s)", ask)

    def _asked(self, what: str, ask: Callable[[], T]) -> T:
        """``ask()``, asked again ``fetchOffset.numRetries`` times while the cluster does not
        answer; then the query fails naming what was asked and the options that bound it."""
        tries = self.settings.fetchOffsetNumRetries + 1

        def again(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning(
                "kafka source: %s: %s (try %d of %d); asking again",
                what,
                exc,
                state.attempt_number,
                tries,
            )

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(tries),
            wait=tenacity.wait_fixed(self.settings.fetchOffsetRetryIntervalSeconds),
            retry=tenacity.retry_if_exception_type(_NoAnswer),
            before_sleep=again,
            reraise=True,
        )
        try:
            return retrying(ask)
        except _NoAnswer as exc:
            raise KafkaSourceError(
                f"kafka source: {what}: {exc} ({tries} tries; options requestTimeoutSeconds, "
                "fetchOffset.numRetries and fetchOffset.retryIntervalMs bound the wait)"
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
                f"; missing: {_names(missing)}"
            )
        unknown = sorted(set(wanted) - set(partitions))
        if unknown:
            raise TwoPhaseConfigError(
                "option startingOffsets names partitions that do not exist or are not selected: "
                + _names(unknown)
            )
        earliest = self.listOffsets([tp for tp, o in wanted.items() if o == EARLIEST], "earliest")
        latest = self.listOffsets([tp for tp, o in wanted.items() if o == LATEST], "latest")
        return offsetsOf({tp: earliest.get(tp, latest.get(tp, o)) for tp, o in wanted.items()})

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to the offsets available now, then stop."""
        partitions = self.topicPartitions()
        self.availableNowEnd = self.listOffsets(partitions, "latest")
        log.info(
            "kafka source (%s): Trigger.AvailableNow reads %d partition(s) up to their offsets "
            "stable now",
            self.settings.describeSubscription(),
            len(self.availableNowEnd),
        )

    def latestOffset(self, start: Offsets, maxOffsets: int | None = None) -> Offsets:
        """The end of the next micro-batch: what is stable now (under AvailableNow, what was
        stable when the trigger started), capped at ``maxOffsets``."""
        begin = rowsOf(start)
        if self.availableNowEnd is not None:
            end = self._reconciled(begin, sorted(self.availableNowEnd), self.availableNowEnd)
        else:
            partitions = self.topicPartitions()
            self.lastListed = self.listOffsets(partitions, "latest")
            end = self._reconciled(begin, partitions, self.lastListed)
        if maxOffsets is not None:
            end = cappedEnd(begin, end, maxOffsets)
        return offsetsOf(end)

    def _reconciled(
        self, begin: Positions, partitions: list[tuple[str, int]], latest: Positions
    ) -> Positions:
        """Each partition's end, from ``begin`` (updated in place: partitions gone dropped, new
        ones from their first offset); gone partitions and ends below their start are data
        loss."""
        gone = sorted(set(begin) - set(partitions))
        if gone:
            self._dataLoss(
                "partition(s) "
                + _names(gone)
                + " no longer exist (topic deleted or recreated?); their unread records are lost "
                "to this query",
            )
            for tp in gone:
                begin.pop(tp)
        for tp in partitions:
            if tp not in begin:
                log.info("kafka source: new partition %s-%d, read from its first offset", *tp)
                begin[tp] = 0
        end = {tp: latest[tp] for tp in partitions}
        shrunk = sorted(tp for tp in partitions if end[tp] < begin[tp])
        if shrunk:
            self._dataLoss(
                "the last offsets of "
                + ", ".join(f"{t}-{p} ({begin[(t, p)]} -> {end[(t, p)]})" for t, p in shrunk)
                + " went back (topic recreated, or records lost in an unclean leader election)"
            )
        return end

    def reportLatestOffset(self) -> Offsets | None:
        """The partitions' ends as the last plan read them, whatever the read limit (Spark's
        progress report): under AvailableNow the trigger's end; no request of its own."""
        known = self.availableNowEnd if self.availableNowEnd is not None else self.lastListed
        return None if known is None else offsetsOf(known)

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

    def groups(self, start: Offsets, end: Offsets) -> list[tuple[KafkaRange, ...]]:
        """The batch's Spark partitions: ``partitions``' ranges, the small ones read together
        up to ``minRecordsPerPartition`` (each alone when ``minPartitions`` is set)."""
        records = 0 if self.settings.minPartitions else self.settings.minRecordsPerPartition
        return packRanges(self.partitions(start, end), records)

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
