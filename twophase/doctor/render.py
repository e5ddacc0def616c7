"""``twophase doctor``'s output: a table for people, JSON for monitoring; never a secret.

Every line passes through ``twophase.redaction.redact`` on its way out, whatever built it.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, TextIO

from twophase.coordinator.records import isoTime
from twophase.doctor.findings import (
    EXIT_CANNOT_CHECK,
    EXIT_CLEAN,
    EXIT_FINDINGS,
    Finding,
    Held,
    SinkReport,
)
from twophase.redaction import redact

EXIT_MEANING = {
    EXIT_CLEAN: "clean",
    EXIT_FINDINGS: "findings that need action or that the next start acts on",
    EXIT_CANNOT_CHECK: "could not check everything",
}


def asJson(
    reports: list[SinkReport], status: int, now: datetime, problem: str | None = None
) -> dict[str, Any]:
    """The JSON document: when, the exit status and its meaning, why nothing could be checked
    (``cannotCheck``, else ``null``), one entry per sink."""
    return {
        "checkedAt": isoTime(now),
        "exitStatus": status,
        "meaning": EXIT_MEANING.get(status, ""),
        "cannotCheck": problem,
        "sinks": [r.toJson() for r in reports],
    }


def writeJson(
    reports: list[SinkReport],
    status: int,
    now: datetime,
    out: TextIO,
    problem: str | None = None,
) -> None:
    out.write(redact(json.dumps(asJson(reports, status, now, problem), indent=2)) + "\n")


def writeText(reports: list[SinkReport], status: int, now: datetime, out: TextIO) -> None:
    """One block per sink: a row per finding (what, batch, id, age, time left), then its fix."""
    lines: list[str] = []
    for report in reports:
        asked = (
            f"{report.system} at {report.where}"
            if report.where
            else f"{report.system or 'the log only'}, not checked"
        )
        lines.append(f"sink {report.sinkId}: {asked}  (log {report.logUrl})")
        if report.cannotCheck is not None:
            lines.append(f"  cannot check: {report.cannotCheck}")
        if report.grants is not None:
            lines.append(
                f"  {'grants missing' if report.grantsMissing else 'grants'}: {report.grants}"
            )
        if report.findings:
            lines.append(
                f"  {'FINDING':<20} {'BATCH':>6}  {'HELD':<48} {'AGE':>9} {'ABORTS IN':>9}"
            )
        for finding in report.findings:
            lines.extend(_findingLines(finding, now))
    lines.append(f"exit {status}: {EXIT_MEANING.get(status, '')}")
    out.write("".join(redact(line) + "\n" for line in lines))


def _findingLines(finding: Finding, now: datetime) -> list[str]:
    batch = "-" if finding.batchId is None else str(finding.batchId)
    held: list[Held | None] = [*finding.held] or [None]
    lines = []
    for index, item in enumerate(held):
        name = str(finding.kind) if index == 0 else ""
        shown = batch if index == 0 else ""
        lines.append(f"  {name:<20} {shown:>6}  {_heldCells(item, now)}".rstrip())
        for stall in item.stalls if item is not None else ():
            since = f" since {isoTime(item.since)}" if item is not None and item.since else ""
            lines.append(
                f"  {'':<20} {'':>6}    stalls read_committed readers of {stall.name} "
                f"(last stable offset {stall.lastStableOffset} < high watermark "
                f"{stall.highWatermark}){since}"
            )
    lines.append(f"  {'':<20} {'':>6}  {finding.summary}")
    lines.append(f"  {'':<20} {'':>6}  fix: {finding.fix}")
    return lines


def _heldCells(item: Held | None, now: datetime) -> str:
    if item is None:
        return f"{'-':<48} {'-':>9} {'-':>9}"
    key = item.key if len(item.key) <= 48 else item.key[:45] + "..."
    age = _short((now - item.since).total_seconds()) if item.since is not None else "?"
    left = _short((item.abortsAt - now).total_seconds()) if item.abortsAt is not None else "-"
    return f"{key:<48} {age:>9} {left:>9}"


def _short(seconds: float) -> str:
    if seconds < 0:
        return "passed"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"
