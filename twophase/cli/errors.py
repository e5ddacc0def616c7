"""What an operator reads when a ``twophase`` command fails: one paragraph and an exit status.

The framework's errors are written for logs: complete, one per handle, with the handle's full
description. At a terminal the operator needs what failed (the server as ``user@host:port/db``,
never a password), whether anything decided is at risk, and the fix. ``explain`` turns an
error into that paragraph; the same cause on several handles is said once, with the count and
the handles listed briefly ("4 transactions (batch 2 partitions 0-3)"). Every text passes
through ``redact``. ``sayFailure`` writes it, after the redacted traceback only under
``--debug`` or ``TWOPHASE_DEBUG=1`` (``debugging``).

Whether a system did not answer or refused the credentials, which system, and the fix, come
from the error's type, as ``twophase.sinks.systems`` reads it (a ``SinkSystemError``, a client
library's error through the registry, any ``ConnectionError`` or ``TimeoutError``).

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
    LogFormatError,
    LogOwnershipError,
    RewriteMismatchError,
    RewritePendingError,
)
from twophase.protocol import TransactionLostError
from twophase.redaction import redact
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.systems import SystemFailure, declaredError, systemFailure

EXIT_OK = 0
EXIT_LEFT_TO_DO = 1
EXIT_CANNOT = 2

WIDTH = 100
"""Column at which a paragraph is wrapped."""

OPERATIONS_DOC = "docs/operations.md"

_PG_NOISE = re.compile(r"connection failed: connection to server at \"[^\"]*\", port \d+ failed: ")
_PG_HINT = re.compile(r"\s*Is the server running on that host and accepting TCP/IP connections\?")
_PARTITION = re.compile(r"\bpartition (\d+)\b")


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
    if isinstance(exc, LogFormatError):
        return _newerFormat(exc)
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
    failure = systemFailure(exc)
    if failure is not None:
        reason = _named(failure, _shorten(_oneLine(exc)))
        return Explanation(EXIT_CANNOT, f"{reason}. Nothing was changed.", failure.fix)
    if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError):
        return Explanation(EXIT_CANNOT, f"{_oneLine(exc)}. Nothing was changed.")
    declared = declaredError(exc)
    return Explanation(
        EXIT_LEFT_TO_DO,
        f"failed: {type(exc).__name__}: {_oneLine(exc)} (run again with --debug for the traceback)",
        declared.fix if declared is not None else "",
    )


def _newerFormat(exc: LogFormatError) -> Explanation:
    """A record of a newer twophase: what it is, both versions, and that nothing was done."""
    by = f" (written by twophase {exc.writtenBy})" if exc.writtenBy else ""
    release = f"twophase {exc.writtenBy} or later" if exc.writtenBy else "the newer twophase"
    return Explanation(
        EXIT_CANNOT,
        f"{exc.where} is in format {exc.found}{by}, and this twophase {exc.reader} reads "
        f"formats up to {exc.newest}. Nothing was committed or aborted.",
        f"Fix: run this command with {release}; the query too needs it on its driver and "
        "executors.",
    )


def _commitFailed(exc: CommitFailedError) -> Explanation:
    """Group the handles by cause; say the decision is durable and how to finish it."""
    groups: dict[str, list[str]] = {}
    causes: dict[str, SystemFailure | None] = {}
    for description, _attempts, error in exc.failures:
        failure = systemFailure(error)
        reason = _named(failure, _reasonOf(error, description))
        groups.setdefault(reason, []).append(description)
        causes.setdefault(reason, failure)
    said = "; ".join(
        f"{_handles(exc.batchId, descriptions)}: {reason}"
        for reason, descriptions in groups.items()
    )
    fixes = []
    for failure in causes.values():
        if failure is not None and failure.fix not in fixes:
            fixes.append(failure.fix)
    if not fixes:
        fixes.append(f"Fix: see {OPERATIONS_DOC} (a query that will not start).")
    reachable = not all(failure is not None for failure in causes.values())
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


def _named(failure: SystemFailure | None, reason: str) -> str:
    """``reason`` led by the system's name when it does not say it already."""
    if failure is None or failure.system is None:
        return reason
    if failure.system.lower() in reason.lower():
        return reason
    return f"{failure.system}: {reason}"


def _cut(text: str, length: int) -> str:
    return text if len(text) <= length else text[: length - 3] + "..."
