"""``TwoPhaseCommitSink``: the base class users subclass, and its PySpark stream writer.

A subclass implements the participant lifecycle of ``twophase.protocol`` for one system and is,
at the same time, a PySpark ``DataSource``: ``spark.dataSource.register(MySink)`` and
``df.writeStream.format(MySink.name())`` is all it takes. This module is the only place that
knows how PySpark's Python stream writer calls us (PROTOCOL.md §5):

- the driver calls ``streamWriter()`` once per micro-batch, in a Python worker, before any task
  runs: there we claim the decision log and run recovery;
- tasks call ``write()`` with Arrow record batches; the batch id comes from task properties;
- the driver calls ``commit``/``abort`` in a *fresh* worker that builds the writer again through
  ``streamWriter()``; that second call must not run recovery (the batch's transactions are
  prepared by then and not yet decided).
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from twophase.coordinator import CommitOutcome
from twophase.driver import (
    beforeBatch,
    checkpointQueryId,
    ensureLogging,
    openCoordinator,
    plannedBatchId,
)
from twophase.protocol import (
    RecoveryScope,
    TaskResult,
    TransactionContext,
    TwoPhaseParticipant,
    Txn,
)
from twophase.settings import SinkSettings
from twophase.task import runTask
from twophase.worker_gc import freezeWorkerHeap

log = logging.getLogger(__name__)

LATE_TASK_GRACE_SECONDS = 5.0
"""How long a Spark abort waits before sweeping the failed batch again (see ``abort``)."""

_COMMIT_RUNNER_FILE = "python_streaming_sink_runner.py"


class TwoPhaseCommitSink(DataSource, TwoPhaseParticipant[Txn], Generic[Txn]):
    """Base class of an exactly-once sink: implement the lifecycle, get a Spark data source.

    Implement ``beginTransaction``, ``write``, ``preCommit``, ``commit``, ``abort`` and
    ``recoverAndAbort`` (see ``TwoPhaseParticipant``); override ``name()`` to choose the format
    name and ``validate()`` to check options and the input schema on the driver before the first
    task runs. ``self.options`` holds the writer options (keys as Spark passes them:
    lower-cased; read them with ``twophase.settings.optionOf``).
    """

    def validate(self, schema: StructType) -> None:  # noqa: B027 - optional hook
        """Driver, once per micro-batch before tasks: raise a clear error on bad options/schema."""

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        """Driver: build the writer; when planning a batch, claim the log and recover first."""
        freezeWorkerHeap()
        settings = SinkSettings.fromOptions(self.options, self.name())
        lastDecided: int | None = None
        if not _calledByCommitRunner():
            self.validate(schema)
            queryId = checkpointQueryId(settings.checkpointLocation)
            batchId = plannedBatchId(settings.checkpointLocation)
            lastDecided = beforeBatch(self, settings, queryId, batchId)
        return TwoPhaseStreamWriter(self, settings, lastDecided, uuid.uuid4().hex[:8])


@dataclass
class TwoPhaseCommitMessage(WriterCommitMessage):
    """A task's ``TaskResult`` as JSON, carried to the driver by Spark."""

    result: dict[str, Any]


class TwoPhaseStreamWriter(DataSourceStreamArrowWriter):
    """PySpark's stream writer for any ``TwoPhaseCommitSink``: tasks prepare, the driver decides.

    Pickled to every task, so it holds only the sink (its options), the parsed settings, the
    last batch the log had decided when the batch was planned, and a run id.
    """

    def __init__(
        self,
        sink: TwoPhaseCommitSink[Any],
        settings: SinkSettings,
        lastDecided: int | None,
        runId: str,
    ) -> None:
        self.sink = sink
        self.settings = settings
        self.lastDecided = lastDecided
        self.runId = runId

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TwoPhaseCommitMessage:
        """Executor: write this task's input in one prepared transaction; return its handle."""
        from pyspark import TaskContext

        task = TaskContext.get()
        if task is None:
            raise RuntimeError("TwoPhaseStreamWriter.write must run inside a Spark task")
        batchId = int(task.getLocalProperty("streaming.sql.batchId") or -1)
        if batchId < 0:
            raise RuntimeError(
                "Spark did not pass streaming.sql.batchId to the task; twophase sinks run only "
                "in micro-batch streaming queries (not continuous or real-time mode)"
            )
        ctx = TransactionContext(
            sinkId=self.settings.sinkId,
            queryId=task.getLocalProperty("sql.streaming.queryId") or "",
            batchId=batchId,
            partitionId=task.partitionId(),
            attemptNumber=task.attemptNumber(),
            runId=self.runId,
            options=dict(self.sink.options),
        )
        decided = self.lastDecided is not None and batchId <= self.lastDecided
        result = runTask(self.sink, ctx, iterator, alreadyDecided=decided)
        return TwoPhaseCommitMessage(result.toJson())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: decide batch ``batchId`` durably, then commit every handle of it."""
        freezeWorkerHeap()
        ensureLogging()
        coordinator = openCoordinator(self.sink, self.settings)
        coordinator.commitBatch(batchId, _results(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: abort batch ``batchId``, or roll it forward if the log shows it decided."""
        freezeWorkerHeap()
        ensureLogging()
        coordinator = openCoordinator(self.sink, self.settings)
        report = coordinator.abortBatch(batchId, _results(messages))
        # Spark fails the job and calls abort while it is still killing the batch's other
        # tasks; a task whose input was all delivered can reach PREPARE before its Python
        # worker goes (PySpark allows spark.python.task.killTimeout, 2 s). Sweep once more
        # after that, so a failed batch leaves nothing prepared that would hold table locks
        # (and Kafka's last stable offset) until the next start. Only a task that did not
        # report can still be running, and only an aborted batch is swept.
        if report.outcome is CommitOutcome.ABORTED and any(m is None for m in messages):
            time.sleep(LATE_TASK_GRACE_SECONDS)
            coordinator.sweepAbortedBatch(batchId)


def _results(messages: list[WriterCommitMessage | None]) -> list[TaskResult]:
    return [TaskResult.fromJson(m.result) for m in messages if isinstance(m, TwoPhaseCommitMessage)]


def _calledByCommitRunner() -> bool:
    """True when PySpark's commit/abort worker is building the writer (not batch planning)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_COMMIT_RUNNER_FILE):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class ParticipantSink(TwoPhaseCommitSink[Any]):
    """A sink whose lifecycle is delegated to a plain participant built from its options.

    The built-in sinks keep their system logic in a Spark-free participant class (testable
    without a JVM) and become data sources through this thin wrapper: override ``name()`` and
    ``makeParticipant()``. The participant is built lazily, once per process, and never pickled.
    """

    def makeParticipant(self) -> TwoPhaseParticipant[Any]:
        raise NotImplementedError("ParticipantSink subclasses implement makeParticipant()")

    @property
    def participant(self) -> TwoPhaseParticipant[Any]:
        cached: TwoPhaseParticipant[Any] | None = self.__dict__.get("_participant")
        if cached is None:
            cached = self.makeParticipant()
            self.__dict__["_participant"] = cached
        return cached

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_participant", None)
        return state

    def validate(self, schema: StructType) -> None:
        _ = self.participant  # building it parses and checks the options

    def beginTransaction(self, ctx: TransactionContext) -> Any:
        return self.participant.beginTransaction(ctx)

    def write(self, txn: Any, batch: pa.RecordBatch) -> None:
        self.participant.write(txn, batch)

    def preCommit(self, txn: Any) -> dict[str, Any]:
        return self.participant.preCommit(txn)

    def abortTransaction(self, txn: Any) -> None:
        self.participant.abortTransaction(txn)

    def commit(self, handle: dict[str, Any]) -> None:
        self.participant.commit(handle)

    def abort(self, handle: dict[str, Any]) -> None:
        self.participant.abort(handle)

    def recoverAndCommit(self, handle: dict[str, Any]) -> None:
        self.participant.recoverAndCommit(handle)

    def recoverAndAbort(self, scope: RecoveryScope) -> list[dict[str, Any]]:
        return self.participant.recoverAndAbort(scope)

    def describe(self, handle: dict[str, Any]) -> str:
        return self.participant.describe(handle)
