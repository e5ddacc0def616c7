"""The executor half of the protocol: open, write and prepare one transaction per task attempt.

A ``TransactionWriter`` runs inside a Spark task (any executor, any Python worker). It never
decides anything: it prepares, returns a handle, and the committer finishes the work elsewhere.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypeVar

import pyarrow as pa

from twophase.protocol.handles import Handle, TransactionContext

Txn = TypeVar("Txn")
"""A writer's open transaction object; lives only inside one task attempt."""


class TransactionWriter(ABC, Generic[Txn]):
    """Executor side, once per task attempt: ``beginTransaction`` -> ``write``* -> ``preCommit``.

    On any failure before ``preCommit`` returns, ``abortTransaction`` rolls the open transaction
    back (best effort). Nothing a writer does is visible to readers: visibility is the
    committer's job, after the driver has decided the batch.
    """

    @abstractmethod
    def beginTransaction(self, ctx: TransactionContext) -> Txn:
        """Executor: open a transaction for one task attempt of batch ``ctx.batchId``."""

    @abstractmethod
    def write(self, txn: Txn, batch: pa.RecordBatch) -> None:
        """Executor: add one Arrow record batch to the open transaction; nothing visible yet."""

    @abstractmethod
    def preCommit(self, txn: Txn) -> Handle:
        """Executor: flush and prepare; return a JSON-serialisable dict. Nothing visible yet."""

    def abortTransaction(self, txn: Txn) -> None:  # noqa: B027 - optional hook
        """Executor: roll back a transaction that never reached ``preCommit`` (task failed).

        Best effort: whatever it leaves behind is found later by ``recoverAndAbort``.
        """
