"""The error a supervised query ends with: the failure's own message, and why no restart came."""

from __future__ import annotations

from twophase.failures.classify import Verdict


class QueryFailedError(Exception):
    """A supervised query ended with an error: one no restart can help, or one more than the
    restart strategy allows. The message is the failure's own (twophase's, with its code and
    fix, when twophase raised it), then why supervision stopped; ``__cause__`` is the error
    the query or its ``start`` raised.

    ``code`` is the failure's code (``TWOPHASE_...``, or the class that decided), ``recoverable``
    whether a restart could have helped, ``errorClass`` the class of the error, ``restarts``
    how many restarts came before, ``gaveUp`` whether the strategy ran out.
    """

    def __init__(self, verdict: Verdict, why: str, restarts: int, *, gaveUp: bool) -> None:
        self.verdict = verdict
        self.code = verdict.code
        self.recoverable = verdict.recoverable
        self.errorClass = verdict.errorClass
        self.restarts = restarts
        self.gaveUp = gaveUp
        shown = verdict.message or verdict.errorClass or verdict.code
        super().__init__(f"{shown} (twophase.supervise: {why})")


__all__ = ["QueryFailedError"]
