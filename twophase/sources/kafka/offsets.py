"""Kafka offsets as Spark keeps them (``{"topic": {"partition": next offset}}``), as rows keyed
by topic partition, and the ranges ``[start, end)`` a micro-batch reads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from twophase.settings import TwoPhaseConfigError

Offsets = dict[str, dict[str, int]]
"""Spark's Kafka offsets: topic -> partition (as a string) -> next offset."""

Positions = dict[tuple[str, int], int]
"""The same offsets keyed by ``(topic, partition)``."""

EARLIEST = -2
"""In ``startingOffsets`` JSON: the partition's first offset."""
LATEST = -1
"""In ``startingOffsets``/``endingOffsets`` JSON: the partition's end now."""


@dataclass(frozen=True)
class KafkaRange:
    """The offsets ``[start, end)`` of one topic partition that one task reads."""

    topic: str
    partition: int
    start: int
    end: int


def rowsOf(offsets: Offsets) -> Positions:
    """``{"t": {"0": 5}}`` -> ``{("t", 0): 5}``."""
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


def offsetsOf(positions: Mapping[tuple[str, int], int]) -> Offsets:
    """``{("t", 0): 5}`` -> ``{"t": {"0": 5}}``, topics and partitions in order."""
    result: Offsets = {}
    for (topic, partition), offset in sorted(positions.items()):
        result.setdefault(topic, {})[str(partition)] = int(offset)
    return result


def parseOffsetsJson(text: str, option: str) -> Offsets:
    """Spark's offsets JSON of option ``option``; -2 (earliest) and -1 (latest) allowed."""
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


def cappedEnd(
    begin: Mapping[tuple[str, int], int], end: Mapping[tuple[str, int], int], limit: int
) -> Positions:
    """At most ``limit`` offsets in all, shared in proportion to each partition's backlog."""
    backlog = {tp: max(0, end[tp] - begin[tp]) for tp in end}
    total = sum(backlog.values())
    if total <= limit:
        return dict(end)
    capped: Positions = {}
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


def packRanges(ranges: Sequence[KafkaRange], records: int) -> list[tuple[KafkaRange, ...]]:
    """The ranges one Spark partition each reads: in order, ranges of fewer than ``records``
    offsets joined until a group holds at least ``records`` (never two ranges of one topic
    partition in a group); a range of ``records`` or more, or every range when ``records`` is
    0, alone. A function of the ranges only, so a replayed batch is read in the same groups.
    """
    groups: list[tuple[KafkaRange, ...]] = []
    current: list[KafkaRange] = []
    held = 0
    for r in ranges:
        size = r.end - r.start
        if records <= 0 or size >= records:
            groups.append((r,))
            continue
        if any((c.topic, c.partition) == (r.topic, r.partition) for c in current):
            groups.append(tuple(current))
            current, held = [], 0
        current.append(r)
        held += size
        if held >= records:
            groups.append(tuple(current))
            current, held = [], 0
    if current:
        groups.append(tuple(current))
    return groups


def splitRanges(ranges: list[KafkaRange], wanted: int) -> list[KafkaRange]:
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
