"""``twophase status``: what each sink's decision log decided, committed and left unfinished.

Reads the logs only: no Spark, no sink's system. Exit status: 0 nothing decided is unfinished,
1 decided batches wait for their commit, 2 no checkpoint or no decision log (a
``CommandError``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any, TextIO

from twophase.cli.checkpoint import addCheckpointArguments, logLocations
from twophase.cli.errors import EXIT_LEFT_TO_DO, EXIT_OK
from twophase.coordinator import DecisionLog

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


def statusCommand(parsed: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run a parsed ``twophase status``."""
    return status(parsed.checkpoint, parsed.sink_id, parsed.json, out)


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


def status(checkpoint: str, sinkId: str | None, asJson: bool, out: TextIO) -> int:
    """Print each sink's decision log; 1 when a decided batch is unfinished, else 0.

    Raises ``CommandError`` when there is no checkpoint or no log (exit status 2).
    """
    result = EXIT_OK
    for name, url in logLocations(checkpoint, sinkId):
        decisionLog = DecisionLog(url)
        info = decisionLog.status()
        times = commitTimes(decisionLog)
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
        out.write(f"  committed batches     {info['committedBatches']} (still in the log)\n")
        out.write(f"  last committed batch  {info['lastCommitted']}\n")
        out.write(f"  aborted batches       {info['abortedBatches']}\n")
        if times:
            ms = info["commitMillis"]
            out.write(
                f"  driver commit time    p50 {ms['p50']} ms, p95 {ms['p95']} ms, "
                f"max {ms['max']} ms over {ms['batches']} batches\n"
            )
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
