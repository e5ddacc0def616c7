"""Both halves in one class, named as in Flink's TwoPhaseCommitSinkFunction, for simple sinks."""

from __future__ import annotations

from typing import Generic

from twophase.protocol.committer import Committer
from twophase.protocol.writer import TransactionWriter, Txn


class TwoPhaseParticipant(TransactionWriter[Txn], Committer, Generic[Txn]):
    """A writer and its committer in one object: the whole lifecycle of one system.

    Executor side, once per task attempt: ``beginTransaction`` -> ``write``* -> ``preCommit``
    (or ``abortTransaction`` on failure). Driver side, in any process: ``commit``, ``abort``,
    ``recoverAndCommit`` and ``recoverAndAbort``, all idempotent. Sinks whose two halves share
    little state are clearer as a ``TransactionWriter`` and a ``Committer`` apart.
    """
