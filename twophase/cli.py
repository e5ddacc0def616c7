"""The ``twophase`` command: ``demo``, ``status``, ``recover``, ``doctor`` and ``verify``.

``status`` reads a query's decision logs and needs no Spark. ``recover`` rebuilds each sink
from the ``sink.json`` kept beside its log and finishes what the log decided, then aborts the
sink's prepared transactions that no decision covers; ``--dry-run`` only says what it would do.
``doctor`` holds each log against what the sink's system holds (``twophase.doctor``).
``verify`` compares what a source offered with what a sink holds (``twophase.verify``) and
exits 0 when every record is there exactly once, 1 on any violation, 2 on bad input.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import statistics
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from twophase.coordinator import Coordinator, DecisionLog
from twophase.coordinator.description import SINK_DESCRIPTION, readSinkDescription
from twophase.coordinator.paths import sinkLogLocations
from twophase.protocol import Committer
from twophase.redaction import getLogger, rememberSecrets
from twophase.settings import coordinatorSettings
from twophase.verify import EXAMPLES, SINKS, SOURCES, VerifyInputError, verify

log = getLogger(__name__)

MOVED_CLASSES = {
    "twophase.sinks.files:FilesSink": "twophase.spark.files:FilesSink",
    "twophase.sinks.postgres:PostgresSink": "twophase.spark.postgres:PostgresSink",
    "twophase.sinks.kafka:KafkaSink": "twophase.spark.kafka:KafkaSink",
}
"""Built-in sink classes named in ``sink.json`` by earlier versions, and where they live now."""


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
    for name, url in sinkLogLocations(checkpoint, sinkId):
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
            if batch.get("awaitingRewrite"):
                out.write(
                    f"      partitions {batch['awaitingRewrite']} were aborted by the system: "
                    "the next start of the query writes them again from its replay\n"
                )
            for handle in batch["handles"]:
                out.write(f"      {json.dumps(handle['handle'], sort_keys=True)}\n")
    if not found:
        out.write(f"no twophase decision log under {checkpoint}/twophase\n")
        return 1
    return 0


def loadSink(url: str, extraOptions: Mapping[str, str]) -> tuple[Committer, dict[str, str]]:
    """Rebuild the committer of the sink described by ``sink.json`` in a log directory.

    ``sink.json`` holds only the sink's safe options; ``extraOptions`` (``--option``) add what
    it lacks, such as a password, and win over the stored ones.
    """
    description = readSinkDescription(url)
    if description is None:
        raise SystemExit(
            f"{url} has no {SINK_DESCRIPTION}: the sink never planned a batch with this "
            "version of twophase, so recover cannot know which sink finishes its transactions"
        )
    className = MOVED_CLASSES.get(description.className, description.className)
    moduleName, _, qualName = className.partition(":")
    target: Any = importlib.import_module(moduleName)
    for part in qualName.split("."):
        target = getattr(target, part)
    options = {**description.options, **extraOptions}
    rememberSecrets(extraOptions, getattr(target, "safeOptions", ()))
    sink = target(options)
    makeCommitter = getattr(sink, "createCommitter", None)
    committer = makeCommitter() if makeCommitter is not None else sink
    return committer, options


def recover(
    checkpoint: str,
    sinkId: str | None,
    dryRun: bool,
    out: TextIO,
    extraOptions: Mapping[str, str] | None = None,
) -> int:
    found = False
    for name, url in sinkLogLocations(checkpoint, sinkId):
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
        committer, options = loadSink(url, extraOptions or {})
        report = Coordinator(committer, decisionLog, name, coordinatorSettings(options)).recover()
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


VERIFY_SHORTCUTS = {
    "start": ("source", "sequence", "start"),
    "end": ("source", "sequence", "end"),
    "path": ("sink", "files", "path"),
    "format": ("sink", "files", "format"),
    "url": ("sink", "postgres", "url"),
    "table": ("sink", "postgres", "table"),
    "topic": ("sink", "kafka", "topic"),
}
"""``twophase verify`` flags that stand for one option of one source or sink kind."""

VERIFY_EPILOG = """\
Options are the ones the pipeline's readStream/writeStream got (Spark's names), as KEY=VALUE:
--source-option for the source, --sink-option for the sink. Shortcuts: --start/--end (sequence
ids [start, end)), --path/--format (files), --url/--table (postgres), --topic (kafka sink).
Kafka is read read_committed from startingOffsets (default earliest) to endingOffsets (default
latest; both also take Spark's JSON). A Kafka sink uses the source's kafka.* options when it is
given no kafka.bootstrap.servers of its own. A sequence source checked against a Kafka sink is
compared as key = CAST(id AS STRING), value = payload.

exit status: 0 exactly once, 1 missing/duplicated/unexpected records, 2 bad input.

examples:
  twophase verify --source sequence --start 0 --end 1000000 --sink files --path out/
  twophase verify --source sequence --end 100000 --sink postgres \\
      --url postgresql://user@localhost:5432/db --table public.events
  twophase verify --source kafka --source-option kafka.bootstrap.servers=localhost:9092 \\
      --source-option subscribe=in --sink kafka --topic out
"""


def _keyValue(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _columnList(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated column names, got {text!r}")
    return names


def _addVerifyParser(sub: Any) -> None:
    cmd = sub.add_parser(
        "verify",
        help="check that a sink holds what a source offered, exactly once",
        description="Compare what a source offered with what a sink holds: missing, "
        "duplicated and unexpected records.",
        epilog=VERIFY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("--source", required=True, choices=SOURCES)
    cmd.add_argument("--sink", required=True, choices=SINKS)
    cmd.add_argument(
        "--source-option",
        action="append",
        type=_keyValue,
        default=[],
        metavar="KEY=VALUE",
        help="an option of the source (repeat)",
    )
    cmd.add_argument(
        "--sink-option",
        action="append",
        type=_keyValue,
        default=[],
        metavar="KEY=VALUE",
        help="an option of the sink (repeat)",
    )
    for flag, (side, kind, option) in VERIFY_SHORTCUTS.items():
        cmd.add_argument(f"--{flag}", help=f"{kind} {side}: option {option}")
    cmd.add_argument(
        "--columns",
        type=_columnList,
        help="identity columns of the source (default: id,payload for sequence, key,value "
        "for kafka)",
    )
    cmd.add_argument(
        "--sink-columns",
        type=_columnList,
        help="the same columns' names in the sink, in the same order (default: --columns)",
    )
    cmd.add_argument(
        "--examples",
        type=int,
        default=EXAMPLES,
        help="examples shown per kind of violation (default %(default)s)",
    )
    cmd.add_argument("--json", action="store_true", help="machine-readable output")


def verifyCommand(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run ``twophase verify``: the report on ``out``, input problems on ``err``."""
    options: dict[str, dict[str, str]] = {
        "source": dict(args.source_option),
        "sink": dict(args.sink_option),
    }
    chosen = {"source": args.source, "sink": args.sink}
    for flag, (side, kind, option) in VERIFY_SHORTCUTS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        if chosen[side] != kind:
            err.write(f"twophase verify: --{flag} is an option of --{side} {kind}\n")
            return 2
        options[side][option] = value
    if args.source == "kafka" and args.sink == "kafka":
        if not any(k.lower() == "kafka.bootstrap.servers" for k in options["sink"]):
            for key, value in options["source"].items():
                if key.lower().startswith("kafka."):
                    options["sink"].setdefault(key, value)
    try:
        report = verify(
            args.source,
            options["source"],
            args.sink,
            options["sink"],
            columns=args.columns,
            sinkColumns=args.sink_columns,
            examples=args.examples,
        )
    except VerifyInputError as exc:
        err.write(f"twophase verify: {exc}\n")
        return 2
    out.write(json.dumps(report.toJson(), indent=2) + "\n" if args.json else report.describe())
    return 0 if report.ok else 1


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
            _addOptionArgument(cmd)
    _addDoctorParser(sub)
    _addVerifyParser(sub)
    return p


def _addOptionArgument(cmd: Any) -> None:
    cmd.add_argument(
        "--option",
        action="append",
        type=_keyValue,
        default=[],
        metavar="KEY=VALUE",
        help="a sink option that sink.json does not keep, such as a password (repeat)",
    )


DOCTOR_EPILOG = """\
Asks each sink's system what it holds (PostgreSQL prepared transactions and staged rows,
Kafka open transactions and stalled partitions, the files sink's staged files), read-only,
compares it with the decision log and prints, per finding, the command that settles it.
See docs/operations.md for every finding.

exit status: 0 clean, 1 findings that need action or that the next start acts on,
2 cannot check (no checkpoint or log, a server that does not answer).
"""


def _addDoctorParser(sub: Any) -> None:
    cmd = sub.add_parser(
        "doctor",
        help="hold the decision logs against what the systems hold",
        description="Compare each sink's decision log with what its system holds.",
        epilog=DOCTOR_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
    cmd.add_argument("--sink-id", help="only this sink (default: every sink of the query)")
    cmd.add_argument("--json", action="store_true", help="machine-readable output")
    _addOptionArgument(cmd)
    cmd.add_argument(
        "--in-flight-seconds",
        type=float,
        default=0.0,
        metavar="S",
        help="report undecided transactions younger than S seconds as a running query's "
        "batch, not as orphans (for probes of a running query; default 0)",
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["demo"]:
        from twophase import demo

        return demo.main(args[1:])
    parsed = parser().parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if parsed.command == "status":
        return status(parsed.checkpoint, parsed.sink_id, parsed.json, sys.stdout)
    if parsed.command == "verify":
        return verifyCommand(parsed, sys.stdout, sys.stderr)
    if parsed.command == "doctor":
        from twophase.doctor import doctor

        # Its output is the report: only warnings of twophase, nothing of the Kafka client.
        quieted = {name: logging.getLogger(name).level for name in ("", "kafka")}
        logging.getLogger().setLevel(logging.WARNING)
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
        try:
            return doctor(
                parsed.checkpoint,
                parsed.sink_id,
                parsed.json,
                sys.stdout,
                loadSink,
                dict(parsed.option),
                parsed.in_flight_seconds,
            )
        finally:
            for name, level in quieted.items():
                logging.getLogger(name).setLevel(level)
    return recover(
        parsed.checkpoint, parsed.sink_id, parsed.dry_run, sys.stdout, dict(parsed.option)
    )


if __name__ == "__main__":
    raise SystemExit(main())
