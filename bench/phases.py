"""Where a streaming query's micro-batch spends its time: Spark's progress and twophase's log.

Spark's ``StreamingQueryProgress.durationMs`` splits a trigger into the source's offsets, the
planning, the sink (``addBatch``: for ``twophase.foreachBatch`` the tasks and the driver's
decision and commit) and the offset logs; twophase's decision log adds its own figures of the
same batch. Medians over the batches of a window, so a bench can say where a difference goes.

``timeline`` splits ``addBatch`` itself, from the instants the log's ``committed(N)`` keeps
(``times``): Spark's way to twophase's planning (for ``format()``, a Python planner worker),
the planning, the job's launch, the tasks, the way to the commit (for ``format()``, a Python
commit worker), the decision, the commits, and what follows until Spark has the batch back.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from bench._common import markdownTable

PHASES = {
    "trigger": ("triggerExecution",),
    "latestOffset": ("latestOffset",),
    "planning": ("getBatch", "queryPlanning"),
    "addBatch": ("addBatch",),
    "offset logs": ("walCommit", "commitOffsets"),
}
"""A column of the breakdown: the sum of these ``durationMs`` keys of Spark's progress."""
LOGGED = {"prepare": "prepareSeconds", "decision": "decisionSeconds", "commit": "commitSeconds"}
"""Twophase's columns: these figures of the decision log, per batch."""
STEPS = {
    "to plan": ("addBatch", "planStarted"),
    "plan": ("planStarted", "planEnded"),
    "to tasks": ("planEnded", "tasksStarted"),
    "tasks": ("tasksStarted", "tasksEnded"),
    "to commit": ("tasksEnded", "commitCalled"),
    "decide": ("commitCalled", "decided"),
    "commit": ("decided", "committed"),
    "after": ("committed", "addBatchEnd"),
}
"""The parts of ``addBatch``: from one instant to the next (``addBatch`` and ``addBatchEnd``
are Spark's, from its progress; the rest the log's ``times``)."""


def collect(query: Any, progress: dict[int, dict[str, Any]]) -> None:
    """Keep the query's recent progress reports by batch id (Spark keeps only the last 100)."""
    for report in query.recentProgress:
        progress[int(report["batchId"])] = report


def phases(
    progress: dict[int, dict[str, Any]], measured: float, end: float, logUrl: str | None
) -> dict[str, float]:
    """Median ms per phase of the batches that started in ``[measured, end]`` and read rows."""
    chosen = []
    for batch, report in sorted(progress.items()):
        began = datetime.fromisoformat(report["timestamp"].replace("Z", "+00:00")).timestamp()
        if measured <= began <= end and report.get("numInputRows", 0) > 0:
            chosen.append((batch, report.get("durationMs", {})))
    found: dict[str, list[float]] = {name: [] for name in PHASES}
    for _, durations in chosen:
        for name, keys in PHASES.items():
            found[name].append(float(sum(durations.get(k, 0) for k in keys)))
    if logUrl is not None:
        logged = loggedFigures(progress, logUrl)
        for name in LOGGED:
            found[name] = []
        for batch, _ in chosen:
            figures = logged.get(batch)
            for name, attr in LOGGED.items():
                value = getattr(figures, attr, None) if figures is not None else None
                if value is not None:
                    found[name].append(value * 1000)
    return {name: statistics.median(values) for name, values in found.items() if values}


def loggedFigures(progress: Mapping[int, Any], logUrl: str) -> dict[int, Any]:
    """The log's figures of every batch in ``progress``, by batch id, in one listing (ids start
    at 0, so the highest id plus one covers them all)."""
    from twophase.coordinator.log import DecisionLog

    return {f.batchId: f for f in DecisionLog(logUrl).recentFigures(max(progress) + 1)}


def phaseTable(rows: Sequence[tuple[str, str, Mapping[str, float]]]) -> str:
    """A markdown table: a rate and a path, then each phase's median ms (``-`` if not known)."""
    names = [*PHASES, *LOGGED]
    return markdownTable(
        ["rate (rows/s)", "path", *(f"{n} (ms)" for n in names)],
        [
            [rate, path, *(f"{f[n]:.0f}" if n in f else "-" for n in names)]
            for rate, path, f in rows
        ],
    )


def addBatchSpan(report: Mapping[str, Any]) -> tuple[float, float]:
    """When a progress report's ``addBatch`` began and ended (epoch s): the trigger's own phases
    run in order, and only ``commitOffsets`` follows the sink's."""
    began = datetime.fromisoformat(report["timestamp"].replace("Z", "+00:00")).timestamp()
    durations = report.get("durationMs", {})
    end = began + (durations.get("triggerExecution", 0) - durations.get("commitOffsets", 0)) / 1000
    return end - durations.get("addBatch", 0) / 1000, end


def timeline(
    progress: Mapping[int, Mapping[str, Any]], logUrl: str, skip: int = 2
) -> dict[str, float]:
    """Median ms of each of ``STEPS`` over the batches that read rows (after the first
    ``skip``, the query's start-up) and whose ``committed(N)`` holds the instants they need."""
    logged = loggedFigures(progress, logUrl)
    found: dict[str, list[float]] = {name: [] for name in STEPS}
    for batch, report in sorted(progress.items())[skip:]:
        figures = logged.get(batch)
        if report.get("numInputRows", 0) == 0 or figures is None or not figures.times:
            continue
        began, ended = addBatchSpan(report)
        instants = {**figures.times, "addBatch": began, "addBatchEnd": ended}
        for name, (start, end) in STEPS.items():
            if start in instants and end in instants:
                found[name].append((instants[end] - instants[start]) * 1000)
    return {name: statistics.median(values) for name, values in found.items() if values}


def stepTable(rows: Sequence[tuple[str, str, Mapping[str, float]]]) -> str:
    """A markdown table: a rate and a path, then each of ``STEPS``' median ms (``-`` if not
    known), as ``timeline`` gives them."""
    return markdownTable(
        ["rate (rows/s)", "path", *(f"{n} (ms)" for n in STEPS)],
        [
            [rate, path, *(f"{f[n]:.0f}" if n in f else "-" for n in STEPS)]
            for rate, path, f in rows
        ],
    )
