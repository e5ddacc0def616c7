"""The sink options an operator gives ``twophase recover`` and ``doctor`` again, secrets included.

``sink.json`` keeps only a sink's safe options, so what it lacks (a password, an endpoint on
this machine) comes again from the operator, under the names the query used:
``--sink-option KEY=VALUE`` (``--option`` is the older spelling) and ``--sink-option-file
PATH``, a file of ``KEY=VALUE`` lines or one JSON object. Like ssh with a private key, a file
that its group or others may read is refused: a secret kept there is already exposed. The
libraries' own places (``PGPASSWORD``, ``~/.pgpass``, ``TWOPHASE_KAFKA_OPTIONS``) keep working
because the sinks read them themselves. Nothing here is ever written anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
from collections.abc import Iterable, Mapping
from typing import Any

from twophase.cli.errors import CommandError

OPEN_MODE_BITS = 0o077
"""Permission bits (group and others) that make ``--sink-option-file`` refuse a file."""


class SinkOptionError(ValueError):
    """An option given on the command line or in an option file cannot be used."""


def keyValue(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` as a pair; an argparse ``type`` (its error never repeats the value)."""
    key, sep, value = text.partition("=")
    if not sep:  # the argument may be a secret typed without its key: never repeat it
        raise argparse.ArgumentTypeError("expected KEY=VALUE, got no '='")
    if not key.strip():
        raise argparse.ArgumentTypeError("expected KEY=VALUE, got no KEY before '='")
    return key.strip(), value


def addSinkOptionArguments(cmd: Any) -> None:
    """``--sink-option`` (alias ``--option``) and ``--sink-option-file`` on a subcommand."""
    cmd.add_argument(
        "--sink-option",
        "--option",
        dest="sink_option",
        action="append",
        type=keyValue,
        default=[],
        metavar="KEY=VALUE",
        help="a sink option that sink.json does not keep, such as a password, under the "
        "name the query used (repeat; wins over --sink-option-file)",
    )
    cmd.add_argument(
        "--sink-option-file",
        action="append",
        default=[],
        metavar="PATH",
        help="KEY=VALUE lines or a JSON object of sink options; must be readable by its "
        "owner only (chmod 600)",
    )


def readOptionFile(path: str) -> dict[str, str]:
    """The options in ``path``; refuses a file its group or others may read.

    Errors name the file and the line, never a value.
    """
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError as exc:
        raise SinkOptionError(
            f"cannot read the sink option file {path}: {exc.strerror or exc}"
        ) from None
    if os.name == "posix" and mode & OPEN_MODE_BITS:
        raise SinkOptionError(
            f"the sink option file {path} may be read by its group or others (mode "
            f"{mode:04o}); it holds secrets, so it is refused. Fix: chmod 600 {path}"
        )
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise SinkOptionError(f"cannot read the sink option file {path}: {exc}") from None
    if text.lstrip().startswith("{"):
        return _jsonOptions(path, text)
    return _lineOptions(path, text.splitlines())


def _jsonOptions(path: str, text: str) -> dict[str, str]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SinkOptionError(
            f"the sink option file {path} is not valid JSON (line {exc.lineno}); give one "
            'object such as {"password": "..."} or KEY=VALUE lines'
        ) from None
    options: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, bool):
            options[str(key)] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            options[str(key)] = str(value)
        else:
            raise SinkOptionError(
                f"the sink option file {path}: option {key} must be a string or a number"
            )
    return options


def _lineOptions(path: str, lines: Iterable[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise SinkOptionError(f"the sink option file {path}, line {number}: expected KEY=VALUE")
        options[key.strip()] = value.strip()
    return options


def sinkOptions(fromLine: Iterable[tuple[str, str]], files: Iterable[str]) -> dict[str, str]:
    """The options of the option files in order, then the command line's, which win."""
    options: dict[str, str] = {}
    for path in files:
        options.update(readOptionFile(path))
    options.update(dict(fromLine))
    return options


def givenSinkOptions(parsed: argparse.Namespace) -> dict[str, str]:
    """A parsed command's ``--sink-option-file`` and ``--sink-option``, merged by
    ``sinkOptions``; a ``CommandError`` (exit status 2) when one of them cannot be used."""
    try:
        return sinkOptions(parsed.sink_option, parsed.sink_option_file)
    except SinkOptionError as exc:
        raise CommandError(str(exc)) from None


def optionNames(options: Mapping[str, str]) -> tuple[str, ...]:
    """The names given, sorted, for messages (never the values)."""
    return tuple(sorted(options))
