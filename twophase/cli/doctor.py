"""``twophase doctor``: the command's arguments, handed to ``twophase.doctor``, which does the work.

The comparison of each decision log with what its system holds lives in ``twophase.doctor``;
this module gives it the options the operator gave again and the way ``recover`` rebuilds a
sink (``twophase.cli.checkpoint.loadSink``), so that package never imports the command line.
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from twophase.cli.checkpoint import addCheckpointArguments, loadSink
from twophase.cli.options import addSinkOptionArguments, givenSinkOptions
from twophase.doctor import doctor

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


def addDoctorParser(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``doctor`` subcommand's parser."""
    cmd = sub.add_parser(
        "doctor",
        parents=[common],
        help="hold the decision logs against what the systems hold",
        description="Compare each sink's decision log with what its system holds.",
        epilog=DOCTOR_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    addCheckpointArguments(cmd)
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


def doctorCommand(parsed: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run a parsed ``twophase doctor``; its fixes name the option files, not their secrets."""
    options = givenSinkOptions(parsed)
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
