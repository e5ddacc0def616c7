"""What a chaos run delivered and found: one pipeline's result, the soak's tables and JSON.

The main table counts events by kind (kills, protocol points, faults beyond kills) per
pipeline with what was lost or duplicated; the liveness table says, per kind, how long the
query took to commit its next batch after the event (after the fault healed, for a fault),
and how it came back: ridden through by the running query, restarted by its supervision in
the same Spark session, or by a new driver process (the driver was killed, lost or stopped).
The recovery table gives the times of the last two ways side by side.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from integration_tests.chaos.faultkinds import FAULT_KINDS, NODE_KINDS
from integration_tests.chaos.schedule import PROCESS_KINDS, UPGRADED, Event
from integration_tests.chaos.servers import SERVERS

KILL_KINDS = [*PROCESS_KINDS, UPGRADED, *SERVERS, "driver point", "task point"]
"""The report's kill columns: timed kills by kind, then the protocol points that fired."""
KINDS = [*KILL_KINDS, *FAULT_KINDS]
"""Every column of events: the kills, then the faults beyond kills."""

RIDDEN = "ridden through"
"""The running query went on: no restart of any kind."""
RESTARTED = "restarted in the session"
"""``twophase.supervise`` restarted the query in the same driver process and Spark session."""
NEW_DRIVER = "new driver"
"""The driver ended (killed, lost, stopped or failed for good): a new driver process started."""
WAYS = (RIDDEN, RESTARTED, NEW_DRIVER)


@dataclass
class Kill:
    """An event that happened: when, and how long until the next batch was committed."""

    event: Event
    at: float  # time.monotonic() when delivered
    recoverySeconds: float | None = None
    healed: float | None = None
    """time.monotonic() when a fault ended; recovery counts from there."""
    way: str = ""
    """How the query came back (``RIDDEN``, ``RESTARTED``, ``NEW_DRIVER``), once known."""
    checked: str = ""
    """What was checked after it (a clean stop: ``status`` and ``doctor`` exited 0)."""

    @property
    def kind(self) -> str:
        """Its column: a kill's kind, ``driver point``/``task point``, or the fault's kind."""
        if self.event.kind == "point":
            return "task point" if self.event.point.startswith("task.") else "driver point"
        return self.event.kind


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
    liveReader: Any = None
    """For a pipeline writing Kafka: ``twophase verify``'s report of what a ``read_committed``
    reader that followed the run saw (``reader.LiveReader``)."""
    readerReplaced: int = 0
    """How many times that reader's consumer was stuck and replaced (``reader.STALL_SECONDS``)."""
    restarts: int = 0
    """Restarts by supervision in the same session, over all starts."""
    fatal: list[str] = field(default_factory=list)
    """Starts that ended with an error classified as fatal: none is expected, since every
    event of a schedule is one a restart recovers from."""

    @property
    def ok(self) -> bool:
        live = self.liveReader
        if live is not None and (live.missing or live.duplicated or live.unexpected):
            return False
        return self.missing == 0 and self.duplicated == 0 and self.unexpected == 0

    def killsByKind(self) -> Counter[str]:
        return Counter(k.kind for k in self.kills)

    def faultCount(self) -> int:
        return sum(1 for k in self.kills if k.event.isFault)

    def liveSummary(self) -> str:
        """The live reader's column: records seen once each, or what went wrong."""
        live = self.liveReader
        if live is None:
            return "-"
        if not (live.missing or live.duplicated or live.unexpected):
            replaced = f" ({self.readerReplaced} stuck, replaced)" if self.readerReplaced else ""
            return f"{int(live.actualRows):,} once{replaced}"
        return f"{live.missing} lost, {live.duplicated} twice, {live.unexpected} unexpected"

    def longestRecovery(self) -> float:
        return max((k.recoverySeconds or 0.0 for k in self.kills), default=0.0)


def summaryTable(results: list[ChaosResult]) -> str:
    """The soak's Markdown table: kills and faults by kind, batches, records, lost, duplicated,
    recovery. The columns of node faults show only for a run on the compose cluster."""
    total = Counter[str]()
    for r in results:
        total.update(r.killsByKind())
    kinds = [k for k in KINDS if k not in NODE_KINDS or any(total[n] for n in NODE_KINDS)]
    head = ["pipeline", "seed", *kinds, "kills", "faults", "starts", "batches", "records"]
    head += ["lost", "duplicated", "unexpected", "live reader", "longest recovery s", "minutes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        byKind = r.killsByKind()
        row = [r.pipeline, str(r.seed), *(str(byKind.get(k, 0)) for k in kinds)]
        row += [str(len(r.kills) - r.faultCount()), str(r.faultCount())]
        row += [str(r.starts), str(r.batches), f"{r.records:,}"]
        row += [str(r.missing), str(r.duplicated), str(r.unexpected), r.liveSummary()]
        row += [f"{r.longestRecovery():.1f}", f"{r.seconds / 60:.1f}"]
        lines.append("| " + " | ".join(row) + " |")
    row = ["**all**", "", *(str(total.get(k, 0)) for k in kinds)]
    faults = sum(r.faultCount() for r in results)
    row += [str(sum(len(r.kills) for r in results) - faults), str(faults)]
    row += [str(sum(r.starts for r in results))]
    row += [str(sum(r.batches for r in results)), f"{sum(r.records for r in results):,}"]
    row += [str(sum(r.missing for r in results)), str(sum(r.duplicated for r in results))]
    row += [str(sum(r.unexpected for r in results)), ""]
    row += [f"{max((r.longestRecovery() for r in results), default=0):.1f}"]
    row += [f"{sum(r.seconds for r in results) / 60:.1f}"]
    lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def liveness(results: list[ChaosResult]) -> dict[str, tuple[int, float, float, int]]:
    """Per kind that happened: (events, p50 and max seconds from the event, or a fault's
    healing, to the next committed batch, events with no batch after them)."""
    return _timed(results, lambda k: k.kind, KINDS)


def _timed(
    results: list[ChaosResult], keyOf: Any, order: Any
) -> dict[str, tuple[int, float, float, int]]:
    byKey: dict[str, list[float | None]] = {}
    for r in results:
        for k in r.kills:
            byKey.setdefault(keyOf(k), []).append(k.recoverySeconds)
    out = {}
    for key in order:
        times = byKey.get(key)
        if not times:
            continue
        seen = [t for t in times if t is not None]
        p50 = statistics.median(seen) if seen else 0.0
        out[key] = (len(times), p50, max(seen, default=0.0), len(times) - len(seen))
    return out


def ways(results: list[ChaosResult]) -> dict[str, Counter[str]]:
    """Per kind that happened: how many of its events each way of coming back followed."""
    out: dict[str, Counter[str]] = {}
    for r in results:
        for k in r.kills:
            out.setdefault(k.kind, Counter())[k.way or RIDDEN] += 1
    return out


def livenessTable(results: list[ChaosResult]) -> str:
    """Markdown: per kind, seconds from the event (a fault: from its healing) to the next
    committed batch, p50 and max, and how the query came back; then the same times by the way
    it came back."""
    head = ["event", "count", "next batch p50 s", "next batch max s", "no batch after"]
    head += [*WAYS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    byWay = ways(results)
    for kind, (count, p50, top, none) in liveness(results).items():
        timed = f"{p50:.1f} | {top:.1f}" if none < count else "- | -"
        counted = " | ".join(str(byWay.get(kind, Counter())[w]) for w in WAYS)
        lines.append(f"| {kind} | {count} | {timed} | {none} | {counted} |")
    head = ["came back by", "events", "next batch p50 s", "next batch max s", "no batch after"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for way, (count, p50, top, none) in _timed(results, lambda k: k.way or RIDDEN, WAYS).items():
        timed = f"{p50:.1f} | {top:.1f}" if none < count else "- | -"
        lines.append(f"| {way} | {count} | {timed} | {none} |")
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
        "restartsInSession": result.restarts,
        "fatalStarts": result.fatal,
        "ways": {kind: dict(counts) for kind, counts in ways([result]).items()},
        "liveness": {
            kind: {"count": c, "p50": round(p50, 2), "max": round(top, 2), "noBatchAfter": n}
            for kind, (c, p50, top, n) in liveness([result]).items()
        },
        "seconds": round(result.seconds, 1),
        "liveReader": None
        if result.liveReader is None
        else {
            "records": int(result.liveReader.actualRows),
            "missing": int(result.liveReader.missing),
            "duplicated": int(result.liveReader.duplicated),
            "unexpected": int(result.liveReader.unexpected),
            "stuckConsumersReplaced": result.readerReplaced,
        },
        "events": [k.event.describe() for k in result.kills],
    }
