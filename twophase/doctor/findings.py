"""What ``twophase doctor`` knows: what a system holds for a sink, and the findings it reports.

A system's inspection (``twophase.sinks.<kind>.inspect``) lists what it holds under the sink's
names as ``Held`` values, system-neutral, so the comparison with the decision log
(``twophase.doctor.classify``) and the rendering (``twophase.doctor.render``) know no system.
A ``Finding`` is one line for people, with the one command (or the reason for none) that
settles it, and the same facts as JSON for monitoring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from twophase.coordinator.records import isoTimeOrNone


class CannotCheck(Exception):
    """The system (or the log) could not be asked: one short line naming it and the fix.

    Never carries a traceback's worth of text nor a secret; ``twophase doctor`` exits 2.
    """


@dataclass(frozen=True)
class Stall:
    """A partition whose ``read_committed`` readers stand still: last stable offset < high
    watermark, because a transaction holding records in it is still open."""

    topic: str
    partition: int
    lastStableOffset: int
    highWatermark: int

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def toJson(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "lastStableOffset": self.lastStableOffset,
            "highWatermark": self.highWatermark,
        }


@dataclass(frozen=True)
class Held:
    """One transaction or staged attempt a system holds under the sink's names.

    ``key`` is the value a logged handle names it by (``handleKey`` of the system's inspect
    module): a gid, a staging token, a transactional id, a staged attempt. ``foreign`` says
    why recovery will never touch it (it has the sink's prefix but not its naming, or it lives
    in another database), else ``None``; ``madeBySink`` is false for a name recovery does sweep
    but the sink never makes (a gid with the sink's prefix prepared by hand). ``abortsAt`` is
    when the system ends it on its own (Kafka's transaction timeout).
    """

    system: str
    key: str
    what: str
    batchId: int | None = None
    partitionId: int | None = None
    since: datetime | None = None
    abortsAt: datetime | None = None
    state: str | None = None
    detail: str = ""
    foreign: str | None = None
    madeBySink: bool = True
    stalls: tuple[Stall, ...] = ()

    def toJson(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "id": self.key,
            "what": self.what,
            "batchId": self.batchId,
            "partitionId": self.partitionId,
            "since": isoTimeOrNone(self.since),
            "abortsAt": isoTimeOrNone(self.abortsAt),
            "state": self.state,
            "detail": self.detail or None,
            "foreign": self.foreign,
            "stalledPartitions": [s.toJson() for s in self.stalls],
        }


@dataclass
class Inspection:
    """What one system holds for one sink: held transactions, and stalls no held one explains.

    ``where`` names the system without a secret (``user@host:port/db``, the bootstrap
    servers, the staging path).
    """

    system: str
    where: str
    held: list[Held] = field(default_factory=list)
    otherStalls: list[Stall] = field(default_factory=list)
    grants: str | None = None
    """What the check of the sink's grants or ACLs found, in one line: all held, the missing
    ones and their fix, or why it could not look; ``None``: the system has no such check."""
    grantsMissing: bool = False
    """A grant the sink needs is missing: its next start fails until it is given."""


class Kind(StrEnum):
    """What a finding is about; the JSON ``finding`` field."""

    DECIDED_UNFINISHED = "decided-unfinished"
    AWAITING_REWRITE = "awaiting-rewrite"
    UNDECIDED = "undecided"
    IN_FLIGHT = "in-flight"
    UNKNOWN = "unknown-to-log"
    FOREIGN = "foreign"
    STALLED_ELSEWHERE = "stalled-elsewhere"
    CLEAN = "clean"


ACTION_KINDS = frozenset(
    {Kind.DECIDED_UNFINISHED, Kind.AWAITING_REWRITE, Kind.UNDECIDED, Kind.UNKNOWN, Kind.FOREIGN}
)
"""Findings that need action or will be acted on: ``twophase doctor`` exits 1 with any."""


@dataclass(frozen=True)
class Finding:
    """One thing doctor found for one sink: what, the facts, and the command that settles it."""

    sinkId: str
    kind: Kind
    summary: str
    fix: str
    batchId: int | None = None
    held: tuple[Held, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def needsAction(self) -> bool:
        return self.kind in ACTION_KINDS

    def toJson(self) -> dict[str, Any]:
        return {
            "sinkId": self.sinkId,
            "finding": str(self.kind),
            "needsAction": self.needsAction,
            "batchId": self.batchId,
            "summary": self.summary,
            "fix": self.fix,
            **self.facts,
            "held": [h.toJson() for h in self.held],
        }


@dataclass
class SinkReport:
    """Everything doctor says about one sink: its findings, or why it could not check."""

    sinkId: str
    logUrl: str
    system: str | None = None
    where: str | None = None
    findings: list[Finding] = field(default_factory=list)
    cannotCheck: str | None = None
    grants: str | None = None
    grantsMissing: bool = False

    @property
    def needsAction(self) -> bool:
        return self.grantsMissing or any(f.needsAction for f in self.findings)

    def toJson(self) -> dict[str, Any]:
        return {
            "sinkId": self.sinkId,
            "log": self.logUrl,
            "system": self.system,
            "where": self.where,
            "status": "cannot-check"
            if self.cannotCheck is not None
            else ("action" if self.needsAction else "clean"),
            "cannotCheck": self.cannotCheck,
            "grants": self.grants,
            "grantsMissing": self.grantsMissing,
            "findings": [f.toJson() for f in self.findings],
        }


EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_CANNOT_CHECK = 2


def exitStatus(reports: list[SinkReport]) -> int:
    """2 when any sink could not be checked (or none was found), else 1 with any finding that
    needs action, else 0."""
    if not reports or any(r.cannotCheck is not None for r in reports):
        return EXIT_CANNOT_CHECK
    return EXIT_FINDINGS if any(r.needsAction for r in reports) else EXIT_CLEAN
