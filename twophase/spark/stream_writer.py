"""How PySpark's Python stream writer runs a twophase sink: tasks prepare, the driver decides.

- the driver calls ``streamWriter()`` once per micro-batch, in a Python worker, before any task
  runs: there the data source claims the decision log and runs recovery;
- tasks call ``write()`` with Arrow record batches; the batch id comes from task properties;
- the driver calls ``commit``/``abort`` in a *fresh* worker that builds the writer again through
  ``streamWriter()``; that second call must not run recovery (the batch's transactions are
  prepared by then and not yet decided), which ``calledByCommitRunner`` tells.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from twophase.protocol import Committer, TaskResult, TransactionContext, TransactionWriter
from twophase.redaction import rememberSecrets
from twophase.settings import SinkSettings
from twophase.spark.driver import BatchPlan, abortFailedBatch, openCoordinator
from twophase.spark.task import runTask
from twophase.spark.task_advice import adviseOncePerRun
from twophase.spark.worker import ensureLogging, freezeWorkerHeap

_COMMIT_RUNNER_FILE = "python_streaming_sink_runner.py"


class BoundSink(Protocol):
    """What the stream writer needs of its data source (a ``TwoPhaseDataSource``)."""

    safeOptions: ClassVar[frozenset[str]]

    @property
    def options(self) -> Mapping[str, str]: ...

    @classmethod
    def name(cls) -> str: ...

    def createWriter(self) -> TransactionWriter[Any]: ...

    def createCommitter(self) -> Committer: ...


@dataclass
class TwoPhaseCommitMessage(WriterCommitMessage):
    """A task's ``TaskResult`` as JSON, carried to the driver by Spark, with when the task ran
    (wall clock) and the Spark run it belongs to, for ``task_advice``."""

    result: dict[str, Any]
    started: float = 0.0
    finished: float = 0.0
    sparkRunId: str = ""


class TwoPhaseStreamWriter(DataSourceStreamArrowWriter):
    """PySpark's stream writer for any ``TwoPhaseDataSource``.

    Pickled to every task, so it holds only the data source (its options), the parsed
    settings, what the log said the batch's tasks write when it was planned, and a run id.
    """

    def __init__(
        self,
        sink: BoundSink,
        settings: SinkSettings,
        plan: BatchPlan,
        runId: str,
    ) -> None:
        self.sink = sink
        self.settings = settings
        self.plan = plan
        self.runId = runId

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TwoPhaseCommitMessage:
        """Executor: write this task's input in one prepared transaction; return its handle."""
        from pyspark import TaskContext

        started = time.time()
        rememberSecrets(self.sink.options, self.sink.safeOptions)
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
        decided = not self.plan.writes(batchId, ctx.partitionId)
        result = runTask(self.sink.createWriter, ctx, iterator, alreadyDecided=decided)
        return TwoPhaseCommitMessage(
            result.toJson(),
            started,
            time.time(),
            task.getLocalProperty("spark.jobGroup.id") or "",  # Spark's run id of the query
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: decide batch ``batchId`` durably, then commit every handle of it."""
        freezeWorkerHeap()
        ensureLogging()
        coordinator = openCoordinator(self.sink.createCommitter(), self.settings)
        coordinator.commitBatch(batchId, _results(messages))
        reported = [m for m in messages if isinstance(m, TwoPhaseCommitMessage)]
        if reported:
            adviseOncePerRun(
                self.settings.logLocation,
                self.sink.name(),
                batchId,
                [(m.started, m.finished) for m in reported],
                reported[0].sparkRunId,
            )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: abort batch ``batchId``, or roll it forward if the log shows it decided."""
        freezeWorkerHeap()
        ensureLogging()
        coordinator = openCoordinator(self.sink.createCommitter(), self.settings)
        abortFailedBatch(
            coordinator, batchId, _results(messages), unreported=any(m is None for m in messages)
        )


def _results(messages: list[WriterCommitMessage | None]) -> list[TaskResult]:
    return [TaskResult.fromJson(m.result) for m in messages if isinstance(m, TwoPhaseCommitMessage)]


def calledByCommitRunner() -> bool:
    """True when PySpark's commit/abort worker is building the writer (not batch planning)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_COMMIT_RUNNER_FILE):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False
