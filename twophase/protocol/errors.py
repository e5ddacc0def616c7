"""The protocol's errors: try again later, a transaction gone, a sink that broke its contract,
and the declared way a sink's error names its system, its kind of failure and the fix."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import ClassVar


class TransientCommitError(Exception):
    """Raised by ``commit``/``abort`` when a retry may succeed (server down, timeout).

    The coordinator retries only these (with backoff); any other exception fails the batch
    at once, because retrying a permanent error hides it.
    """

    errorCode = "TWOPHASE_UNREACHABLE"


class TransactionLostError(Exception):
    """A decided transaction can no longer be committed (the participant aborted it).

    Raised loudly with the batch, the participant and the transaction. When the sink
    fingerprints its handles (``Committer.fingerprint``) the coordinator has the batch's replay
    write it again; ``rewritable = False`` says the replay cannot be checked for this loss (a
    part of a composite handle without a fingerprint), and the query stops instead.
    """

    rewritable: bool = True
    errorCode = "TWOPHASE_TRANSACTION_LOST"


class SinkContractError(TypeError):
    """A sink's method returned something the framework cannot use.

    Names the sink class, the method, what it returned and what it must return, so the
    author of the sink sees the fix instead of a ``TypeError`` deep in the coordinator.
    """

    errorCode = "TWOPHASE_SINK_CONTRACT"


class SinkFailure(Enum):
    """What kind of failure a sink's system reported, which decides what the operator reads."""

    UNREACHABLE = "unreachable"
    """The system did not answer or would not take the connection (down, a wrong address, a
    missing database): nothing was done there."""
    CREDENTIALS = "credentials"
    """The system answered and refused who we are (a wrong or missing password, a key it does
    not know, a principal without the right): nothing was done there."""
    REJECTED = "rejected"
    """The system answered and refused the work itself (a row, a table that differs)."""


class SinkSystemError(Exception):
    """An error that says which system failed, how, and the operator's fix.

    A sink's own errors subclass it (alone, or next to ``ConnectionError``,
    ``TransientCommitError``...) and declare ``system`` (``"PostgreSQL"``), ``reason`` (a
    ``SinkFailure``) and ``fix`` (one sentence, ``"Fix: ..."``). ``fixes`` gives a fix per
    reason, for a class raised for several; ``classify`` says how the system's client library
    reports a failure, for its errors that reach the command line unwrapped. Each may be given
    per instance: ``MyError(message, reason=SinkFailure.CREDENTIALS)`` (with this class first
    among the bases, before ``ConnectionError`` or ``RuntimeError``). ``twophase recover`` and
    ``doctor`` say the system and the fix of such an error, or of one it was raised from (the
    fixes name their ``--sink-option`` flags; ``verify``, whose flags differ, says its own).
    """

    system: str = "the sink's system"
    reason: SinkFailure = SinkFailure.REJECTED
    fix: str = ""
    fixes: ClassVar[Mapping[SinkFailure, str]] = MappingProxyType({})

    def __init__(
        self,
        *args: object,
        system: str | None = None,
        reason: SinkFailure | None = None,
        fix: str | None = None,
    ) -> None:
        super().__init__(*args)
        if system is not None:
            self.system = system
        if reason is not None:
            self.reason = reason
        if fix is not None:
            self.fix = fix
        elif not self.fix:
            self.fix = self.fixFor(self.reason)

    @property
    def errorCode(self) -> str:
        """The code the error carries into Spark (``twophase.failures.codes``): by its reason."""
        return _CODES[self.reason]

    @classmethod
    def fixFor(cls, reason: SinkFailure) -> str:
        """The class's fix for a failure of ``reason`` (``""``: none declared)."""
        return cls.fixes.get(reason) or cls.fix

    @classmethod
    def classify(cls, exc: BaseException) -> SinkFailure | None:
        """What kind of failure ``exc``, an error of this system's client library, reports;
        ``None`` when it does not tell (the default)."""
        return None


_CODES = MappingProxyType(
    {
        SinkFailure.UNREACHABLE: "TWOPHASE_UNREACHABLE",
        SinkFailure.CREDENTIALS: "TWOPHASE_CREDENTIALS",
        SinkFailure.REJECTED: "TWOPHASE_REJECTED",
    }
)
"""The code of a ``SinkSystemError`` of each reason."""
