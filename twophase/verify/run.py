"""One verification by kind and options: read both sides, then compare them.

This is what ``twophase verify`` (``twophase.cli``) runs: the source's and the sink's kinds
and options name what to read (:mod:`~twophase.verify.offered`, :mod:`~twophase.verify.held`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pyarrow as pa

from twophase.sinks.registry import readableKinds
from twophase.verify.compare import EXAMPLES, compare, defaultColumns, requireColumns
from twophase.verify.errors import VerifyInputError
from twophase.verify.held import readSink
from twophase.verify.multi import verifyMulti
from twophase.verify.offered import asKafkaRecords, readSource
from twophase.verify.report import VerifyReport

SOURCES = ("sequence", "kafka")
"""The source kinds ``verify`` reads."""

SINKS = readableKinds()
"""The sink kinds ``verify`` reads: the built-in sinks with a reader, and ``multi``."""


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
    ``postgres`` (``url``, ``table``...), ``delta`` (``path``), ``iceberg`` (``table``,
    ``catalog.*``) or ``kafka`` (``topic`` or ``subscribe``, ``kafka.*``...) or ``multi``
    (``targets`` and each target's prefixed options: every target checked on its own, then
    joined on the identity, see :mod:`~twophase.verify.multi`; the report is then a
    :class:`~twophase.verify.multi.MultiVerifyReport`). For
    a sequence source and a Kafka sink the rows are compared as the records
    ``CAST(id AS STRING) AS key, payload AS value`` (``asKafkaRecords``).
    """
    started = time.monotonic()
    if source not in SOURCES:
        raise VerifyInputError(f"unknown source {source!r}; use one of {', '.join(SOURCES)}")
    if sink not in SINKS:
        raise VerifyInputError(f"unknown sink {sink!r}; use one of {', '.join(SINKS)}")
    if sink == "multi":
        return verifyMulti(
            source,
            sourceOptions,
            sinkOptions,
            columns=columns,
            sinkColumns=sinkColumns,
            examples=examples,
        )
    expected, sourceText = readSource(source, sourceOptions)
    if source == "sequence" and sink == "kafka":
        expected = asKafkaRecords(expected)
        sourceText += " as key = CAST(id AS STRING), value = payload"
    names = tuple(columns) if columns else defaultColumns(expected)
    sinkNames = tuple(sinkColumns) if sinkColumns else names
    if source == "sequence" and sink == "kafka":
        requireColumns(
            expected,
            names,
            "the sequence source, compared with a Kafka topic as its records (key, value),",
            fix="name key (or key,value) with --columns",
        )
    requireColumns(expected, names, "the source")
    if len(sinkNames) != len(names):
        raise VerifyInputError("give one --sink-columns name per --columns name")
    hints = pa.schema(
        [pa.field(s, expected.schema.field(n).type) for n, s in zip(names, sinkNames, strict=True)]
    )
    actual, sinkText = readSink(sink, sinkOptions, sinkNames, hints)
    report = compare(expected, actual, names, actualColumns=sinkNames, examples=examples)
    return replace(
        report,
        source=sourceText,
        sink=sinkText,
        seconds=round(time.monotonic() - started, 3),
    )


__all__ = ["SINKS", "SOURCES", "verify"]
