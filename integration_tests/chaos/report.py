"""What a chaos run delivered and found: one pipeline's result, and the soak's table and JSON."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from integration_tests.chaos.schedule import PROCESS_KINDS, Event
from integration_tests.chaos.servers import SERVERS

KINDS = [*PROCESS_KINDS, *SERVERS, "driver point", "task point"]
"""The report's kill columns: timed kills by kind, then the protocol points that fired."""


@dataclass
class Kill:
    """An event that happened: when, and how long until the next batch was committed."""

    event: Event
    at: float  # time.monotonic() when delivered
    recoverySeconds: float | None = None


@dataclass
class ChaosResult:
    seed: int
    pipeline: str
    kills: list[Kill]
    starts: int
    failedStarts: int
    batches: int
    records: int
    missing: int
    duplicated: int
    unexpected: int
    seconds: float
    report: str
    skipped: list[Event] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.duplicated == 0 and self.unexpected == 0

    def killsByKind(self) -> Counter[str]:
        return Counter(
            ("task point" if k.event.point.startswith("task.") else "driver point")
            if k.event.kind == "point"
            else k.event.kind
            for k in self.kills
        )

    def longestRecovery(self) -> float:
        return max((k.recoverySeconds or 0.0 for k in self.kills), default=0.0)


def summaryTable(results: list[ChaosResult]) -> str:
    """The soak's Markdown table: kills by kind, batches, records, lost, duplicated, recovery."""
    head = ["pipeline", "seed", *KINDS, "kills", "starts", "batches", "records"]
    head += ["lost", "duplicated", "unexpected", "longest recovery s", "minutes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        byKind = r.killsByKind()
        row = [r.pipeline, str(r.seed), *(str(byKind.get(k, 0)) for k in KINDS)]
        row += [str(len(r.kills)), str(r.starts), str(r.batches), f"{r.records:,}"]
        row += [str(r.missing), str(r.duplicated), str(r.unexpected)]
        row += [f"{r.longestRecovery():.1f}", f"{r.seconds / 60:.1f}"]
        lines.append("| " + " | ".join(row) + " |")
    total = Counter[str]()
    for r in results:
        total.update(r.killsByKind())
    row = ["**all**", "", *(str(total.get(k, 0)) for k in KINDS)]
    row += [str(sum(len(r.kills) for r in results)), str(sum(r.starts for r in results))]
    row += [str(sum(r.batches for r in results)), f"{sum(r.records for r in results):,}"]
    row += [str(sum(r.missing for r in results)), str(sum(r.duplicated for r in results))]
    row += [str(sum(r.unexpected for r in results))]
    row += [f"{max((r.longestRecovery() for r in results), default=0):.1f}"]
    row += [f"{sum(r.seconds for r in results) / 60:.1f}"]
    lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def resultJson(result: ChaosResult) -> dict[str, Any]:
    return {
        "seed": result.seed,
        "pipeline": result.pipeline,
        "kills": {k: v for k, v in result.killsByKind().items()},
        "starts": result.starts,
        "failedStarts": result.failedStarts,
        "batches": result.batches,
        "records": result.records,
        "missing": result.missing,
        "duplicated": result.duplicated,
        "unexpected": result.unexpected,
        "longestRecoverySeconds": round(result.longestRecovery(), 2),
        "seconds": round(result.seconds, 1),
        "events": [k.event.describe() for k in result.kills],
    }
