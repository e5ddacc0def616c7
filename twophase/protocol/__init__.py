"""The two-phase commit protocol every sink speaks: the writer, the committer and their values.

Plain Python: nothing here knows Spark, the coordinator's log or any one external system.
docs/protocol.md maps the protocol onto Spark micro-batches and lists every crash window; the
Spark binding (``twophase.spark``) runs the writer in tasks, the coordinator
(``twophase.coordinator``) drives the committer from the driver.
"""

from twophase.protocol.checks import checkedAborted, checkedHandle
from twophase.protocol.committer import Committer, listsPrepared
from twophase.protocol.errors import (
    SinkContractError,
    SinkFailure,
    SinkSystemError,
    TransactionLostError,
    TransientCommitError,
)
from twophase.protocol.handles import (
    Handle,
    RecoveryScope,
    TaskResult,
    TransactionContext,
    dumpsHandle,
    loadsHandle,
)
from twophase.protocol.outcomes import CommitResult, CommitStatus, CommitUnknownError
from twophase.protocol.participant import TwoPhaseParticipant
from twophase.protocol.sweep import Prepared
from twophase.protocol.writer import TransactionWriter, Txn

__all__ = [
    "CommitResult",
    "CommitStatus",
    "CommitUnknownError",
    "Committer",
    "Handle",
    "Prepared",
    "RecoveryScope",
    "SinkContractError",
    "SinkFailure",
    "SinkSystemError",
    "TaskResult",
    "TransactionContext",
    "TransactionLostError",
    "TransactionWriter",
    "TransientCommitError",
    "TwoPhaseParticipant",
    "Txn",
    "checkedAborted",
    "checkedHandle",
    "dumpsHandle",
    "listsPrepared",
    "loadsHandle",
]
