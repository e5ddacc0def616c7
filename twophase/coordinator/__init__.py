"""The driver-side coordinator: the decision log and the state machine that drives batches.

Knows the protocol, never Spark and never a particular external system (PROTOCOL.md section 9).
"""

from twophase.coordinator.coordinator import (
    CommitOutcome,
    CommitReport,
    Coordinator,
    CoordinatorSettings,
    RecoveryReport,
)
from twophase.coordinator.errors import (
    CommitFailedError,
    CoordinatorError,
    DecisionConflictError,
    LogOwnershipError,
)
from twophase.coordinator.log import (
    BatchState,
    BatchStatus,
    DecisionLog,
    LoggedHandle,
    LogOwner,
)

__all__ = [
    "BatchState",
    "BatchStatus",
    "CommitFailedError",
    "CommitOutcome",
    "CommitReport",
    "Coordinator",
    "CoordinatorError",
    "CoordinatorSettings",
    "DecisionConflictError",
    "DecisionLog",
    "LogOwner",
    "LogOwnershipError",
    "LoggedHandle",
    "RecoveryReport",
]
