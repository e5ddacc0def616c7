"""The ``twophase`` command's entry: the parser of every subcommand, and ``main``, which runs one.

Each command lives in a module of its own (``status``, ``recover``, ``doctor``, ``verify``,
``demo``) with its arguments; this module only puts their parsers together and dispatches. A
failure is one paragraph on stderr (``twophase.cli.errors``), with its traceback only under
``--debug`` or ``TWOPHASE_DEBUG=1``; exit statuses: 0 done, 1 something left to do, 2 bad input
or a system that cannot be reached.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TextIO

from twophase.cli.console import commandLogging
from twophase.cli.doctor import addDoctorParser, doctorCommand
from twophase.cli.errors import debugging, sayFailure
from twophase.cli.recover import addRecoverParser, recoverCommand
from twophase.cli.status import addStatusParser, statusCommand
from twophase.cli.verify import addVerifyParser, verifyCommand

COMMANDS: dict[str, Callable[[argparse.Namespace, TextIO, TextIO], int]] = {
    "status": statusCommand,
    "recover": recoverCommand,
    "doctor": doctorCommand,
    "verify": verifyCommand,
}
"""What runs each parsed subcommand (``demo`` parses its own arguments: see ``main``)."""

DEBUG_HELP = "on failure, also print the traceback (or set TWOPHASE_DEBUG=1)"


def parser() -> argparse.ArgumentParser:
    """Every subcommand's parser under ``twophase``; ``--debug`` before or after the command."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's parser must not reset a --debug given before the subcommand.
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    p = argparse.ArgumentParser(
        prog="twophase", description="Exactly-once sinks for Spark", parents=[common]
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="crash a streaming pipeline and prove exactly-once", add_help=False)
    addStatusParser(sub, common)
    addRecoverParser(sub, common)
    addDoctorParser(sub, common)
    addVerifyParser(sub, common)
    return p


def run(parsed: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run a parsed command (not ``demo``) and return its exit status; errors propagate."""
    return COMMANDS[parsed.command](parsed, out, err)


def main(argv: list[str] | None = None) -> int:
    """The ``twophase`` command: one paragraph on stderr per failure, a traceback only with
    ``--debug``; exit statuses as each subcommand's help says."""
    args = sys.argv[1:] if argv is None else list(argv)
    out, err = sys.stdout, sys.stderr
    if args[:1] == ["demo"]:
        # Imported here: the demo's child process runs it as ``python -m twophase.cli.demo``,
        # which must not find it imported already by this package.
        from twophase.cli.demo import main as demoMain

        debug = "--debug" in args or debugging()
        rest = [a for a in args[1:] if a != "--debug"]
        with commandLogging(err, True, "demo"):
            try:
                return demoMain(rest)
            except Exception as exc:
                return sayFailure("demo", exc, err, debug)
    parsed = parser().parse_args(args)
    debug = debugging(parsed)
    with commandLogging(err, debug, parsed.command):
        try:
            return run(parsed, out, err)
        except Exception as exc:
            return sayFailure(parsed.command, exc, err, debug)
