"""The driver-side coordinator: the decision log and the state machine that drives batches.

Knows the protocol, never Spark and never a particular external system
(docs/protocol.md section 9).
"""

from twophase.coordinator.coordinator import Coordinator
from twophase.coordinator.errors import (
    CommitFailedError,
    CoordinatorError,
    DecisionConflictError,
    DecisionLogWriteError,
    DriverFencedError,
    LogOwnershipError,
    UnfencedLogStoreError,
)
from twophase.coordinator.log import DecisionLog
from twophase.coordinator.records import BatchState, BatchStatus, LoggedHandle, LogOwner
from twophase.coordinator.reports import CommitOutcome, CommitReport, RecoveryReport
from twophase.coordinator.runs import Driver, Run
from twophase.coordinator.settings import CoordinatorSettings

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
    "DecisionLogWriteError",
    "Driver",
    "DriverFencedError",
    "LogOwner",
    "LogOwnershipError",
    "LoggedHandle",
    "RecoveryReport",
    "Run",
    "UnfencedLogStoreError",
]
