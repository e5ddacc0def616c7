"""``twophase status``: what each sink's decision log decided, committed and left unfinished.

Reads the logs (and Spark's ``offsets``/``commits`` beside them) only: no Spark, no sink's
system. Shows the recent batches' figures and the oldest batch in doubt. Exit status: 0
nothing decided is unfinished, 1 decided batches wait for their commit, 2 no checkpoint or no
decision log (a ``CommandError``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any, TextIO

from twophase.cli.checkpoint import addCheckpointArguments, logLocations
from twophase.cli.errors import EXIT_LEFT_TO_DO, EXIT_OK
from twophase.coordinator import DecisionLog
from twophase.coordinator.figures import BatchFigures
from twophase.metrics import SinkMetrics, readSinkMetrics

STATUS_EPILOG = """\
exit status: 0 nothing decided is unfinished, 1 decided batches wait for their commit
(twophase recover or a restart finishes them), 2 no checkpoint or no decision log.
"""


def addStatusParser(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``status`` subcommand's parser."""
    cmd = sub.add_parser(
        "status",
        help="show the decision logs of a query",
        parents=[common],
        epilog=STATUS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    addCheckpointArguments(cmd)
    cmd.add_argument("--json", action="store_true", help="machine-readable output")
    cmd.add_argument(
        "--batches",
        type=int,
        default=10,
        metavar="N",
        help="how many of the newest batches to show (default 10)",
    )


def statusCommand(parsed: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run a parsed ``twophase status``."""
    return status(parsed.checkpoint, parsed.sink_id, parsed.json, out, parsed.batches)


def commitTimes(decisionLog: DecisionLog) -> list[float]:
    """Driver-side commit seconds of the committed batches still in the log."""
    times = []
    for batchId in decisionLog.committedBatchIds():
        state = decisionLog.state(batchId)
        if state is not None and state.commitSeconds is not None:
            times.append(state.commitSeconds)
    return times


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


def status(
    checkpoint: str, sinkId: str | None, asJson: bool, out: TextIO, batches: int = 10
) -> int:
    """Print each sink's decision log; 1 when a decided batch is unfinished, else 0.

    Raises ``CommandError`` when there is no checkpoint or no log (exit status 2).
    """
    result = EXIT_OK
    for name, url in logLocations(checkpoint, sinkId):
        decisionLog = DecisionLog(url)
        info = decisionLog.status()
        times = commitTimes(decisionLog)
        recent = decisionLog.recentFigures(max(0, batches))
        metrics = readSinkMetrics(checkpoint, name, url)
        info["recentBatches"] = [f.toJson() for f in recent]
        info["inDoubt"] = inDoubtJson(metrics)
        if info["outstanding"]:
            result = EXIT_LEFT_TO_DO
        if times:
            info["commitMillis"] = {
                "batches": len(times),
                "p50": round(statistics.median(times) * 1000, 2),
                "p95": round(percentile(times, 0.95) * 1000, 2),
                "max": round(max(times) * 1000, 2),
            }
        if asJson:
            out.write(json.dumps({"sinkId": name, **info}, indent=2) + "\n")
            continue
        out.write(f"sink {name}  ({url})\n")
        owner = info["owner"]
        out.write(f"  query id              {owner['queryId'] if owner else '-'}\n")
        run = info.get("run") or {}
        out.write(f"  held by               {run.get('description', '-')}\n")
        out.write(f"  committed batches     {info['committedBatches']} (still in the log)\n")
        out.write(f"  last committed batch  {info['lastCommitted']}\n")
        out.write(f"  aborted batches       {info['abortedBatches']}\n")
        if times:
            ms = info["commitMillis"]
            out.write(
                f"  driver commit time    p50 {ms['p50']} ms, p95 {ms['p95']} ms, "
                f"max {ms['max']} ms over {ms['batches']} batches\n"
            )
        writeRecent(recent, out)
        writeInDoubt(metrics, out)
        outstanding = info["outstanding"]
        out.write(f"  decided, unfinished   {len(outstanding)} batches\n")
        for batch in outstanding:
            out.write(f"    batch {batch['batchId']}: {len(batch['handles'])} handles\n")
            if batch.get("awaitingRewrite"):
                out.write(
                    f"      partitions {batch['awaitingRewrite']} were aborted by the system: "
                    "the next start of the query writes them again from its replay\n"
                )
            for handle in batch["handles"]:
                out.write(f"      {json.dumps(handle['handle'], sort_keys=True)}\n")
        if outstanding:
            out.write(
                f"  to finish them: twophase recover --checkpoint {checkpoint} --sink-id {name} "
                "(query stopped), or restart the query\n"
            )
    return result


def inDoubtJson(metrics: SinkMetrics) -> dict[str, Any]:
    """What is in doubt, for ``--json``: the oldest batch not committed, pending handles, the
    participant's transaction timeout."""
    doubt = metrics.oldestInDoubt
    return {
        "oldest": None if doubt is None else doubt.toJson(metrics.readAt),
        "pendingCommittables": metrics.pendingCommittables,
        "decidedUncommittedBatches": metrics.decidedUncommittedBatches,
        "transactionTimeoutSeconds": metrics.transactionTimeoutSeconds,
    }


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
    ("prepare ms", 10),
    ("decision ms", 11),
    ("commit ms", 9),
)

LEFT_ALIGNED = frozenset({1, 2})
"""The outcome and who committed: words, not numbers."""


def writeRecent(recent: list[BatchFigures], out: TextIO) -> None:
    """The newest batches as a small table; ``-`` where the log does not say."""
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
        committed = None
        if f.committed is not None or f.alreadyCommitted is not None:
            committed = (f.committed or 0) + (f.alreadyCommitted or 0)
        cells = [
            str(f.batchId),
            f.outcome,
            f.committedBy or "-",
            _count(f.rows),
            _bytes(f.bytes),
            _count(f.prepared),
            _count(committed),
            _count(f.aborted),
            _count(f.retries),
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


def writeInDoubt(metrics: SinkMetrics, out: TextIO) -> None:
    """The oldest batch not committed, and how old it is against the transaction timeout."""
    doubt = metrics.oldestInDoubt
    if doubt is None:
        out.write("  in doubt              nothing\n")
        return
    age = doubt.ageSeconds(metrics.readAt)
    what = (
        f"decided, not committed ({doubt.handles} handles)"
        if doubt.state == "decided"
        else "planned by Spark, not decided (its transactions may be prepared)"
    )
    line = f"  in doubt              batch {doubt.batchId}: {what}, for {age:.1f} s"
    if metrics.transactionTimeoutSeconds is not None:
        line += f" (transaction timeout {metrics.transactionTimeoutSeconds:g} s)"
    out.write(line + "\n")


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _millis(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(value)
