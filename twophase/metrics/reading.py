"""Reading one sink's figures: a batch as its log recorded it, and the oldest batch in doubt.

The figures of a batch come from the decision log (:mod:`~twophase.coordinator.figures`).
What is in doubt is derived when read: the batches the log holds decided but not committed,
and the batch Spark planned (its ``offsets/N`` entry) that has neither a decision nor Spark's
``commits/N``: its transactions may be prepared and undecided. Its age runs from the time Spark
planned it (else from the decision), which bounds the age of its transactions from above: the
figure to hold against a participant's own timeout (Kafka's ``transaction.timeout.ms``, which
``sink.json`` carries).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import fsspec.core

from twophase.coordinator import DecisionLog
from twophase.coordinator.description import readSinkDescription
from twophase.coordinator.figures import BatchFigures
from twophase.coordinator.records import isoTime
from twophase.coordinator.storage import modifiedAt

TIMEOUT_OPTIONS = ("transaction.timeout.ms", "twophase.kafka.transactiontimeoutms")
"""Option names (lower-case, any prefix such as a ``twophase.multi`` target's) whose value is a
participant's transaction timeout in milliseconds."""


@dataclass(frozen=True)
class InDoubt:
    """The oldest batch of a sink that is not committed: decided, or planned and undecided."""

    batchId: int
    state: str
    """``decided`` (waiting for its commit) or ``undecided`` (planned by Spark, no decision)."""
    since: datetime
    """When Spark planned it (``offsets/N``), else when it was decided."""
    handles: int | None = None
    """The handles of its decision, when decided."""

    def ageSeconds(self, now: datetime | None = None) -> float:
        return max(0.0, ((now or datetime.now(UTC)) - self.since).total_seconds())

    def toJson(self, now: datetime | None = None) -> dict[str, Any]:
        return {
            "batchId": self.batchId,
            "state": self.state,
            "since": isoTime(self.since),
            "ageSeconds": round(self.ageSeconds(now), 3),
            "handles": self.handles,
        }


@dataclass(frozen=True)
class SinkMetrics:
    """One sink of a query, read at one moment: a batch's figures and what is in doubt."""

    sinkId: str
    batch: BatchFigures | None
    """The batch asked for, or ``None`` when its log has no state of it (or none was asked)."""
    pendingCommittables: int
    """Handles of decided batches not committed yet (Flink's ``pendingCommittables``)."""
    decidedUncommittedBatches: int
    lastDecided: int | None
    lastCommitted: int | None
    oldestInDoubt: InDoubt | None
    transactionTimeoutSeconds: float | None
    """The participant's transaction timeout from ``sink.json`` (Kafka), when it has one."""
    readAt: datetime

    def toJson(self) -> dict[str, Any]:
        return {
            "sinkId": self.sinkId,
            "batch": None if self.batch is None else self.batch.toJson(),
            "pendingCommittables": self.pendingCommittables,
            "decidedUncommittedBatches": self.decidedUncommittedBatches,
            "lastDecided": self.lastDecided,
            "lastCommitted": self.lastCommitted,
            "oldestInDoubt": None
            if self.oldestInDoubt is None
            else self.oldestInDoubt.toJson(self.readAt),
            "transactionTimeoutSeconds": self.transactionTimeoutSeconds,
            "readAt": isoTime(self.readAt),
        }


def readSinkMetrics(
    checkpointLocation: str | None, sinkId: str, logUrl: str, batchId: int | None = None
) -> SinkMetrics:
    """Read one sink: batch ``batchId``'s figures (if given) and what is in doubt now.

    ``checkpointLocation`` (Spark's) adds the planned, undecided batch; without it only the
    log's decided batches count. Reads a few small files; never writes.
    """
    log = DecisionLog(logUrl)
    summary = log.status()
    outstanding = summary["outstanding"]
    planned, sparkCommitted = _sparkBatches(checkpointLocation)
    decided = {b["batchId"]: b for b in outstanding}
    candidates: list[InDoubt] = []
    for entry in outstanding:
        since = planned.get(entry["batchId"]) or _time(entry.get("decidedAt"))
        if since is not None:
            candidates.append(
                InDoubt(entry["batchId"], "decided", since, len(entry.get("handles", ())))
            )
    lastDecided = summary["lastDecided"]
    for planId, since in sorted(planned.items()):
        if planId in sparkCommitted or planId in decided or since is None:
            continue
        if lastDecided is not None and planId <= lastDecided:
            continue  # committed in the log; Spark's commits/N follows
        candidates.append(InDoubt(planId, "undecided", since))
    return SinkMetrics(
        sinkId=sinkId,
        batch=log.figures(batchId) if batchId is not None else None,
        pendingCommittables=sum(len(b.get("handles", ())) for b in outstanding),
        decidedUncommittedBatches=len(outstanding),
        lastDecided=lastDecided,
        lastCommitted=summary["lastCommitted"],
        oldestInDoubt=min(candidates, key=lambda c: c.batchId, default=None),
        transactionTimeoutSeconds=transactionTimeoutSeconds(logUrl),
        readAt=datetime.now(UTC),
    )


def transactionTimeoutSeconds(logUrl: str) -> float | None:
    """The shortest transaction timeout among the sink's options in ``sink.json``, if any."""
    description = readSinkDescription(logUrl)
    if description is None:
        return None
    return timeoutOf(description.options)


def timeoutOf(options: Mapping[str, str]) -> float | None:
    """The shortest value of the ``TIMEOUT_OPTIONS`` in ``options``, in seconds."""
    found = []
    for key, value in options.items():
        if key.lower().endswith(TIMEOUT_OPTIONS):
            try:
                found.append(int(value) / 1000)
            except ValueError:
                continue
    return min(found, default=None)


def _sparkBatches(checkpointLocation: str | None) -> tuple[dict[int, datetime | None], set[int]]:
    """Spark's planned batches newer than its last ``commits/N``, with when each was planned,
    and the batch ids in ``commits/``."""
    if checkpointLocation is None:
        return {}, set()
    fs, root = fsspec.core.url_to_fs(checkpointLocation)
    base = root.rstrip("/")
    committed = {int(name) for name, _ in _entries(fs, f"{base}/commits")}
    last = max(committed, default=-1)
    planned = {
        int(name): modifiedAt(entry)
        for name, entry in _entries(fs, f"{base}/offsets")
        if int(name) > last
    }
    return planned, committed


def _entries(fs: Any, path: str) -> list[tuple[str, Mapping[str, Any]]]:
    try:
        listed = fs.ls(path, detail=True)
    except FileNotFoundError:
        return []
    found = []
    for entry in listed:
        name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
        if name.isdigit():
            found.append((name, entry))
    return found


def _time(text: Any) -> datetime | None:
    try:
        return None if text is None else datetime.fromisoformat(str(text))
    except ValueError:
        return None
