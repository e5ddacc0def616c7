"""The two-phase commit protocol every participant speaks: context, handle, lifecycle.

Plain Python: nothing here knows Spark, the coordinator's log or any one external system.
The Spark binding (``twophase.spark``) turns a participant into a PySpark data source; the
coordinator (``twophase.coordinator``) drives ``commit``/``abort``/``recover*`` from the driver.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, TypeVar

import pyarrow as pa

Handle = dict[str, Any]
"""A small JSON value that lets any process on any machine finish one prepared transaction."""

Txn = TypeVar("Txn")
"""A participant's open transaction object; lives only inside one task attempt."""


@dataclass(frozen=True)
class TransactionContext:
    """Who is writing: one task attempt of one micro-batch of one sink.

    Built on the executor from Spark's task properties and handed to ``beginTransaction``.
    ``runId`` is fresh per query start, so ids of a restarted query never collide with a
    zombie of the previous run.
    """

    sinkId: str
    queryId: str
    batchId: int
    partitionId: int
    attemptNumber: int
    runId: str = ""
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def transactionTag(self) -> str:
        """A readable id for this attempt's transaction: sink, batch, partition, attempt."""
        return f"{self.sinkId}-b{self.batchId}-p{self.partitionId}-a{self.attemptNumber}"

    def toJson(self) -> dict[str, Any]:
        data = asdict(self)
        data["options"] = dict(self.options)
        return data


@dataclass(frozen=True)
class RecoveryScope:
    """What ``recoverAndAbort`` may touch: this sink's transactions, minus those a decision keeps.

    ``batchId`` narrows the sweep to one batch (stragglers after a decision); ``None`` means
    every batch (recovery at the start of a micro-batch). ``keep`` lists handles that a
    durable decision still has to commit: never abort those.
    """

    sinkId: str
    keep: tuple[Handle, ...] = ()
    batchId: int | None = None
    options: Mapping[str, str] = field(default_factory=dict)

    def keeps(self, predicate_key: str, value: Any) -> bool:
        """True if some kept handle has ``handle[predicate_key] == value``."""
        return any(h.get(predicate_key) == value for h in self.keep)


def dumpsHandle(handle: Handle) -> str:
    """Canonical JSON text of a handle (sorted keys), the form stored in the decision log."""
    return json.dumps(handle, sort_keys=True, separators=(",", ":"))


def loadsHandle(text: str) -> Handle:
    """Parse a handle written by ``dumpsHandle``; rejects anything that is not a JSON object."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"a handle must be a JSON object, got {type(value).__name__}")
    return value


class TransientCommitError(Exception):
    """Raised by ``commit``/``abort`` when a retry may succeed (server down, timeout).

    The coordinator retries only these (with backoff); any other exception fails the batch
    at once, because retrying a permanent error hides it.
    """


class TransactionLostError(Exception):
    """A decided transaction can no longer be committed (the participant aborted it).

    Raised loudly with the batch, the participant and the transaction: the promise of
    exactly-once is broken for it and an operator must know.
    """


class TwoPhaseParticipant(ABC, Generic[Txn]):
    """The lifecycle of a two-phase participant, named as in Flink's TwoPhaseCommitSinkFunction.

    Executor side, once per task attempt: ``beginTransaction`` -> ``write``* -> ``preCommit``
    (or ``abort`` of the open transaction on failure). Driver side, in any process:
    ``commit``, ``abort``, ``recoverAndCommit`` and ``recoverAndAbort``, all idempotent.
    """

    @abstractmethod
    def beginTransaction(self, ctx: TransactionContext) -> Txn:
        """Executor: open a transaction for one task attempt of batch ``ctx.batchId``."""

    @abstractmethod
    def write(self, txn: Txn, batch: pa.RecordBatch) -> None:
        """Executor: add one Arrow record batch to the open transaction; nothing visible yet."""

    @abstractmethod
    def preCommit(self, txn: Txn) -> Handle:
        """Executor: flush and prepare; return a JSON handle. Nothing visible yet."""

    def abortTransaction(self, txn: Txn) -> None:  # noqa: B027 - optional hook
        """Executor: roll back a transaction that never reached ``preCommit`` (task failed).

        Best effort: whatever it leaves behind is found later by ``recoverAndAbort``.
        """

    @abstractmethod
    def commit(self, handle: Handle) -> None:
        """Driver, idempotent: make a prepared transaction visible; no-op when already done."""

    @abstractmethod
    def abort(self, handle: Handle) -> None:
        """Driver, idempotent: discard a prepared transaction; no-op when already gone."""

    def recoverAndCommit(self, handle: Handle) -> None:
        """Driver, idempotent: commit a handle of a decided batch after a restart."""
        self.commit(handle)

    @abstractmethod
    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle]:
        """Driver, idempotent: abort this sink's prepared transactions that no decision keeps.

        Returns what it aborted (for logs and ``twophase status``).
        """

    def describe(self, handle: Handle) -> str:
        """A short human description of a handle for logs and errors (never secrets)."""
        return dumpsHandle(handle)


@dataclass(frozen=True)
class TaskResult:
    """What one task attempt reports to the driver: its prepared handle, or that it skipped.

    Travels as the Spark ``WriterCommitMessage`` (or a row in ``foreachBatch``), so it is
    small and JSON-serialisable. ``handle`` is ``None`` when the task wrote nothing because
    the log already showed its batch decided.
    """

    sinkId: str
    queryId: str
    batchId: int
    partitionId: int
    attemptNumber: int
    handle: Handle | None
    rows: int = 0

    def toJson(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def fromJson(cls, data: Mapping[str, Any]) -> TaskResult:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
