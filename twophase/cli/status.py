"""``twophase status``: what each sink's decision log decided, committed and left unfinished.

Reads the logs (and Spark's ``offsets``/``commits`` beside them) only: no Spark, no sink's
system. Shows the newest run and whether its driver still runs (where this host can tell:
``twophase.coordinator.liveness``), the recent batches' figures with where their time went
(``twophase.cli.batchtable``), what is in doubt (``twophase.cli.doubt``) and, for each decided,
unfinished batch, what the next start does with it in the words of ``doctor`` and ``recover``
(``twophase.doctor.nextstart``). Exit status: 0 nothing decided is unfinished, 1 decided
batches wait for their commit, 2 no checkpoint or no decision log (a ``CommandError``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any, TextIO

from twophase.cli.batchtable import timesJson, writeRecent
from twophase.cli.checkpoint import addCheckpointArguments, logLocations
from twophase.cli.doubt import Doubt
from twophase.cli.errors import EXIT_LEFT_TO_DO, EXIT_OK
from twophase.cli.sparkbatches import sparkBatches
from twophase.coordinator import DecisionLog
from twophase.coordinator.liveness import DriverCheck, Liveness, checkDriver
from twophase.coordinator.runs import Run
from twophase.doctor.nextstart import Unfinished
from twophase.metrics import readSinkMetrics

STATUS_EPILOG = """\
exit status: 0 nothing decided is unfinished (a batch stopped cleanly or aborted is not),
1 decided batches wait for their commit (twophase recover or a restart finishes them; one
awaiting a rewrite, only a restart), 2 no checkpoint or no decision log.

docs/operations.md ("twophase status") says what each column of the recent batches measures.
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
    spark = sparkBatches(checkpoint)
    for name, url in logLocations(checkpoint, sinkId):
        decisionLog = DecisionLog(url)
        info = decisionLog.status()
        times = commitTimes(decisionLog)
        recent = decisionLog.recentFigures(max(0, batches))
        metrics = readSinkMetrics(checkpoint, name, url)
        doubt = Doubt.of(metrics, decisionLog, checkpoint, name)
        unfinished = [Unfinished.of(state) for state in decisionLog.outstanding()]
        run = decisionLog.runs.read(info["run"]["epoch"]) if info.get("run") else None
        check = checkDriver(run) if run is not None else None
        if check is not None:
            info["run"].update(check.toJson())
        info["recentBatches"] = [
            {**f.toJson(), **timesJson(f, spark.get(f.batchId))} for f in recent
        ]
        info["inDoubt"] = doubt.toJson()
        info["nextStart"] = [
            {"batchId": u.batchId, "onlyRestart": u.onlyRestart, "says": u.describe()}
            for u in unfinished
        ]
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
        out.write(f"  newest run            {describeRun(run, check, info.get('run'))}\n")
        out.write(f"  committed batches     {info['committedBatches']} (still in the log)\n")
        out.write(f"  last committed batch  {info['lastCommitted']}\n")
        out.write(f"  aborted batches       {info['abortedBatches']}\n")
        if times:
            ms = info["commitMillis"]
            out.write(
                f"  driver commit time    p50 {ms['p50']} ms, p95 {ms['p95']} ms, "
                f"max {ms['max']} ms over {ms['batches']} batches\n"
            )
        writeRecent(recent, spark, out)
        doubt.write(out)
        writeUnfinished(info["outstanding"], unfinished, checkpoint, name, out)
    return result


def describeRun(run: Run | None, check: DriverCheck | None, summary: Any) -> str:
    """The newest run, and whether its driver still runs where this host can tell."""
    if run is None or check is None:
        return "-" if not summary else f"run {summary['epoch']} (its record cannot be read)"
    if check.liveness is Liveness.RUNNING:
        return f"{run.describe()}; its driver still runs ({check.reason})"
    if check.liveness is Liveness.GONE:
        return (
            f"{run.describe()}; its driver is gone ({check.reason}): the next start takes "
            "the log over"
        )
    return f"{run.describe()}; {check.said}"


def writeUnfinished(
    outstanding: list[dict[str, Any]],
    unfinished: list[Unfinished],
    checkpoint: str,
    name: str,
    out: TextIO,
) -> None:
    """The decided, unfinished batches, what the next start does with each, and the fix, in
    the words ``doctor`` and ``recover`` use (``twophase.doctor.nextstart``)."""
    out.write(f"  decided, unfinished   {len(outstanding)} batches\n")
    recover = f"twophase recover --checkpoint {checkpoint} --sink-id {name}"
    said = {u.batchId: u for u in unfinished}
    for batch in outstanding:
        out.write(f"    batch {batch['batchId']}: {len(batch['handles'])} handles\n")
        pending = said.get(batch["batchId"])
        if pending is not None:
            out.write(f"      {pending.describe()}\n")
        for handle in batch["handles"]:
            out.write(f"      {json.dumps(handle['handle'], sort_keys=True)}\n")
    for pending in unfinished:
        out.write(f"  to finish batch {pending.batchId}: {pending.fix(recover)}\n")
