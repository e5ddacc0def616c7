"""What an operator reads when a ``twophase`` command fails: one paragraph and an exit status.

The framework's errors are written for logs: complete, one per handle, with the handle's full
description. At a terminal the operator needs what failed (the server as ``user@host:port/db``,
never a password), whether anything decided is at risk, and the fix. ``explain`` turns an
error into that paragraph; the same cause on several handles is said once, with the count and
the handles listed briefly ("4 transactions (batch 2 partitions 0-3)"). Every text passes
through ``redact``. ``sayFailure`` writes it, after the redacted traceback only under
``--debug`` or ``TWOPHASE_DEBUG=1`` (``debugging``).

Exit statuses of ``status``, ``recover`` and ``doctor`` (``verify`` has its own 0/1/2 with
the same meaning of 2): 0 done, nothing left; 1 something is left to do or failed to finish;
2 bad input or a system that cannot be reached (nothing was done).
"""

from __future__ import annotations

import argparse
import os
import re
import textwrap
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from twophase.coordinator.errors import (
    CommitFailedError,
    CoordinatorError,
    LogOwnershipError,
    RewriteMismatchError,
    RewritePendingError,
)
from twophase.protocol import TransactionLostError
from twophase.redaction import redact
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.registry import GENERIC_FIX, specOfError

EXIT_OK = 0
EXIT_LEFT_TO_DO = 1
EXIT_CANNOT = 2

WIDTH = 100
"""Column at which a paragraph is wrapped."""

OPERATIONS_DOC = "docs/operations.md"

_PG_NOISE = re.compile(r"connection failed: connection to server at \"[^\"]*\", port \d+ failed: ")
_PG_HINT = re.compile(r"\s*Is the server running on that host and accepting TCP/IP connections\?")
_PARTITION = re.compile(r"\bpartition (\d+)\b")
_AUTH = (
    "password authentication failed",
    "no password supplied",
    "authentication failed",
    "sasl authentication",
    "access denied",
    "not authorized",
)
_UNREACHABLE = (
    "connection refused",
    "is unreachable",
    "cannot reach",
    "timeout expired",
    "timed out",
    "could not translate host name",
    "name or service not known",
    "no route to host",
    "all brokers are down",
    "nobrokersavailable",
    "kafkaunreachable",
)


class CommandError(Exception):
    """A failure a command found itself (no checkpoint, no log, a bad option file), worded."""

    def __init__(self, message: str, status: int = EXIT_CANNOT) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Explanation:
    """One failure as the operator reads it, and the command's exit status for it.

    ``text`` may quote the error (it is redacted when shown); ``fix`` is this module's own
    advice, shown as written (redaction would turn ``password=...`` into ``password=***``).
    """

    status: int
    text: str
    fix: str = ""


def paragraph(command: str, text: str, fix: str = "") -> str:
    """``text`` (redacted) and ``fix`` as one wrapped paragraph prefixed by the command."""
    flat = " ".join(f"{redact(text)} {fix}".split())
    # Paths and commands stay whole, so they can be copied from the terminal.
    wrapped = textwrap.fill(
        f"twophase {command}: {flat}",
        width=WIDTH,
        break_on_hyphens=False,
        break_long_words=False,
    )
    return wrapped + "\n"


def debugging(parsed: argparse.Namespace | None = None) -> bool:
    """``--debug`` or ``TWOPHASE_DEBUG=1``: failures also print their traceback."""
    fromEnv = os.environ.get("TWOPHASE_DEBUG", "").strip().lower() not in ("", "0", "false", "no")
    return fromEnv or bool(getattr(parsed, "debug", False))


def sayFailure(command: str, exc: BaseException, err: TextIO, debug: bool) -> int:
    """Say ``exc`` in one paragraph on ``err`` (after its redacted traceback when ``debug``);
    return the command's exit status for it."""
    if debug:
        err.write(redact("".join(traceback.format_exception(exc))))
    explanation = explain(exc)
    err.write(paragraph(command, explanation.text, explanation.fix))
    return explanation.status


def explain(exc: BaseException) -> Explanation:
    """The paragraph and exit status for an error a command raised."""
    if isinstance(exc, CommandError):
        return Explanation(exc.status, str(exc))
    if isinstance(exc, CommitFailedError):
        return _commitFailed(exc)
    if isinstance(exc, RewritePendingError | RewriteMismatchError):
        return Explanation(
            EXIT_LEFT_TO_DO, f"{exc} ({OPERATIONS_DOC}: a query that will not start)"
        )
    if isinstance(exc, TransactionLostError):
        said = " ".join([_oneLine(exc), *getattr(exc, "__notes__", [])]).rstrip(". ")
        if "decision stays in the log" not in said:
            said += ". The decision stays in the log"
        return Explanation(
            EXIT_LEFT_TO_DO,
            f"{said}. A lost transaction cannot be committed again: see {OPERATIONS_DOC} (a "
            "query that will not start) before restarting the query.",
        )
    if isinstance(exc, LogOwnershipError | CoordinatorError):
        return Explanation(EXIT_LEFT_TO_DO, str(exc))
    if isinstance(exc, TwoPhaseConfigError):
        return Explanation(
            EXIT_CANNOT,
            "cannot rebuild the sink from sink.json and the options given: "
            f"{_oneLine(exc).rstrip('. ')}.",
            "Fix: give the option as the query did (--sink-option KEY=VALUE or "
            "--sink-option-file PATH).",
        )
    if _isConnection(exc):
        reason = _shorten(_oneLine(exc))
        return Explanation(EXIT_CANNOT, f"{reason}. Nothing was changed.", _fixFor(exc, reason))
    if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError):
        return Explanation(EXIT_CANNOT, f"{_oneLine(exc)}. Nothing was changed.")
    return Explanation(
        EXIT_LEFT_TO_DO,
        f"failed: {type(exc).__name__}: {_oneLine(exc)} (run again with --debug for the traceback)",
    )


def _commitFailed(exc: CommitFailedError) -> Explanation:
    """Group the handles by cause; say the decision is durable and how to finish it."""
    groups: dict[str, list[str]] = {}
    causes: dict[str, BaseException] = {}
    for description, _attempts, error in exc.failures:
        reason = _reasonOf(error, description)
        groups.setdefault(reason, []).append(description)
        causes.setdefault(reason, error)
    said = "; ".join(
        f"{_handles(exc.batchId, descriptions)}: {reason}"
        for reason, descriptions in groups.items()
    )
    fixes = []
    for reason, error in causes.items():
        fix = _fixFor(error, reason) if _isConnection(error, reason) else ""
        if fix and fix not in fixes:
            fixes.append(fix)
    if not fixes:
        fixes.append(f"Fix: see {OPERATIONS_DOC} (a query that will not start).")
    reachable = not all(_isConnection(e, r) for r, e in causes.items())
    return Explanation(
        EXIT_LEFT_TO_DO if reachable else EXIT_CANNOT,
        f"sink {exc.sinkId}: could not commit {said}. Nothing decided is lost: the decision "
        f"for batch {exc.batchId} is durable in the log, and committing again is safe.",
        f"{' '.join(fixes)} Then run twophase recover again, or restart the query.",
    )


def _handles(batchId: int, descriptions: Sequence[str]) -> str:
    """``4 transactions (batch 2 partitions 0-3)``, or the first descriptions, shortened."""
    count = len(descriptions)
    noun = "transaction" if count == 1 else "transactions"
    partitions = [m.group(1) for d in descriptions if (m := _PARTITION.search(d))]
    if len(partitions) == count:
        numbers = sorted({int(p) for p in partitions})
        word = "partition" if len(numbers) == 1 else "partitions"
        return f"{count} {noun} (batch {batchId} {word} {_ranges(numbers)})"
    shown = ", ".join(_cut(d, 60) for d in descriptions[:3])
    more = f" and {count - 3} more" if count > 3 else ""
    return f"{count} {noun} of batch {batchId} ({shown}{more})"


def _ranges(numbers: Sequence[int]) -> str:
    """``0-3, 7, 9-10`` for [0, 1, 2, 3, 7, 9, 10]."""
    parts: list[str] = []
    start = previous = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == previous + 1:
            previous = n
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if n is not None:
            start = previous = n
    return ", ".join(parts)


def _reasonOf(error: BaseException, description: str) -> str:
    """What went wrong with one handle, without the handle's own description."""
    text = _oneLine(error)
    cleanDescription = " ".join(redact(description).split())
    if cleanDescription and cleanDescription in text:
        text = text.rsplit(cleanDescription, 1)[-1].lstrip(": ")
    return _shorten(text)


def _shorten(text: str) -> str:
    """libpq's repetition of the address and its generic hint removed."""
    text = _PG_HINT.sub("", _PG_NOISE.sub("", text))
    return text.rstrip(". ")


def _oneLine(exc: BaseException) -> str:
    return " ".join(redact(str(exc)).split()) or type(exc).__name__


def _isConnection(exc: BaseException, text: str | None = None) -> bool:
    """A server that did not answer or refused the credentials: nothing was done."""
    lowered = (text if text is not None else _oneLine(exc)).lower()
    names = " ".join(t.__name__.lower() for t in type(exc).__mro__)
    if "cannot connect to" in lowered or any(m in lowered for m in _UNREACHABLE + _AUTH):
        return True
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    return "operationalerror" in names or "nobrokersavailable" in names


def _fixFor(exc: BaseException, reason: str) -> str:
    """The way to fix a connection failure of the system that raised ``exc`` (found by the
    error's type and origin in ``twophase.sinks.registry``): refused credentials or a server
    that does not answer."""
    spec = specOfError(exc)
    if spec is None:
        return GENERIC_FIX
    lowered = reason.lower()
    return spec.authFix if any(m in lowered for m in _AUTH) else spec.unreachableFix


def _cut(text: str, length: int) -> str:
    return text if len(text) <= length else text[: length - 3] + "..."
