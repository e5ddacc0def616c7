"""Which system an error says failed, how, and the fix; and the code it carries into Spark.

Read from the error's type, never its text: a ``SinkSystemError`` says all three, itself or as
an error the one raised came from; a client library's own error is read by the error class
of the sink the registry finds for it (``specOfError``, ``SinkSystemError.classify``); any
``ConnectionError`` or ``TimeoutError`` is a system that did not answer. The command line
words its failures from this (``twophase.cli.errors``), and the Spark binding marks an error
with its code (``errorCodeOf``) where it leaves twophase for Spark.
"""

from __future__ import annotations

from dataclasses import dataclass

from twophase.coordinator.errors import CommitFailedError
from twophase.failures.codes import CODES, declaredCode
from twophase.protocol import SinkFailure, SinkSystemError
from twophase.sinks.registry import GENERIC_FIX, specOfError

CONNECTION = (SinkFailure.UNREACHABLE, SinkFailure.CREDENTIALS)
"""Failures where the system did nothing."""

_CODES = {
    SinkFailure.UNREACHABLE: "TWOPHASE_UNREACHABLE",
    SinkFailure.CREDENTIALS: "TWOPHASE_CREDENTIALS",
}


@dataclass(frozen=True)
class SystemFailure:
    """A system that did not answer or refused the credentials: which, how, and the fix.
    ``system`` is ``None`` when no sink claims the error (a plain ``ConnectionError``)."""

    system: str | None
    reason: SinkFailure
    fix: str


def systemFailure(exc: BaseException) -> SystemFailure | None:
    """The system that did not answer or refused the credentials in ``exc`` (or an error it was
    raised from), by type: a ``SinkSystemError`` says it; else the sink the registry finds for
    ``exc`` reads its client library's errors; else a ``ConnectionError`` or ``TimeoutError``
    (``socket.timeout``) is a system that did not answer. ``None``: the system answered."""
    declared = declaredError(exc)
    if declared is not None:
        if declared.reason not in CONNECTION:
            return None
        fix = declared.fix or declared.fixFor(declared.reason) or GENERIC_FIX
        return SystemFailure(declared.system, declared.reason, fix)
    spec = specOfError(exc)
    errorClass = spec.errorClass() if spec is not None else None
    for error in errorChain(exc):
        reason = errorClass.classify(error) if errorClass is not None else None
        if reason is None and isinstance(error, ConnectionError | TimeoutError):
            reason = SinkFailure.UNREACHABLE
        if reason is not None and reason in CONNECTION:
            if errorClass is None:
                return SystemFailure(None, reason, GENERIC_FIX)
            return SystemFailure(
                errorClass.system, reason, errorClass.fixFor(reason) or GENERIC_FIX
            )
    return None


def queryFix(exc: BaseException) -> str:
    """The fix a query's operator reads for a system that did not answer or refused the
    credentials (the command line's fixes name its own flags instead); ``""`` otherwise."""
    failure = systemFailure(exc)
    if failure is None:
        return ""
    system = failure.system or "the sink's system"
    if failure.reason is SinkFailure.CREDENTIALS:
        return (
            f"Fix: give the query the credentials and privileges {system} asks for (the sink's "
            "user, password and security options), then start it again."
        )
    return (
        f"Fix: make {system} reachable at the address the query's options give; a query under "
        "twophase.supervise is restarted until it is."
    )


def errorCodeOf(exc: BaseException) -> str | None:
    """The code ``exc`` carries into Spark (``twophase.failures.codes``), or ``None``.

    Its class's own code first; a commit that failed after its retries by its worst failure
    (a fatal one, such as refused credentials, wins over the commit's recoverable code); then
    the system's failure as ``systemFailure`` reads it; then a code an error it was raised
    from declares.
    """
    if isinstance(exc, CommitFailedError):
        inner = [errorCodeOf(error) for _, _, error in exc.failures]
        fatal = [c for c in inner if c is not None and not CODES[c].recoverable]
        return fatal[0] if fatal else exc.errorCode
    code = declaredCode(exc)
    if code is not None:
        return code
    failure = systemFailure(exc)
    if failure is not None:
        return _CODES[failure.reason]
    return next((c for e in errorChain(exc) if (c := declaredCode(e)) is not None), None)


def declaredError(exc: BaseException) -> SinkSystemError | None:
    """The first ``SinkSystemError`` of ``exc`` and the errors it was raised from."""
    return next((e for e in errorChain(exc) if isinstance(e, SinkSystemError)), None)


def errorChain(exc: BaseException) -> list[BaseException]:
    """``exc`` and each error it was raised from: ``__cause__``, else ``__context__`` unless
    the raise left it out (``raise ... from None``), as a traceback shows them."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in chain):
        chain.append(current)
        suppressed = current.__suppress_context__
        current = current.__cause__ or (None if suppressed else current.__context__)
    return chain


__all__ = [
    "CONNECTION",
    "SystemFailure",
    "declaredError",
    "errorChain",
    "errorCodeOf",
    "queryFix",
    "systemFailure",
]
