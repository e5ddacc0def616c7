"""The ``twophase`` command: ``demo``, ``status`` and ``recover``.

``status`` reads a query's decision logs and needs no Spark. ``recover`` rebuilds each sink
from the ``sink.json`` kept beside its log and finishes what the log decided, then aborts the
sink's prepared transactions that no decision covers; ``--dry-run`` only says what it would do.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import statistics
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import fsspec

from twophase.coordinator import Coordinator, DecisionLog
from twophase.driver import SINK_DESCRIPTION

log = logging.getLogger(__name__)


def sinkLogs(checkpoint: str, sinkId: str | None = None) -> Iterator[tuple[str, str]]:
    """(sinkId, log URL) of every twophase sink log under ``<checkpoint>/twophase/``."""
    fs, root = fsspec.core.url_to_fs(checkpoint)
    base = f"{root.rstrip('/')}/twophase"
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    prefix = "" if protocol in ("file", "local") else f"{protocol}://"
    try:
        entries = fs.ls(base, detail=True)
    except FileNotFoundError:
        return
    for entry in sorted(entries, key=lambda e: str(e["name"])):
        if entry["type"] != "directory":
            continue
        name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
        if sinkId is None or name == sinkId:
            yield name, f"{prefix}{entry['name']}"


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
    found = False
    for name, url in sinkLogs(checkpoint, sinkId):
        found = True
        decisionLog = DecisionLog(url)
        info = decisionLog.status()
        times = commitTimes(decisionLog)
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
            for handle in batch["handles"]:
                out.write(f"      {json.dumps(handle['handle'], sort_keys=True)}\n")
    if not found:
        out.write(f"no twophase decision log under {checkpoint}/twophase\n")
        return 1
    return 0


def loadSink(url: str) -> Any:
    """Rebuild the sink described by ``sink.json`` in a log directory."""
    fs, root = fsspec.core.url_to_fs(url)
    path = f"{root.rstrip('/')}/{SINK_DESCRIPTION}"
    try:
        with fs.open(path, "r") as f:
            description = json.load(f)
    except FileNotFoundError:
        raise SystemExit(
            f"{url} has no {SINK_DESCRIPTION}: the sink never planned a batch with this "
            "version of twophase, so recover cannot know which sink finishes its transactions"
        ) from None
    moduleName, _, className = str(description["class"]).partition(":")
    target: Any = importlib.import_module(moduleName)
    for part in className.split("."):
        target = getattr(target, part)
    return target(dict(description["options"]))


def recover(checkpoint: str, sinkId: str | None, dryRun: bool, out: TextIO) -> int:
    found = False
    for name, url in sinkLogs(checkpoint, sinkId):
        found = True
        decisionLog = DecisionLog(url)
        outstanding = decisionLog.outstanding()
        if dryRun:
            out.write(f"sink {name}: would commit {len(outstanding)} decided batches\n")
            for batch in outstanding:
                out.write(f"  batch {batch.batchId}: {len(batch.handles)} handles\n")
            out.write(
                f"sink {name}: would then abort its prepared transactions no decision covers\n"
            )
            continue
        sink = loadSink(url)
        report = Coordinator(sink, decisionLog, name).recover()
        out.write(
            f"sink {name}: committed {report.handlesCommitted} transactions of "
            f"{len(report.batchesFinished)} decided batches {list(report.batchesFinished)}, "
            f"aborted {report.transactionsAborted} lingering transactions "
            f"in {report.seconds * 1000:.0f} ms\n"
        )
    if not found:
        out.write(f"no twophase decision log under {checkpoint}/twophase\n")
        return 1
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="twophase", description="Exactly-once sinks for Spark")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="crash a streaming pipeline and prove exactly-once", add_help=False)
    for name, helpText in (
        ("status", "show the decision logs of a query"),
        ("recover", "finish decided batches, abort undecided transactions"),
    ):
        cmd = sub.add_parser(name, help=helpText)
        cmd.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
        cmd.add_argument("--sink-id", help="only this sink (default: every sink of the query)")
        if name == "status":
            cmd.add_argument("--json", action="store_true", help="machine-readable output")
        else:
            cmd.add_argument("--dry-run", action="store_true", help="only say what would be done")
    return p


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["demo"]:
        from twophase import demo

        return demo.main(args[1:])
    parsed = parser().parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if parsed.command == "status":
        return status(parsed.checkpoint, parsed.sink_id, parsed.json, sys.stdout)
    return recover(parsed.checkpoint, parsed.sink_id, parsed.dry_run, sys.stdout)


if __name__ == "__main__":
    raise SystemExit(main())
