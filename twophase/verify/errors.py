"""Why a verification cannot start: ``VerifyInputError``, and turning library errors into it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from twophase.redaction import redact


class VerifyInputError(ValueError):
    """Verification cannot start: a missing path, table or topic, an unreachable server, a bad
    option. The message names the problem and the fix; ``twophase verify`` exits with 2."""


@contextmanager
def inputErrors(what: str, *errors: type[Exception], fix: str = "") -> Iterator[None]:
    """Re-raise ``errors`` from the block as :class:`VerifyInputError`: ``<what>: <error><fix>``.

    The libraries' own messages already name the option or server at fault; this adds which
    side of the comparison it is, and drops the traceback the command must not show.
    """
    try:
        yield
    except VerifyInputError:
        raise
    except errors as exc:
        text = redact(str(exc))
        raise VerifyInputError(f"{what}: {text}{fix}" if what else f"{text}{fix}") from None


__all__ = ["VerifyInputError", "inputErrors"]
