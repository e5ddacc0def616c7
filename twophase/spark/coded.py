"""Where an error leaves twophase for Spark: its code put in front of its message, once.

Spark carries an error of a Python worker (a task, a data source's planning or commit) or of
a ``foreachBatch`` function to the driver as text, so the class is lost on the way. Every
entry point of the binding runs inside ``codedErrors``: an error that escapes gets its code
(``twophase.sinks.systems.errorCodeOf``) in front of its message, ``[TWOPHASE_UNREACHABLE]
...``, the way Spark's own error classes read, and a system that did not answer or refused
the credentials gets the fix an operator of the query needs, when the message has none; the
error keeps its type and everything else.
An error whose message is not text (a client library's error object) gets the code as a note,
which Python prints under the message. ``twophase.supervise`` reads the codes back.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from twophase.failures.codes import marked
from twophase.redaction import getLogger
from twophase.sinks.systems import errorCodeOf, queryFix

log = getLogger(__name__)


@contextmanager
def codedErrors() -> Iterator[None]:
    """Mark any error that escapes the block with its code, then let it go on."""
    try:
        yield
    except Exception as exc:
        markError(exc)
        raise


def markError(exc: BaseException) -> str | None:
    """Put ``exc``'s code in front of its message (or in a note); returns the code, if any."""
    try:
        code = errorCodeOf(exc)
    except Exception:  # reading the code must never hide the error itself
        log.debug("could not read the code of %r", exc, exc_info=True)
        return None
    if code is None:
        return None
    mark = f"[{code}]"
    if exc.args and isinstance(exc.args[0], str):
        if not exc.args[0].startswith(mark):
            message = exc.args[0]
            fix = "" if "Fix:" in message else queryFix(exc)
            exc.args = (marked(code, f"{message.rstrip()} {fix}".rstrip()), *exc.args[1:])
    elif not any(mark in note for note in getattr(exc, "__notes__", ())):
        fix = queryFix(exc)
        exc.add_note(marked(code, f"{type(exc).__name__}: {exc} {fix}".rstrip()))
    return code


__all__ = ["codedErrors", "markError"]
