"""Verifying a ``twophase.multi`` sink: each target exactly once, and each id in all or none.

A multi pipeline is exactly-once when every target holds what the source offered exactly once
(each compared on its own, as a single sink is) and when no batch is visible in one target and
not in another. Committed data carries no batch id, so the second check is a join on the
identity: every id found in one target must be found in every other. An id found on one side
only is also a missing record of the other target (or an unexpected one of its own), so the
per-target counts already fail; the join names the systems that disagree, which is the question
a reader of a dual write asks first.

Each target is read with its own sink's reader (:func:`~twophase.verify.held.readSink`), with the
options the pipeline gave it (``orders.url`` is option ``url`` of target ``orders``). A Kafka
target of a sequence source is compared as ``key = CAST(id AS STRING), value = payload``; a
files or PostgreSQL target on the identity columns (``--columns``), named in the target by
``--sink-columns`` or by its own ``<name>.sinkColumns``. The join identity of a target is its
first identity column: the sequence id, or a Kafka target's key, compared as text.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from twophase.settings import TwoPhaseConfigError
from twophase.sinks.multi import Target, parseTargets
from twophase.sinks.registry import multiTargetKinds, readableKinds
from twophase.verify.compare import (
    EXAMPLES,
    KAFKA_COLUMNS,
    compare,
    defaultColumns,
    isBytes,
    requireColumns,
)
from twophase.verify.errors import VerifyInputError, inputErrors
from twophase.verify.held import readSink
from twophase.verify.offered import asKafkaRecords, readSource
from twophase.verify.report import VerifyReport

MULTI_HELP = """\
A twophase.multi sink (--sink multi) takes the pipeline's own options: targets=name=kind,...
and each target's options prefixed with its name (orders.url, events.topic...). Each target
is compared with the source on its own: a Kafka target of a sequence source as key =
CAST(id AS STRING), value = payload (<name>.sinkColumns=key checks the key only); a files or
postgres target on --columns, named in the target by --sink-columns or by its own
<name>.sinkColumns=a,b. Then the targets are joined on their first identity column (the id; a
Kafka target's key): an id found in one target and not in another is reported by target.
"""
"""What ``twophase verify --help`` says about ``--sink multi``."""

SINK_COLUMNS = "sinkColumns"
"""Per-target option (``<name>.sinkColumns=a,b``): the target's names of the identity columns.
Read by verify only; the pipeline's options may be passed as they are."""

READABLE = tuple(k for k in multiTargetKinds() if k in readableKinds())
"""Target kinds verify can read (a ``module:Class`` target has no reader)."""


@dataclass(frozen=True)
class TargetReport:
    """One target: its comparison with the source, and the ids other targets hold and it lacks."""

    name: str
    kind: str
    report: VerifyReport
    joinColumn: str
    absent: int = 0
    absentExamples: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.report.ok and self.absent == 0

    def toJson(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "ok": self.ok,
            "joinColumn": self.joinColumn,
            "absentIds": self.absent,
            "absentIdExamples": list(self.absentExamples),
            "report": self.report.toJson(),
        }


@dataclass(frozen=True)
class MultiVerifyReport(VerifyReport):
    """The outcome of verifying a multi sink; ``ok`` when every target is exactly-once and all
    targets hold the same ids.

    A :class:`VerifyReport` whose counts add up the targets' (records, not ids; ``columns`` are
    the targets' identity columns as ``target.column``); ``targets`` has each target's own
    report, and ``oneSided`` counts, over the targets, the ids held elsewhere and not there.
    """

    targets: tuple[TargetReport, ...] = ()

    @classmethod
    def of(
        cls, targets: Sequence[TargetReport], source: str, sink: str, seconds: float
    ) -> MultiVerifyReport:
        """The report of ``targets``, with their counts added up."""
        return cls(
            columns=tuple(f"{t.name}.{c}" for t in targets for c in t.report.columns),
            expectedRows=sum(t.report.expectedRows for t in targets),
            actualRows=sum(t.report.actualRows for t in targets),
            missing=sum(t.report.missing for t in targets),
            duplicated=sum(t.report.duplicated for t in targets),
            unexpected=sum(t.report.unexpected for t in targets),
            source=source,
            sink=sink,
            seconds=seconds,
            targets=tuple(targets),
        )

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.targets)

    @property
    def oneSided(self) -> int:
        return sum(t.absent for t in self.targets)

    def toJson(self) -> dict[str, Any]:
        """The report as JSON-ready data: the totals, then one entry per target."""
        return {
            "ok": self.ok,
            "source": self.source,
            "sink": self.sink,
            "missing": self.missing,
            "duplicated": self.duplicated,
            "unexpected": self.unexpected,
            "oneSidedIds": self.oneSided,
            "targets": [t.toJson() for t in self.targets],
            "seconds": self.seconds,
        }

    def describe(self) -> str:
        """The verdict, then per target its own report and the ids it lacks."""
        verdict = "OK: exactly once" if self.ok else "VIOLATED: not exactly once"
        if not self.ok and self.oneSided:
            verdict += ", and the targets disagree"
        lines = [verdict]
        if self.source:
            lines.append(f"  source      {self.source}")
        if self.sink:
            lines.append(f"  sink        {self.sink}")
        lines += [
            f"  missing     {self.missing}",
            f"  duplicated  {self.duplicated} (extra copies)",
            f"  unexpected  {self.unexpected}",
            f"  one-sided   {self.oneSided} ids (found in one target, not in another)",
        ]
        if self.seconds is not None:
            lines.append(f"  time        {self.seconds:.2f} s")
        for t in self.targets:
            lines.append(f"target {t.name} ({t.kind}):")
            lines += ["  " + line for line in t.report.describe().splitlines()]
            lines.append(f"  ids held by another target and not here ({t.joinColumn}): {t.absent}")
            if t.absentExamples:
                lines.append(f"  first of them: {', '.join(t.absentExamples)}")
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.describe()


def verifyMulti(
    source: str,
    sourceOptions: Mapping[str, str],
    sinkOptions: Mapping[str, str],
    *,
    columns: Sequence[str] | None = None,
    sinkColumns: Sequence[str] | None = None,
    examples: int = EXAMPLES,
) -> MultiVerifyReport:
    """Verify a ``twophase.multi`` sink: what ``twophase verify --sink multi`` runs.

    ``sinkOptions`` are the multi sink's (``targets`` and the prefixed options of each target);
    see the module docstring for how each target is compared and joined.
    """
    started = time.monotonic()
    with inputErrors("multi sink", TwoPhaseConfigError):
        targets = parseTargets(sinkOptions, "verify")
    unreadable = [t for t in targets if t.kind not in READABLE]
    if unreadable:
        which = ", ".join(f"{t.name} ({t.kind})" for t in unreadable)
        raise VerifyInputError(
            f"multi sink: verify reads targets of kind {', '.join(READABLE)}; cannot read {which}"
        )
    plans = []  # options are checked before anything is read
    for target in targets:
        options = _targetOptions(sinkOptions, target)
        named = [k for k in options if k.lower() == SINK_COLUMNS.lower()]
        own = _columnList(options.pop(named[0]) if named else None, target)
        plans.append((target, options, own))
    offered, sourceText = readSource(source, sourceOptions)
    reports: list[TargetReport] = []
    ids: list[pa.Array] = []
    for target, options, own in plans:
        expected, offeredText = offered, sourceText
        if target.kind == "kafka" and source == "sequence":
            expected = asKafkaRecords(offered)
            offeredText += " as key = CAST(id AS STRING), value = payload"
            names = own or KAFKA_COLUMNS
            targetNames = names
        else:
            names = tuple(columns) if columns else defaultColumns(expected)
            fallback = tuple(sinkColumns) if sinkColumns and target.kind != "kafka" else names
            targetNames = own or fallback
        requireColumns(expected, names, "the source")
        if len(targetNames) != len(names):
            raise VerifyInputError(
                f"multi sink, target {target.name}: {len(names)} identity columns "
                f"({', '.join(names)}) but {len(targetNames)} target columns "
                f"({', '.join(targetNames)}); give one per identity column "
                f"({target.name}.{SINK_COLUMNS} or --sink-columns)"
            )
        hints = pa.schema(
            [
                pa.field(s, expected.schema.field(n).type)
                for n, s in zip(names, targetNames, strict=True)
            ]
        )
        actual, text = readSink(target.kind, options, targetNames, hints)
        report = compare(expected, actual, names, actualColumns=targetNames, examples=examples)
        reports.append(
            TargetReport(
                target.name,
                target.kind,
                replace(report, source=offeredText, sink=text),
                joinColumn=targetNames[0],
            )
        )
        ids.append(_idsOf(actual, targetNames[0]))
    joined = [
        replace(r, absent=len(lacking), absentExamples=tuple(lacking[: max(0, examples)]))
        for r, lacking in zip(reports, _absentIds(ids), strict=True)
    ]
    return MultiVerifyReport.of(
        joined,
        source=sourceText,
        sink="multi " + ", ".join(f"{t.name}={t.kind}" for t in targets),
        seconds=round(time.monotonic() - started, 3),
    )


def _targetOptions(options: Mapping[str, str], target: Target) -> dict[str, str]:
    """Target ``name``'s options: ``<name>.<option>`` with the prefix taken off."""
    prefix = f"{target.name.lower()}."
    return {k[len(prefix) :]: v for k, v in options.items() if k.lower().startswith(prefix)}


def _columnList(text: str | None, target: Target) -> tuple[str, ...]:
    if text is None:
        return ()
    names = tuple(n.strip() for n in text.split(","))
    if not all(names):
        raise VerifyInputError(
            f"option {target.name}.{SINK_COLUMNS}={text!r}: give comma-separated column names"
        )
    if target.kind == "kafka" and not set(names) <= set(KAFKA_COLUMNS):
        raise VerifyInputError(
            f"option {target.name}.{SINK_COLUMNS}={text!r}: a Kafka target's columns are key "
            "and value"
        )
    return names


def _idsOf(table: pa.Table, column: str) -> pa.Array:
    """The distinct non-null values of a target's join column, as text."""
    if column not in table.column_names:
        return pa.array([], pa.large_string())
    values = table.column(column)
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    values = pc.drop_null(values)
    try:
        text = values.cast(pa.large_string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if not isBytes(values.type):
            raise VerifyInputError(
                f"column {column} ({values.type}) cannot be joined as text; choose another "
                "first identity column"
            ) from None
        text = pa.chunked_array(
            [pa.array(["0x" + bytes(v).hex() for v in values.to_pylist()], pa.large_string())]
        )
    unique = pc.unique(text)
    return unique.combine_chunks() if isinstance(unique, pa.ChunkedArray) else unique


def _absentIds(ids: Sequence[pa.Array]) -> list[list[str]]:
    """Per target, the ids some other target holds and it does not, in id order."""
    result: list[list[str]] = []
    for index, own in enumerate(ids):
        others = [a for i, a in enumerate(ids) if i != index]
        if not others:
            result.append([])
            continue
        elsewhere = pc.unique(pa.chunked_array(others, pa.large_string()))
        lacking = elsewhere.filter(pc.invert(pc.is_in(elsewhere, value_set=own)))
        result.append(sorted(lacking.to_pylist(), key=lambda v: (len(v), v)))
    return result


__all__ = [
    "MULTI_HELP",
    "SINK_COLUMNS",
    "MultiVerifyReport",
    "TargetReport",
    "verifyMulti",
]
