"""The values that cross processes: who writes (context), what a task prepared (handle, result).

Small, JSON-serialisable and free of secrets: a handle lands in the decision log, a task result
travels from an executor to the driver, a recovery scope tells a committer what it may abort.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

Handle = dict[str, Any]
"""A small JSON value that lets any process on any machine finish one prepared transaction."""


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
    options: Mapping[str, str] = field(default_factory=dict, repr=False)
    """The sink's options as Spark passed them, secrets included: never shown or persisted."""

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
    options: Mapping[str, str] = field(default_factory=dict, repr=False)

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


@dataclass(frozen=True)
class TaskResult:
    """What one task attempt reports to the driver: its prepared handle, or that it skipped.

    Travels as the Spark ``WriterCommitMessage`` (or a row in ``foreachBatch``), so it is
    small and JSON-serialisable. ``handle`` is ``None`` when the task wrote nothing because
    the log already showed its batch decided. ``inputs`` names the partitions of Spark's input
    whose rows the transaction holds, when a task wrote several of them (``twophase.foreachBatch``
    with ``writerTasks``); ``None`` means the task's own partition. A replay that must write a
    lost transaction again writes exactly those inputs, however Spark groups them then.

    ``bytes`` and ``seconds`` are figures for operators, never read by the protocol: the Arrow
    size (``RecordBatch.nbytes``) of the rows the task handed to the sink's writer, and the
    time from ``beginTransaction`` to ``preCommit`` returning. A result from an older executor
    has neither (0 and ``None``).
    """

    sinkId: str
    queryId: str
    batchId: int
    partitionId: int
    attemptNumber: int
    handle: Handle | None
    rows: int = 0
    inputs: tuple[int, ...] | None = None
    bytes: int = 0
    seconds: float | None = None

    def toJson(self) -> dict[str, Any]:
        data = asdict(self)
        if self.inputs is None:
            del data["inputs"]
        else:
            data["inputs"] = list(self.inputs)
        if self.seconds is None:
            del data["seconds"]
        return data

    @classmethod
    def fromJson(cls, data: Mapping[str, Any]) -> TaskResult:
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if fields.get("inputs") is not None:
            fields["inputs"] = tuple(int(i) for i in fields["inputs"])
        return cls(**fields)
