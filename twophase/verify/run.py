"""One verification by kind and options: read both sides, then compare them.

This is what ``twophase verify`` (``twophase.cli``) runs: the source's and the sink's kinds
and options name what to read (:mod:`~twophase.verify.offered`, :mod:`~twophase.verify.held`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pyarrow as pa

from twophase.settings import optionOf
from twophase.verify.compare import EXAMPLES, compare, defaultColumns, requireColumns
from twophase.verify.errors import VerifyInputError
from twophase.verify.held import readFiles, readPostgres
from twophase.verify.offered import asKafkaRecords, expectedFromSequence, sequenceRange
from twophase.verify.report import VerifyReport

SOURCES = ("sequence", "kafka")
"""The source kinds ``verify`` reads."""

SINKS = ("files", "postgres", "kafka")
"""The sink kinds ``verify`` reads."""


def verify(
    source: str,
    sourceOptions: Mapping[str, str],
    sink: str,
    sinkOptions: Mapping[str, str],
    *,
    columns: Sequence[str] | None = None,
    sinkColumns: Sequence[str] | None = None,
    examples: int = EXAMPLES,
) -> VerifyReport:
    """Read both sides and compare them: what ``twophase verify`` runs.

    ``source``: ``sequence`` (options ``start`` and ``end``, or the source's ``startOffset``
    and ``totalRows``) or ``kafka`` (the Kafka source's options, see ``expectedFromKafka``).
    ``sink``: ``files`` (the sink's options: ``path``, ``format``, ``partitionBy``...),
    ``postgres`` (``url``, ``table``...) or ``kafka`` (``topic`` or ``subscribe``,
    ``kafka.*``...). For a sequence source and a Kafka sink the rows are compared as the
    records ``CAST(id AS STRING) AS key, payload AS value`` (``asKafkaRecords``).
    """
    started = time.monotonic()
    if source not in SOURCES:
        raise VerifyInputError(f"unknown source {source!r}; use one of {', '.join(SOURCES)}")
    if sink not in SINKS:
        raise VerifyInputError(f"unknown sink {sink!r}; use one of {', '.join(SINKS)}")
    if source == "sequence":
        start, end = sequenceRange(sourceOptions)
        expected = expectedFromSequence(start, end)
        sourceText = f"sequence ids [{start}, {end})"
        if sink == "kafka":
            expected = asKafkaRecords(expected)
            sourceText += " as key = CAST(id AS STRING), value = payload"
    else:
        from twophase.verify.kafka import readKafka

        expected, sourceText = readKafka(sourceOptions, "source")
    names = tuple(columns) if columns else defaultColumns(expected)
    sinkNames = tuple(sinkColumns) if sinkColumns else names
    requireColumns(expected, names, "the source")
    if len(sinkNames) != len(names):
        raise VerifyInputError("give one --sink-columns name per --columns name")
    hints = pa.schema(
        [pa.field(s, expected.schema.field(n).type) for n, s in zip(names, sinkNames, strict=True)]
    )
    if sink == "files":
        path = optionOf(sinkOptions, "path") or ""
        fmt = optionOf(sinkOptions, "format") or "parquet"
        actual, sinkText = readFiles(path, fmt, sinkNames, hints, sinkOptions)
    elif sink == "postgres":
        url = optionOf(sinkOptions, "url") or ""
        table = optionOf(sinkOptions, "table") or optionOf(sinkOptions, "dbtable") or ""
        actual, sinkText = readPostgres(url, table, sinkNames, sinkOptions)
    else:
        from twophase.verify.kafka import readKafka

        actual, sinkText = readKafka(sinkOptions, "sink")
    report = compare(expected, actual, names, actualColumns=sinkNames, examples=examples)
    return replace(
        report,
        source=sourceText,
        sink=sinkText,
        seconds=round(time.monotonic() - started, 3),
    )


__all__ = ["SINKS", "SOURCES", "verify"]
