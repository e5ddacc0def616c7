"""What a coordinator call did: the outcome of a batch, and what recovery finished."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class CommitOutcome(StrEnum):
    """What ``commitBatch``/``abortBatch`` did to the batch."""

    COMMITTED = "committed"
    """Decided now, and every handle committed."""
    ROLLED_FORWARD = "rolledForward"
    """Found decided by an earlier attempt; its logged handles committed now."""
    ALREADY_COMMITTED = "alreadyCommitted"
    """A replay of a committed batch: nothing committed, the replay's handles aborted."""
    ABORTED = "aborted"
    """Undecided batch aborted: nothing of it is visible."""


@dataclass(frozen=True, kw_only=True)
class CommitReport:
    """The outcome and timings of one ``commitBatch`` or ``abortBatch`` call, built by name;
    a count or time the call did not have is zero."""

    sinkId: str
    batchId: int
    outcome: CommitOutcome
    handles: int = 0
    """Handles of the decision (committed), or handles aborted for ``ABORTED``."""
    rows: int = 0
    duplicatesAborted: int = 0
    """Handles of the given results not in the decision (replays, duplicates), aborted."""
    stragglersAborted: int = 0
    """Other prepared transactions of the batch found and aborted (failed attempts)."""
    retries: int = 0
    """Retries after transient errors, over all handles."""
    seconds: float = 0.0
    """Wall time of the whole call."""
    commitSeconds: float = 0.0
    """Wall time of committing (or aborting) the handles alone."""


@dataclass(frozen=True)
class RecoveryReport:
    """What ``recover`` finished: decided batches rolled forward, lingering transactions aborted."""

    sinkId: str
    batchesFinished: tuple[int, ...]
    handlesCommitted: int
    transactionsAborted: int
    seconds: float
    awaitingRewrite: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    """Decided batches with partitions to write again (batch id -> partition ids): their
    transactions were aborted by the participant, and the replay of the batch writes them."""

    @property
    def idle(self) -> bool:
        """True when there was nothing to recover."""
        return (
            not self.batchesFinished and not self.transactionsAborted and not self.awaitingRewrite
        )
