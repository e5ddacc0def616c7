"""What a commit reports: committed, already committed, retry later, lost, or unknown.

As Flink's committer signals it on the commit request (``signalAlreadyCommitted``,
``retryLater``, ``signalFailedWithKnownReason``, ``signalFailedWithUnknownReason``), a
``Committer.commit`` may return a ``CommitStatus`` or a ``CommitResult`` (with a reason);
``None`` means committed. Exceptions keep their meaning: ``TransientCommitError`` is a retry
later, ``TransactionLostError`` a loss, anything else a failure. ``settleCommit`` is where the
coordinator reads the answer: a status it goes on with, or the error of the path it takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from twophase.protocol.errors import SinkContractError, TransactionLostError, TransientCommitError


class CommitStatus(StrEnum):
    """How a commit ended, as the sink tells it."""

    COMMITTED = "committed"
    ALREADY_COMMITTED = "already-committed"
    """Committed by an earlier call (a repeat after a restart, a lost reply): a success."""
    RETRY_LATER = "retry-later"
    """Not now (the system is busy or unreachable): the coordinator retries with backoff."""
    LOST = "lost"
    """The system no longer holds the transaction and it was never committed."""
    UNKNOWN = "unknown"
    """The commit failed for a reason the sink cannot tell: the batch fails, decision kept."""


@dataclass(frozen=True)
class CommitResult:
    """A status with the reason a person reads in the log or the error."""

    status: CommitStatus
    reason: str = ""


CommitAnswer = CommitStatus | CommitResult | None
"""What ``Committer.commit`` (and ``recoverAndCommit``, ``commitReplacement``) may return."""


class CommitUnknownError(Exception):
    """A commit answered ``CommitStatus.UNKNOWN``: failed, for a reason the sink cannot tell."""


def settleCommit(owner: object, answer: Any, what: str = "commit") -> CommitStatus:
    """The status of a commit's answer: ``COMMITTED`` or ``ALREADY_COMMITTED`` returned, the
    others raised as the error whose path the coordinator takes (``TransientCommitError``,
    ``TransactionLostError``, ``CommitUnknownError``). Anything else a commit returns is a
    ``SinkContractError`` naming the sink's class."""
    if answer is None:
        return CommitStatus.COMMITTED
    if isinstance(answer, CommitStatus):
        status, reason = answer, ""
    elif isinstance(answer, CommitResult) and isinstance(answer.status, CommitStatus):
        status, reason = answer.status, answer.reason
    else:
        raise SinkContractError(
            f"{type(owner).__name__}.commit returned {answer!r}; it must return None "
            "(committed), a twophase.protocol.CommitStatus or a CommitResult"
        )
    told = f"{what}: {reason}" if reason else f"{what}: the sink answered {status.value}"
    if status is CommitStatus.RETRY_LATER:
        raise TransientCommitError(told)
    if status is CommitStatus.LOST:
        raise TransactionLostError(told)
    if status is CommitStatus.UNKNOWN:
        raise CommitUnknownError(told)
    return status


__all__ = ["CommitAnswer", "CommitResult", "CommitStatus", "CommitUnknownError", "settleCommit"]
