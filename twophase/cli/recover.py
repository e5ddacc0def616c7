"""``twophase recover``: finish what each sink's log decided, abort what no decision covers.

What the next start of the query would do, without Spark: each sink is rebuilt from its
``sink.json`` and the options given again (``twophase.cli.checkpoint``), and its coordinator
commits the decided, unfinished batches, then aborts the sink's prepared transactions that no
decision covers. It claims each log first, as a new driver would, so a query still running on
the checkpoint stops at its next batch rather than race it. ``--dry-run`` only says what it
would do. Run it with the query stopped. A decided batch whose system aborted some of its
partitions' transactions by itself is left decided (only the query's restart rewrites them):
recover, and its dry run, say so in the words of ``twophase status`` and ``doctor``
(``twophase.doctor.nextstart``) and exit 1.
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
from twophase.doctor.nextstart import Unfinished
from twophase.settings import UNFENCED_LOG_STORE_OPTION, boolOption, coordinatorSettings

RECOVER_EPILOG = """\
Rebuilds each sink from the sink.json beside its log (its safe options only) plus the options
given here, under the names the query used: --sink-option password=..., a --sink-option-file
only you can read (KEY=VALUE lines or JSON, chmod 600), or the libraries' own places
(PGPASSWORD, ~/.pgpass, TWOPHASE_KAFKA_OPTIONS). Nothing given here is written anywhere.
Run it with the query stopped. See docs/operations.md.

exit status: 0 done, 1 something left to do or failed to finish (the decisions stay in the
log; a batch awaiting a rewrite, which only a restart of the query can do, --dry-run too),
2 bad input or a system that cannot be reached (nothing was done).
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
            result = max(result, sayPlan(name, decisionLog, out))
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
        for batchId in sorted(report.awaitingRewrite):
            state = decisionLog.state(batchId)
            if state is None or not state.awaitingRewrite:
                continue  # rewritten meanwhile by a running query's replay
            result = max(result, EXIT_LEFT_TO_DO)
            sayLeft(name, Unfinished.of(state), out)
    return result


def sayPlan(name: str, decisionLog: DecisionLog, out: TextIO) -> int:
    """``--dry-run``: what recover would do for one sink, in the words status and doctor use;
    1 when something would be left that only the query's restart can do, else 0."""
    pending = [Unfinished.of(state) for state in decisionLog.outstanding()]
    finished = [p.batchId for p in pending if not p.onlyRestart]
    transactions = sum(p.transactions for p in pending)
    for batch in pending:
        out.write(f"sink {name}: {batch.describe()}\n")
    out.write(
        f"sink {name}: would commit {transactions} transactions of {len(finished)} decided "
        f"batches {finished}, then abort its prepared transactions no decision covers\n"
    )
    left = [batch for batch in pending if batch.onlyRestart]
    for batch in left:
        out.write(f"sink {name}: left for the next start of the query: {batch.fix('')}\n")
    return EXIT_LEFT_TO_DO if left else EXIT_OK


def sayLeft(name: str, batch: Unfinished, out: TextIO) -> None:
    """A batch recover left decided, that only the query's restart can finish."""
    out.write(f"sink {name}: {batch.describe()}\n")
    out.write(f"sink {name}: left for the next start of the query: {batch.fix('')}\n")
