"""Committed Kafka records in an offset range, read for either side of a verification.

A Kafka source offered, and a Kafka sink holds, the records a ``read_committed`` reader sees
between two offsets per partition: by default from the first offset to the last stable offset
now, as Spark's batch Kafka reader reads. Planning and reading are the Kafka source's own
Spark-free pieces (:mod:`twophase.sources.kafka`); ranges are read a few at a time in threads,
each by its own consumer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pyarrow as pa

from twophase.redaction import getLogger, redact
from twophase.settings import TwoPhaseConfigError, optionOf
from twophase.sources.kafka import (
    LATEST,
    KafkaPlanner,
    KafkaRange,
    KafkaSourceError,
    KafkaSourceSettings,
    Positions,
    offsetsOf,
    parseOffsetsJson,
    readRange,
    recordSchema,
    rowsOf,
)
from twophase.verify.errors import VerifyInputError, inputErrors

log = getLogger(__name__)

_KAFKA_READERS = 4


def readKafka(options: Mapping[str, str], side: str) -> tuple[pa.Table, str]:
    """The committed records the options select, and a description of the range read.

    ``options`` are the Kafka source's (``subscribe``/``subscribePattern``/``assign``,
    ``kafka.*``, ``startingOffsets`` default ``earliest``) plus ``endingOffsets`` (default
    ``latest``); for ``side="sink"`` the Kafka sink's ``topic`` stands for ``subscribe``, and
    ``read_uncommitted`` is refused (users see committed records only).
    """
    opts = {str(k): str(v) for k, v in options.items()}
    chosen = [n for n in ("subscribe", "subscribePattern", "assign") if optionOf(opts, n)]
    topic = optionOf(opts, "topic")
    if not chosen and topic:
        opts["subscribe"] = topic
    if optionOf(opts, "startingOffsets") is None:
        opts["startingOffsets"] = "earliest"
    if optionOf(opts, "requestTimeoutSeconds") is None:
        opts["requestTimeoutSeconds"] = "15"
    with inputErrors(f"kafka {side}", TwoPhaseConfigError):
        settings = KafkaSourceSettings.fromOptions(opts)
    if side == "sink" and not settings.readCommitted:
        raise VerifyInputError(
            "kafka sink: records must be read with kafka.isolation.level=read_committed, the "
            "way users see them; remove the option"
        )
    bootstrap = settings.consumerConfig["bootstrap.servers"]
    where = redact(f"kafka {settings.describeSubscription()} at {bootstrap}")
    planner = KafkaPlanner(settings)
    try:
        with (
            inputErrors(f"kafka {side}", TwoPhaseConfigError),
            inputErrors(
                "", KafkaSourceError, fix="; check that the broker runs and kafka.bootstrap.servers"
            ),
        ):
            partitions = planner.topicPartitions()
            _requireTopics(settings, partitions, where)
            start = rowsOf(planner.initialOffset())
            ending = optionOf(opts, "endingOffsets") or "latest"
            end = _endingOffsets(planner, partitions, ending)
            if settings.readCommitted and ending.strip().lower() == "latest":
                _warnOpenTransactions(settings, partitions, end, where)
    finally:
        planner.close()
    ranges = [
        KafkaRange(t, p, start[(t, p)], end[(t, p)])
        for t, p in partitions
        if end[(t, p)] > start[(t, p)]
    ]
    description = (
        f"{where} from {json.dumps(offsetsOf(start))} to {json.dumps(offsetsOf(end))}"
        f"{' (read_uncommitted)' if not settings.readCommitted else ''}"
    )
    log.info("reading %s: %d offset ranges", description, len(ranges))
    started = time.monotonic()

    def read(r: KafkaRange) -> list[pa.RecordBatch]:
        return list(readRange(settings, r))

    with (
        inputErrors("", KafkaSourceError, fix="; check the broker and the offsets"),
        ThreadPoolExecutor(max(1, min(_KAFKA_READERS, len(ranges)))) as pool,
    ):
        batches = [b for part in pool.map(read, ranges) for b in part]
    table = pa.Table.from_batches(batches, schema=recordSchema(settings.includeHeaders))
    log.info("%d records from %s in %.2f s", table.num_rows, where, time.monotonic() - started)
    return table, description


def readKafkaSink(
    options: Mapping[str, str], columns: Sequence[str] | None, hints: pa.Schema | None
) -> tuple[pa.Table, str]:
    """The Kafka sink's reader for verify: its topics as a ``read_committed`` reader sees them
    (records have fixed columns: ``columns`` and ``hints`` do not apply)."""
    return readKafka(options, "sink")


def _warnOpenTransactions(
    settings: KafkaSourceSettings,
    partitions: Sequence[tuple[str, int]],
    end: Mapping[tuple[str, int], int],
    where: str,
) -> None:
    """Warn when open transactions hold the last stable offset below the written end.

    Records after an open transaction (a twophase batch prepared but not yet committed, or a
    stuck producer) are not visible yet, so the comparison stops before them.
    """
    uncommitted = {**settings.consumerConfig, "isolation.level": "read_uncommitted"}
    planner = KafkaPlanner(replace(settings, consumerConfig=uncommitted))
    try:
        written = planner.listOffsets(partitions, "latest")
    finally:
        planner.close()
    held = [
        f"{t}-{p} ({end[(t, p)]} < {written[(t, p)]})"
        for t, p in partitions
        if written[(t, p)] > end[(t, p)]
    ]
    if held:
        log.warning(
            "%s: open transactions hold back the last stable offset of %s; records after them "
            "are not counted until those transactions end",
            where,
            ", ".join(held),
        )


def _requireTopics(
    settings: KafkaSourceSettings, partitions: Sequence[tuple[str, int]], where: str
) -> None:
    found = {t for t, _ in partitions}
    absent = [t for t in settings.subscribe if t not in found]
    absent += [f"{t}-{p}" for t, p in settings.assign if (t, p) not in set(partitions)]
    if absent:
        raise VerifyInputError(
            f"{where}: no such topic or partition {', '.join(absent)}; check the topic name "
            "(subscribe, assign or topic option) and kafka.bootstrap.servers"
        )
    if not partitions:
        raise VerifyInputError(
            f"{where}: no topic matches; check subscribePattern and kafka.bootstrap.servers"
        )


def _endingOffsets(
    planner: KafkaPlanner, partitions: Sequence[tuple[str, int]], text: str
) -> Positions:
    """``endingOffsets`` (``latest`` or Spark's JSON, -1 latest) resolved to numbers."""
    latest = planner.listOffsets(partitions, "latest")
    if text.strip().lower() == "latest":
        return dict(latest)
    wanted = rowsOf(parseOffsetsJson(text.strip(), "endingOffsets"))
    problems = [f"{t}-{p}" for t, p in sorted(set(partitions) ^ set(wanted))]
    if problems:
        raise VerifyInputError(
            "option endingOffsets must give an offset for exactly the partitions read; "
            f"mismatched: {', '.join(problems)}"
        )
    if any(o < LATEST for o in wanted.values()):
        raise VerifyInputError("option endingOffsets: -2 (earliest) cannot end a range")
    return {tp: latest[tp] if o == LATEST else o for tp, o in wanted.items()}


__all__ = ["readKafka", "readKafkaSink"]
