"""What a source offered: a ``twophase.sequence`` range, or the committed records of Kafka topics.

A sequence range is computed, not read: row ``i`` is ``id = i, payload = "row-<i>"``, so the
offered rows of any range are known without the source (:mod:`twophase.sources.sequence`).
:func:`readSource` reads one source by its kind, as ``twophase verify`` names it.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from twophase.settings import TwoPhaseConfigError, intOption, optionOf
from twophase.sources.sequence import ARROW_SCHEMA, sequenceRows
from twophase.verify.compare import isBytes, isText, requireColumns
from twophase.verify.errors import VerifyInputError, inputErrors

_SEQUENCE_CHUNK_ROWS = 1 << 20


def expectedFromSequence(start: int, end: int) -> pa.Table:
    """The rows ``twophase.sequence`` offers for offsets ``[start, end)``: ``id``, ``payload``."""
    if start < 0 or end < start:
        raise VerifyInputError(
            f"sequence range [{start}, {end}) is empty or negative; give 0 <= start <= end"
        )
    batches = [
        sequenceRows(first, min(first + _SEQUENCE_CHUNK_ROWS, end))
        for first in range(start, end, _SEQUENCE_CHUNK_ROWS)
    ]
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)


def sequenceRange(options: Mapping[str, str]) -> tuple[int, int]:
    """The offsets ``[start, end)`` that ``twophase verify``'s sequence options describe.

    ``start`` (default the source's ``startOffset``, else 0) and ``end``, or the source's own
    ``totalRows``; a missing end is an input error naming both ways to give it.
    """
    with inputErrors("sequence source", TwoPhaseConfigError):
        first = intOption(options, "startOffset", 0, minimum=0)
        start = intOption(options, "start", first, minimum=0)
        if optionOf(options, "end") is not None:
            end = intOption(options, "end", 0, minimum=0)
        elif optionOf(options, "totalRows") is not None:
            end = start + intOption(options, "totalRows", 0, minimum=0)
        else:
            raise VerifyInputError(
                "the sequence source needs the end of the range: --end N (one past the last "
                "id offered), or the source's totalRows option"
            )
    if end < start:
        raise VerifyInputError(f"sequence source: end {end} is before start {start}")
    return start, end


def asKafkaRecords(table: pa.Table, key: str = "id", value: str = "payload") -> pa.Table:
    """Rows as a Kafka sink writes them from ``CAST(<key> AS STRING) AS key, <value> AS value``.

    For a pipeline ``twophase.sequence -> twophase.kafka``: ``key`` and ``value`` become the
    binary columns a ``read_committed`` reader of the output topic sees.
    """
    requireColumns(table, (key, value), "the source")

    def asBytes(column: pa.ChunkedArray) -> pa.ChunkedArray:
        if not (isText(column.type) or isBytes(column.type)):
            column = column.cast(pa.string())
        return column.cast(pa.binary())

    return pa.table({"key": asBytes(table.column(key)), "value": asBytes(table.column(value))})


def expectedFromKafka(options: Mapping[str, str]) -> pa.Table:
    """The committed records of Kafka topics in an offset range, as Spark's Kafka source reads.

    ``options`` are those of the ``twophase.kafka`` source (``kafka.bootstrap.servers``,
    ``subscribe``/``subscribePattern``/``assign``, ``kafka.*``) plus ``endingOffsets``;
    ``startingOffsets`` defaults to ``earliest`` and ``endingOffsets`` to ``latest`` (the last
    stable offset), as in Spark's batch Kafka reader.
    """
    from twophase.verify.kafka import readKafka

    return readKafka(options, "source")[0]


def readSource(source: str, options: Mapping[str, str]) -> tuple[pa.Table, str]:
    """What a ``sequence`` or ``kafka`` source offered, and a description for the report."""
    if source == "sequence":
        start, end = sequenceRange(options)
        return expectedFromSequence(start, end), f"sequence ids [{start}, {end})"
    from twophase.verify.kafka import readKafka

    return readKafka(options, "source")


__all__ = [
    "asKafkaRecords",
    "expectedFromKafka",
    "expectedFromSequence",
    "readSource",
    "sequenceRange",
]
