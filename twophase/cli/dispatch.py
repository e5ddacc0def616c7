"""The ``twophase`` command: ``demo``, ``status``, ``recover``, ``doctor`` and ``verify``.

``status`` reads a query's decision logs and needs no Spark. ``recover`` rebuilds each sink
from the ``sink.json`` kept beside its log and finishes what the log decided, then aborts the
sink's prepared transactions that no decision covers; ``--dry-run`` only says what it would do.
``doctor`` holds each log against what the sink's system holds (``twophase.doctor``).
``verify`` compares what a source offered with what a sink holds (``twophase.cli.verify``).

A failure is one paragraph on stderr (``twophase.cli.errors``), with its traceback only under
``--debug`` or ``TWOPHASE_DEBUG=1``; exit statuses: 0 done, 1 something left to do, 2 bad input
or a system that cannot be reached. Sink options given again: ``twophase.cli.options``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TextIO

import fsspec.core

from twophase.cli.errors import (
    EXIT_LEFT_TO_DO,
    EXIT_OK,
    CommandError,
    explain,
    paragraph,
)
from twophase.cli.options import (
    SinkOptionError,
    addSinkOptionArguments,
    sinkOptions,
)
from twophase.cli.verify import addVerifyParser, verifyCommand
from twophase.coordinator import Coordinator, DecisionLog
from twophase.coordinator.description import SINK_DESCRIPTION, readSinkDescription
from twophase.coordinator.paths import LOG_DIRECTORY, sinkLogLocations
from twophase.loading import importQualified
from twophase.protocol import Committer
from twophase.redaction import getLogger, redact, rememberSecrets
from twophase.settings import coordinatorSettings

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


def logLocations(checkpoint: str, sinkId: str | None) -> list[tuple[str, str]]:
    """(sinkId, log URL) of the sinks to act on; a ``CommandError`` saying why there are none."""
    try:
        fs, root = fsspec.core.url_to_fs(checkpoint)
        exists = bool(fs.exists(root))
    except (OSError, ValueError, ImportError) as exc:
        raise CommandError(
            f"cannot open the checkpoint {checkpoint}: {type(exc).__name__}: {exc}. Fix: give "
            "the query's checkpointLocation, with the storage's credentials in the environment"
        ) from None
    if not exists:
        raise CommandError(
            f"no checkpoint at {checkpoint}. Fix: give the query's checkpointLocation (the "
            "option its writeStream got)"
        )
    found = list(sinkLogLocations(checkpoint, sinkId))
    if found:
        return found
    base = f"{checkpoint.rstrip('/')}/{LOG_DIRECTORY}"
    others = [name for name, _ in sinkLogLocations(checkpoint)]
    if sinkId is not None and others:
        raise CommandError(
            f"no decision log of sink {sinkId} under {base}: this checkpoint's query has the "
            f"sinks {', '.join(others)}. Fix: --sink-id one of them, or the checkpoint of the "
            f"query whose sink is {sinkId}"
        )
    raise CommandError(
        f"no twophase decision log under {base}: {checkpoint} is not the checkpoint of a "
        "query with a twophase sink, or its sink never decided a batch. Fix: give the "
        "checkpointLocation of the query that wrote with the twophase sink"
    )


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


def loadSink(url: str, extraOptions: Mapping[str, str]) -> tuple[Committer, dict[str, str]]:
    """Rebuild the committer of the sink described by ``sink.json`` in a log directory.

    ``sink.json`` holds only the sink's safe options; ``extraOptions`` (``--sink-option``,
    ``--sink-option-file``) add what it lacks, such as a password, and win over the stored
    ones. Reads ``sink.json``, never writes it: the query alone writes it.
    """
    description = readSinkDescription(url)
    if description is None:
        raise CommandError(
            f"{url} has no {SINK_DESCRIPTION}: the sink never planned a batch with this "
            "version of twophase, so recover cannot know which sink finishes its transactions. "
            "Fix: restart the query (its start finishes what the log decided)"
        )
    className = MOVED_CLASSES.get(description.className, description.className)
    try:
        target: Any = importQualified(className)
    except (ImportError, AttributeError) as exc:
        raise CommandError(
            f"{url}/{SINK_DESCRIPTION} names the sink class {className}, which cannot be "
            f"imported here ({type(exc).__name__}: {exc}). Fix: install the package that "
            "provides it in this environment"
        ) from None
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
    err: TextIO | None = None,
    debug: bool = False,
) -> int:
    """Finish each sink's decided batches; 0 done, 1 left to do, 2 cannot (see cli.errors).

    A sink that fails is said in one paragraph on ``err`` and the others are still recovered.
    Raises ``CommandError`` when there is no checkpoint or no log.
    """
    errors = sys.stderr if err is None else err
    result = EXIT_OK
    for name, url in logLocations(checkpoint, sinkId):
        decisionLog = DecisionLog(url)
        if dryRun:
            outstanding = decisionLog.outstanding()
            out.write(f"sink {name}: would commit {len(outstanding)} decided batches\n")
            for batch in outstanding:
                out.write(f"  batch {batch.batchId}: {len(batch.handles)} handles\n")
            out.write(
                f"sink {name}: would then abort its prepared transactions no decision covers\n"
            )
            continue
        try:
            committer, options = loadSink(url, extraOptions or {})
            settings = coordinatorSettings(options)
            report = Coordinator(committer, decisionLog, name, settings).recover()
        except Exception as exc:
            if debug or debugging():
                errors.write(redact("".join(traceback.format_exception(exc))))
            explanation = explain(exc)
            errors.write(paragraph("recover", explanation.text, explanation.fix))
            result = max(result, explanation.status)
            continue
        out.write(
            f"sink {name}: committed {report.handlesCommitted} transactions of "
            f"{len(report.batchesFinished)} decided batches {list(report.batchesFinished)}, "
            f"aborted {report.transactionsAborted} lingering transactions "
            f"in {report.seconds * 1000:.0f} ms\n"
        )
        for batchId, partitions in report.awaitingRewrite.items():
            result = max(result, EXIT_LEFT_TO_DO)
            out.write(
                f"sink {name}: batch {batchId} is decided, but the system aborted the "
                f"transactions of partitions {list(partitions)}: restart the query, whose "
                "replay of the batch writes them again once (recover cannot: only the replay "
                "has the records)\n"
            )
    return result


RECOVER_EPILOG = """\
Rebuilds each sink from the sink.json beside its log (its safe options only) plus the options
given here, under the names the query used: --sink-option password=..., a --sink-option-file
only you can read (KEY=VALUE lines or JSON, chmod 600), or the libraries' own places
(PGPASSWORD, ~/.pgpass, TWOPHASE_KAFKA_OPTIONS). Nothing given here is written anywhere.
Run it with the query stopped. See docs/operations.md.

exit status: 0 done, 1 something left to do or failed to finish (the decisions stay in the
log), 2 bad input or a system that cannot be reached (nothing was done).
"""

STATUS_EPILOG = """\
exit status: 0 nothing decided is unfinished, 1 decided batches wait for their commit
(twophase recover or a restart finishes them), 2 no checkpoint or no decision log.
"""

DEBUG_HELP = "on failure, also print the traceback (or set TWOPHASE_DEBUG=1)"


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's parser must not reset a --debug given before the subcommand.
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    p = argparse.ArgumentParser(
        prog="twophase", description="Exactly-once sinks for Spark", parents=[common]
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="crash a streaming pipeline and prove exactly-once", add_help=False)
    for name, helpText, epilog in (
        ("status", "show the decision logs of a query", STATUS_EPILOG),
        ("recover", "finish decided batches, abort undecided transactions", RECOVER_EPILOG),
    ):
        cmd = sub.add_parser(
            name,
            help=helpText,
            parents=[common],
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        cmd.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
        cmd.add_argument("--sink-id", help="only this sink (default: every sink of the query)")
        if name == "status":
            cmd.add_argument("--json", action="store_true", help="machine-readable output")
        else:
            cmd.add_argument("--dry-run", action="store_true", help="only say what would be done")
            addSinkOptionArguments(cmd)
    _addDoctorParser(sub, common)
    addVerifyParser(sub, common)
    return p


DOCTOR_EPILOG = """\
Asks each sink's system what it holds (PostgreSQL prepared transactions and staged rows,
Kafka open transactions and stalled partitions, the files sink's staged files), read-only,
compares it with the decision log and prints, per finding, the command that settles it.
See docs/operations.md for every finding.

Secrets as for twophase recover: --sink-option KEY=VALUE, --sink-option-file PATH (chmod
600), PGPASSWORD, ~/.pgpass, TWOPHASE_KAFKA_OPTIONS.

exit status: 0 clean, 1 findings that need action or that the next start acts on,
2 cannot check (no checkpoint or log, a server that does not answer, bad options).
"""


def _addDoctorParser(sub: Any, common: argparse.ArgumentParser) -> None:
    cmd = sub.add_parser(
        "doctor",
        parents=[common],
        help="hold the decision logs against what the systems hold",
        description="Compare each sink's decision log with what its system holds.",
        epilog=DOCTOR_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
    cmd.add_argument("--sink-id", help="only this sink (default: every sink of the query)")
    cmd.add_argument("--json", action="store_true", help="machine-readable output")
    addSinkOptionArguments(cmd)
    cmd.add_argument(
        "--in-flight-seconds",
        type=float,
        default=0.0,
        metavar="S",
        help="report undecided transactions younger than S seconds as a running query's "
        "batch, not as orphans (for probes of a running query; default 0)",
    )


def debugging(parsed: argparse.Namespace | None = None) -> bool:
    """``--debug`` or ``TWOPHASE_DEBUG=1``: failures also print their traceback."""
    fromEnv = os.environ.get("TWOPHASE_DEBUG", "").strip().lower() not in ("", "0", "false", "no")
    return fromEnv or bool(getattr(parsed, "debug", False))


BRIEF_LOG_CHARS = 200
"""Without ``--debug``, a log line is cut here: the command's own paragraph says the rest."""


class _Briefly(logging.Filter):
    """Without ``--debug``: warnings once per message template, on one short line, no
    traceback, and nothing the command says itself (the coordinator's errors become the
    command's one paragraph)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, object]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.name.startswith("twophase."):
            return False
        key = (record.name, record.msg)
        if key in self.seen:
            return False
        self.seen.add(key)
        message = " ".join(record.getMessage().split())
        if len(message) > BRIEF_LOG_CHARS:
            message = message[: BRIEF_LOG_CHARS - 3] + "..."
        record.msg, record.args = message, None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


@contextmanager
def _commandLogging(err: TextIO, debug: bool, command: str) -> Iterator[None]:
    """Log records on ``err`` for the command's duration: everything with ``--debug``, else
    warnings only, briefly; the Kafka clients' own chatter only with ``--debug``."""
    root = logging.getLogger()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    if not debug:
        handler.addFilter(_Briefly())
    quiet = logging.INFO if debug and command != "doctor" else logging.WARNING
    saved = {name: logging.getLogger(name).level for name in ("", "kafka", "confluent_kafka")}
    root.addHandler(handler)
    root.setLevel(quiet)
    if not debug:
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
        logging.getLogger("confluent_kafka").setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def run(parsed: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run a parsed command (not ``demo``) and return its exit status; errors propagate."""
    if parsed.command == "status":
        return status(parsed.checkpoint, parsed.sink_id, parsed.json, out)
    if parsed.command == "verify":
        return verifyCommand(parsed, out, err)
    try:
        options = sinkOptions(parsed.sink_option, parsed.sink_option_file)
    except SinkOptionError as exc:
        raise CommandError(str(exc)) from None
    if parsed.command == "doctor":
        from twophase.doctor import doctor

        lineKeys = {key for key, _ in parsed.sink_option}
        return doctor(
            parsed.checkpoint,
            parsed.sink_id,
            parsed.json,
            out,
            loadSink,
            options,
            parsed.in_flight_seconds,
            tuple(parsed.sink_option_file),
            frozenset(options) - lineKeys,
        )
    return recover(
        parsed.checkpoint, parsed.sink_id, parsed.dry_run, out, options, err, debugging(parsed)
    )


def main(argv: list[str] | None = None) -> int:
    """The ``twophase`` command: one paragraph on stderr per failure, a traceback only with
    ``--debug``; exit statuses as each subcommand's help says."""
    args = sys.argv[1:] if argv is None else list(argv)
    out, err = sys.stdout, sys.stderr
    if args[:1] == ["demo"]:
        from twophase.cli import demo

        debug = "--debug" in args or debugging()
        rest = [a for a in args[1:] if a != "--debug"]
        with _commandLogging(err, True, "demo"):
            try:
                return demo.main(rest)
            except Exception as exc:
                return _fail("demo", exc, err, debug)
    parsed = parser().parse_args(args)
    debug = debugging(parsed)
    with _commandLogging(err, debug, parsed.command):
        try:
            return run(parsed, out, err)
        except Exception as exc:
            return _fail(parsed.command, exc, err, debug)


def _fail(command: str, exc: BaseException, err: TextIO, debug: bool) -> int:
    """Say ``exc`` in one paragraph (after its redacted traceback with ``--debug``)."""
    if debug:
        err.write(redact("".join(traceback.format_exception(exc))))
    explanation = explain(exc)
    err.write(paragraph(command, explanation.text, explanation.fix))
    return explanation.status


if __name__ == "__main__":
    raise SystemExit(main())
