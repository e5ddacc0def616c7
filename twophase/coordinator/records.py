"""What a decision log's records say: batch states, logged handles, the owner, their encoding.

One record is one small JSON file named ``batch-<20-digit id>.<status>.json`` (or
``owner.json``), carrying ``format`` (:mod:`~twophase.coordinator.formats`), ``twophase`` (the
version that wrote it) and a ``checksum`` of its canonical body, so a torn or foreign file is
never taken for a record and a newer one is never misread. A batch's decision slot may go on
in links named ``batch-<id>.decided-<10-digit epoch>.json`` (:mod:`~twophase.coordinator.slots`),
and the runs that held the log are ``run-<10-digit epoch>.json``
(:mod:`~twophase.coordinator.runs`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from twophase.coordinator.formats import LOG_FORMAT
from twophase.protocol import Handle, TaskResult, dumpsHandle
from twophase.version import __version__

FORMAT = LOG_FORMAT
"""Version of the record layout, stored in every record (:mod:`~twophase.coordinator.formats`)."""

RECORD_NAME = re.compile(r"^batch-(\d{20})\.(decided|committed|aborted|rewrite|recovery)\.json$")
LINK_NAME = re.compile(r"^batch-(\d{20})\.decided-(\d{10})\.json$")
RUN_NAME = re.compile(r"^run-(\d{10})\.json$")

FENCED = "fenced"
"""The ``state`` of a fence: a record in a decision slot that only a run that new passes."""


class BatchStatus(StrEnum):
    """The state of one batch in the log."""

    DECIDED = "decided"
    COMMITTED = "committed"
    ABORTED = "aborted"
    REWRITE = "rewrite"
    """Not a state of its own: the record beside ``decided(N)`` that names the partitions whose
    decided transactions the participant aborted, and the replay's handles that replace them."""
    RECOVERY = "recovery"
    """Not a state either: what the recovery before batch N did, written only when it did
    something (figures for operators, never read by the protocol)."""


@dataclass(frozen=True)
class LoggedHandle:
    """One prepared transaction named by a decision: the task attempt that prepared it."""

    partitionId: int
    attemptNumber: int
    handle: Handle
    rows: int = 0
    inputs: tuple[int, ...] | None = None
    """The partitions of Spark's input the transaction holds (``TaskResult.inputs``); ``None``:
    the partition of the same id."""

    @property
    def key(self) -> str:
        """The handle's canonical JSON, the identity used to compare handles."""
        return dumpsHandle(self.handle)

    @classmethod
    def fromResult(cls, result: TaskResult) -> LoggedHandle:
        if result.handle is None:
            raise ValueError("a task result without a handle has nothing to log")
        return cls(
            result.partitionId,
            result.attemptNumber,
            dict(result.handle),
            result.rows,
            result.inputs,
        )

    def toJson(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "partitionId": self.partitionId,
            "attemptNumber": self.attemptNumber,
            "rows": self.rows,
            "handle": self.handle,
        }
        if self.inputs is not None:
            data["inputs"] = list(self.inputs)
        return data

    @classmethod
    def fromJson(cls, data: Mapping[str, Any]) -> LoggedHandle:
        handle = data["handle"]
        if not isinstance(handle, dict):
            raise ValueError("handle is not a JSON object")
        inputs = data.get("inputs")
        return cls(
            int(data["partitionId"]),
            int(data["attemptNumber"]),
            handle,
            int(data["rows"]),
            None if inputs is None else tuple(int(i) for i in inputs),
        )


@dataclass(frozen=True)
class BatchState:
    """The last complete state of one batch, with the handles its decision names."""

    batchId: int
    status: BatchStatus
    handles: tuple[LoggedHandle, ...] = ()
    queryId: str | None = None
    epoch: int | None = None
    """The run that decided the batch (``None``: a log without runs, or an earlier release)."""
    decidedAt: datetime | None = None
    committedAt: datetime | None = None
    abortedAt: datetime | None = None
    commitSeconds: float | None = None
    awaitingRewrite: tuple[int, ...] = ()
    """Partitions of decided N whose transactions the participant aborted (a Kafka transaction
    timeout) and that no replacement has written again yet: the replay of N writes them."""
    lostPartitions: tuple[int, ...] = ()
    """Every partition of N found lost so far (replaced or still awaiting)."""
    replacements: tuple[LoggedHandle, ...] = ()
    """The replay's handles that stand for lost partitions, checked against their fingerprints."""

    @property
    def isDecided(self) -> bool:
        """True once a decision exists: the batch must be committed, never rolled back."""
        return self.status in (BatchStatus.DECIDED, BatchStatus.COMMITTED)

    @property
    def rows(self) -> int:
        return sum(h.rows for h in self.handles)

    @property
    def handleKeys(self) -> frozenset[str]:
        """Every handle the decision names: the original ones and their replacements."""
        return frozenset(h.key for h in (*self.handles, *self.replacements))

    @property
    def liveHandles(self) -> tuple[LoggedHandle, ...]:
        """The handles to commit: a lost partition's replacement instead of the original, and
        nothing for a partition still awaiting its rewrite."""
        lost = set(self.lostPartitions)
        replaced = {h.partitionId: h for h in self.replacements}
        live = [h for h in self.handles if h.partitionId not in lost]
        live += [replaced[p] for p in sorted(replaced) if p in lost]
        return tuple(live)

    def loggedHandleOf(self, partitionId: int) -> LoggedHandle | None:
        """The handle the decision named first for a partition (its fingerprint is the one)."""
        return next((h for h in self.handles if h.partitionId == partitionId), None)

    def inputsOf(self, partitionId: int) -> tuple[int, ...]:
        """The input partitions the decided transaction of ``partitionId`` holds: as its task
        reported them, else the partition of the same id."""
        original = self.loggedHandleOf(partitionId)
        if original is None or original.inputs is None:
            return (partitionId,)
        return original.inputs

    def toJson(self) -> dict[str, Any]:
        return {
            "batchId": self.batchId,
            "status": str(self.status),
            "queryId": self.queryId,
            "decidedAt": isoTimeOrNone(self.decidedAt),
            "committedAt": isoTimeOrNone(self.committedAt),
            "abortedAt": isoTimeOrNone(self.abortedAt),
            "commitSeconds": self.commitSeconds,
            "rows": self.rows,
            "handles": [h.toJson() for h in self.handles],
            "awaitingRewrite": list(self.awaitingRewrite),
            "replacements": [h.toJson() for h in self.replacements],
        }


@dataclass(frozen=True)
class LogOwner:
    """Which streaming query writes this log (``owner.json``)."""

    sinkId: str
    queryId: str
    createdAt: datetime
    twophase: str | None = None
    """The twophase version that created the log (``None``: a release before format 2)."""


def header() -> dict[str, Any]:
    """The fields every record begins with: its format and the twophase version that wrote it."""
    return {"format": FORMAT, "twophase": __version__}


def recordName(batchId: int, status: BatchStatus) -> str:
    if batchId < 0:
        raise ValueError(f"batch id must be >= 0, got {batchId}")
    return f"batch-{batchId:020d}.{status}.json"


def linkName(batchId: int, epoch: int) -> str:
    """The link of batch N's decision slot that a fence of run ``epoch`` points to."""
    return f"batch-{batchId:020d}.decided-{epoch:010d}.json"


def runName(epoch: int) -> str:
    if epoch < 1:
        raise ValueError(f"a run's epoch must be >= 1, got {epoch}")
    return f"run-{epoch:010d}.json"


def checksum(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def isoTime(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")


def isoTimeOrNone(moment: datetime | None) -> str | None:
    return None if moment is None else isoTime(moment)


def parseTime(text: Any) -> datetime:
    return datetime.fromisoformat(str(text))


def parseTimeOrNone(text: Any) -> datetime | None:
    return None if text is None else parseTime(text)
