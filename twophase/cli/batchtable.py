"""``twophase status``'s table of the newest batches: each batch's figures and where its time went.

The decision log's figures (:mod:`~twophase.coordinator.figures`) time only the sink's own
steps: the slowest decided task's prepare, writing the decision, the driver's commit. A batch
can spend far longer elsewhere (its planning, the recovery before it, task attempts that failed
and were run again): Spark's ``offsets/N`` and ``commits/N`` bound the whole of it
(:mod:`~twophase.cli.sparkbatches`), so the table shows the batch's whole duration and the part
before its decision beside the log's figures, and says so in a line when most of a batch went
where the log's figures do not look. docs/operations.md says what each column measures.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any, TextIO

from twophase.cli.sparkbatches import SparkBatch
from twophase.coordinator.figures import BatchFigures

RECENT_COLUMNS = (
    ("batch", 6),
    ("outcome", 9),
    ("by", 11),
    ("rows", 10),
    ("bytes", 9),
    ("prep", 5),
    ("comm", 5),
    ("abrt", 5),
    ("retr", 5),
    ("batch s", 8),
    ("to decide s", 11),
    ("prepare ms", 10),
    ("decision ms", 11),
    ("commit ms", 9),
)

LEFT_ALIGNED = frozenset({1, 2})
"""The outcome and who committed: words, not numbers."""

UNSEEN_SECONDS = 5.0
"""Time before a decision beyond the slowest task's prepare that earns a line of its own, when
it is also most of the batch."""


def toDecisionSeconds(f: BatchFigures, spark: SparkBatch | None) -> float | None:
    """From Spark's plan of the batch (``offsets/N``) to its decision."""
    if spark is None or spark.plannedAt is None or f.decidedAt is None:
        return None
    return max(0.0, (f.decidedAt - spark.plannedAt).total_seconds())


def timesJson(f: BatchFigures, spark: SparkBatch | None) -> dict[str, Any]:
    """What ``--json`` adds to a batch's figures from Spark's files."""
    planned = spark.plannedAt if spark is not None else None
    ended = spark.endedAt if spark is not None else None
    toDecision = toDecisionSeconds(f, spark)
    return {
        "plannedAt": None if planned is None else planned.isoformat(),
        "sparkCommittedAt": None if ended is None else ended.isoformat(),
        "batchSeconds": None if spark is None or spark.seconds is None else round(spark.seconds, 3),
        "toDecisionSeconds": None if toDecision is None else round(toDecision, 3),
    }


def writeRecent(recent: list[BatchFigures], spark: Mapping[int, SparkBatch], out: TextIO) -> None:
    """The newest batches as a small table; ``-`` where the log or Spark's files do not say."""
    if not recent:
        out.write("  recent batches        none in the log\n")
        return
    out.write(f"  recent batches        the newest {len(recent)} in the log\n")
    header = [
        f"{name:<{width}}" if i in LEFT_ALIGNED else f"{name:>{width}}"
        for i, (name, width) in enumerate(RECENT_COLUMNS)
    ]
    out.write("    " + "  ".join(header).rstrip() + "\n")
    for f in recent:
        times = spark.get(f.batchId)
        toDecision = toDecisionSeconds(f, times)
        committed = None
        if f.committed is not None or f.alreadyCommitted is not None:
            committed = (f.committed or 0) + (f.alreadyCommitted or 0)
        cells = [
            str(f.batchId),
            "stopped" if f.stopped else f.outcome,
            f.committedBy or "-",
            _count(f.rows),
            _bytes(f.bytes),
            _count(f.prepared),
            _count(committed),
            _count(f.aborted),
            _count(f.retries),
            _seconds(times.seconds if times is not None else None),
            _seconds(toDecision),
            _millis(f.prepareSeconds),
            _millis(f.decisionSeconds),
            _millis(f.commitSeconds if f.outcome != "aborted" else f.abortSeconds),
        ]
        row = [
            f"{cell:<{width}}" if i in LEFT_ALIGNED else f"{cell:>{width}}"
            for i, (cell, (_, width)) in enumerate(zip(cells, RECENT_COLUMNS, strict=True))
        ]
        out.write("    " + "  ".join(row).rstrip() + "\n")
        if f.recovery is not None:
            r = f.recovery
            out.write(
                f"      before it, recovery finished batches {list(r.batchesFinished)} "
                f"({r.handlesCommitted} handles) and aborted {r.transactionsAborted} lingering "
                f"transactions in {r.seconds * 1000:.0f} ms\n"
            )
        unseen = _unseen(f, times, toDecision)
        if unseen is not None:
            out.write(unseen)


def _unseen(f: BatchFigures, spark: SparkBatch | None, toDecision: float | None) -> str | None:
    """A line for a batch most of whose time went before its decision, beyond its tasks'
    prepare: where the log's figures do not look."""
    if toDecision is None or spark is None or spark.seconds is None:
        return None
    beyond = toDecision - (f.prepareSeconds or 0.0)
    if beyond < UNSEEN_SECONDS or beyond < spark.seconds / 2:
        return None
    prepare = "-" if f.prepareSeconds is None else f"{f.prepareSeconds:.1f}\u00a0s"
    said = (
        f"{toDecision:.1f}\u00a0s of its {spark.seconds:.1f}\u00a0s passed before its decision, "
        f"and its slowest decided task prepared in {prepare}: the rest went outside its tasks' "
        "prepare, in the planning and scheduling of the batch (Spark's and the sink's; a first "
        "batch also starts its Python workers), the sink's recovery before it (retrying a "
        "system that did not answer) or task attempts that failed and ran again; the driver's "
        "log tells which"
    )
    lines = textwrap.wrap(said, 94)  # a number keeps its unit: joined by no-break spaces
    return "".join(f"      {line}\n".replace("\u00a0", " ") for line in lines)


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _millis(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _seconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(value)


__all__ = ["RECENT_COLUMNS", "timesJson", "toDecisionSeconds", "writeRecent"]
