"""``twophase recover``: finish what each sink's log decided, abort what no decision covers.

What the next start of the query would do, without Spark: each sink is rebuilt from its
``sink.json`` and the options given again (``twophase.cli.checkpoint``), and its coordinator
commits the decided, unfinished batches, then aborts the sink's prepared transactions that no
decision covers. It claims each log first, as a new driver would, so a query still running on
the checkpoint stops at its next batch rather than race it. ``--dry-run`` only says what it
would do. Run it with the query stopped.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import uuid
from collections.abc import Mapping
from typing import Any, TextIO

from twophase.cli.checkpoint import addCheckpointArguments, loadSink, logLocations
from twophase.cli.errors import EXIT_LEFT_TO_DO, EXIT_OK, debugging, sayFailure
from twophase.cli.options import addSinkOptionArguments, givenSinkOptions
from twophase.coordinator import Coordinator, DecisionLog, Driver
from twophase.settings import UNFENCED_LOG_STORE_OPTION, boolOption, coordinatorSettings

RECOVER_EPILOG = """\
Rebuilds each sink from the sink.json beside its log (its safe options only) plus the options
given here, under the names the query used: --sink-option password=..., a --sink-option-file
only you can read (KEY=VALUE lines or JSON, chmod 600), or the libraries' own places
(PGPASSWORD, ~/.pgpass, TWOPHASE_KAFKA_OPTIONS). Nothing given here is written anywhere.
Run it with the query stopped. See docs/operations.md.

exit status: 0 done, 1 something left to do or failed to finish (the decisions stay in the
log), 2 bad input or a system that cannot be reached (nothing was done).
"""


RECOVER_DRIVER = Driver(
    f"recover-{uuid.uuid4().hex[:20]}", socket.gethostname(), os.getpid(), "twophase recover"
)
"""This command as a driver: it claims each log it recovers, so a query still running on the
checkpoint is fenced (it stops at its next batch) instead of racing it."""


def addRecoverParser(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``recover`` subcommand's parser."""
    cmd = sub.add_parser(
        "recover",
        help="finish decided batches, abort undecided transactions",
        parents=[common],
        epilog=RECOVER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    addCheckpointArguments(cmd)
    cmd.add_argument("--dry-run", action="store_true", help="only say what would be done")
    addSinkOptionArguments(cmd)


def recoverCommand(parsed: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run a parsed ``twophase recover``."""
    options = givenSinkOptions(parsed)
    return recover(
        parsed.checkpoint, parsed.sink_id, parsed.dry_run, out, options, err, debugging(parsed)
    )


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
            unfenced = boolOption(options, UNFENCED_LOG_STORE_OPTION, False)
            coordinator = Coordinator(
                committer, DecisionLog(url, unfenced=unfenced), name, settings
            )
            coordinator.holdLog(RECOVER_DRIVER, None)
            report = coordinator.recover()
        except Exception as exc:
            failed = sayFailure("recover", exc, errors, debug or debugging())
            result = max(result, failed)
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
