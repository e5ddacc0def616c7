"""``twophase verify``: its arguments, and the command that compares a source with a sink.

Exit status: 0 when every record is there exactly once, 1 on any violation, 2 on bad input
(``VerifyInputError``); other failures are said by ``twophase.cli.errors`` like every command's.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from twophase.cli.options import keyValue
from twophase.verify import EXAMPLES, MULTI_HELP, SINKS, SOURCES, VerifyInputError, verify

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

VERIFY_EPILOG = (
    """\
Options are the ones the pipeline's readStream/writeStream got (Spark's names), as KEY=VALUE:
--source-option for the source, --sink-option for the sink. Shortcuts: --start/--end (sequence
ids [start, end)), --path/--format (files), --url/--table (postgres), --topic (kafka sink).
Kafka is read read_committed from startingOffsets (default earliest) to endingOffsets (default
latest; both also take Spark's JSON). A Kafka sink uses the source's kafka.* options when it is
given no kafka.bootstrap.servers of its own. A sequence source checked against a Kafka sink is
compared as key = CAST(id AS STRING), value = payload.

"""
    + MULTI_HELP
    + """
exit status: 0 exactly once, 1 missing/duplicated/unexpected records, 2 bad input or a
system that cannot be reached.

examples:
  twophase verify --source sequence --start 0 --end 1000000 --sink files --path out/
  twophase verify --source sequence --end 100000 --sink postgres \\
      --url postgresql://user@localhost:5432/db --table public.events
  twophase verify --source kafka --source-option kafka.bootstrap.servers=localhost:9092 \\
      --source-option subscribe=in --sink kafka --topic out
  twophase verify --source sequence --end 100000 --sink multi \\
      --sink-option targets=orders=postgres,events=kafka \\
      --sink-option orders.url=postgresql://user@localhost:5432/db \\
      --sink-option orders.table=orders --sink-option orders.sinkColumns=order_id,status \\
      --sink-option events.kafka.bootstrap.servers=localhost:9092 \\
      --sink-option events.topic=order-events
"""
)


def _columnList(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated column names, got {text!r}")
    return names


def addVerifyParser(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``verify`` subcommand's parser, with the shortcuts of ``VERIFY_SHORTCUTS``."""
    cmd = sub.add_parser(
        "verify",
        parents=[common],
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
        type=keyValue,
        default=[],
        metavar="KEY=VALUE",
        help="an option of the source (repeat)",
    )
    cmd.add_argument(
        "--sink-option",
        action="append",
        type=keyValue,
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
