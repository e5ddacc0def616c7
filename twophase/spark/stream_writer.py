"""How PySpark's Python stream writer runs a twophase sink: tasks prepare, the driver decides.

- to plan a micro-batch, the driver builds the writer (``streamWriter()``) in a Python worker
  and pickles it to send it to the tasks: when it is pickled, before any task runs, the writer
  validates the input and the data source claims the decision log and runs recovery;
- tasks call ``write()`` with Arrow record batches (PySpark 4.0: rows, made record batches by
  ``versions.taskBatches``); the batch id comes from task properties;
- the driver calls ``commit``/``abort`` in a *fresh* worker that builds the writer again through
  ``streamWriter()`` and never pickles it, so recovery does not run there (the batch's
  transactions are prepared by then and not yet decided).

That order of calls is PySpark's (``write_into_data_source.py`` pickles the writer it plans,
``python_streaming_sink_runner.py`` calls ``commit``/``abort`` on the one it builds);
``integration_tests/test_spark_binding.py`` fails the day a PySpark version changes it, and
``commit``/``abort`` refuse a writer that was planned.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pyspark.sql.types import StructType

from twophase.coordinator.figures import BatchTimes
from twophase.protocol import Committer, TaskResult, TransactionContext, TransactionWriter
from twophase.redaction import rememberSecrets
from twophase.settings import SinkSettings
from twophase.spark.checkpoint import checkpointQueryId, plannedBatchId
from twophase.spark.coded import codedErrors
from twophase.spark.driver import (
    BatchPlan,
    abortFailedBatch,
    beforeBatch,
    forgottenIfFenced,
    openCoordinator,
    stoppedBatch,
)
from twophase.spark.grouping import refuseWriterTasks
from twophase.spark.schema import arrowSchemaOf
from twophase.spark.task import runTask
from twophase.spark.task_advice import adviseOncePerRun
from twophase.spark.versions import StreamWriterBase, WriterCommitMessage, taskBatches
from twophase.spark.worker import ensureLogging, freezeWorkerHeap


class BoundSink(Protocol):
    """What the stream writer needs of its data source (a ``TwoPhaseDataSource``)."""

    safeOptions: ClassVar[frozenset[str]]

    @property
    def options(self) -> Mapping[str, str]: ...

    @classmethod
    def name(cls) -> str: ...

    def validate(self, schema: StructType) -> None: ...

    def createWriter(self) -> TransactionWriter[Any]: ...

    def createCommitter(self) -> Committer: ...


@dataclass
class TwoPhaseCommitMessage(WriterCommitMessage):
    """A task's ``TaskResult`` as JSON, carried to the driver by Spark, with when the task ran
    (wall clock) and the Spark run it belongs to, for ``task_advice``, and when its batch was
    planned, for the batch's figures (``BatchTimes``)."""

    result: dict[str, Any]
    started: float = 0.0
    finished: float = 0.0
    sparkRunId: str = ""
    planned: tuple[float, float] | None = None


class TwoPhaseStreamWriter(StreamWriterBase):
    """PySpark's stream writer for any ``TwoPhaseDataSource``.

    Pickled to every task, so it holds only the data source (its options), the parsed
    settings, the input schema, what the log said the batch's tasks write when it was planned,
    and a run id.
    """

    def __init__(
        self, sink: BoundSink, settings: SinkSettings, schema: StructType, runId: str
    ) -> None:
        self.sink = sink
        self.settings = settings
        self.schema = schema
        self.runId = runId
        self.plan: BatchPlan | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Plan the batch before the writer leaves for the tasks (once; see the module doc)."""
        if self.plan is None:
            began = time.time()
            with codedErrors():
                plan = self._planBatch()
            self.plan = dataclasses.replace(plan, planned=(began, time.time()))
        return dict(self.__dict__)

    def _planBatch(self) -> BatchPlan:
        """Driver: check the options and the input, claim the log and recover, before any task;
        nothing at all when the query is stopping cleanly."""
        queryId = checkpointQueryId(self.settings.checkpointLocation)
        batchId = plannedBatchId(self.settings.checkpointLocation)
        if stoppedBatch(self.settings, queryId, batchId):
            return BatchPlan(stopping=True)
        refuseWriterTasks(self.sink.options, self.sink.name())
        self.sink.validate(self.schema)
        committer = self.sink.createCommitter()
        return beforeBatch(self.sink, committer, self.settings, queryId, batchId)

    def _checkUnplanned(self) -> None:
        """Refuse to commit with a writer that planned a batch: PySpark pickled the writer it
        commits with, so recovery ran while this batch's transactions were undecided."""
        if self.plan is not None:
            raise RuntimeError(
                "twophase: PySpark pickled the stream writer it commits with, so it planned a "
                "batch (and ran recovery) in its commit worker; this PySpark calls data source "
                "writers in an order twophase does not support (see twophase.spark.stream_writer)"
            )

    def write(self, iterator: Iterator[Any]) -> TwoPhaseCommitMessage:
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
        if self.plan is None:
            raise RuntimeError("a twophase stream writer reached a task without a batch plan")
        decided = not self.plan.writes(batchId, ctx.partitionId)
        batches = taskBatches(iterator, lambda: arrowSchemaOf(self.schema, self.sink.name()))
        with codedErrors():
            result = runTask(self.sink.createWriter, ctx, batches, alreadyDecided=decided)
        return TwoPhaseCommitMessage(
            result.toJson(),
            started,
            time.time(),
            task.getLocalProperty("spark.jobGroup.id") or "",  # Spark's run id of the query
            self.plan.planned,
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: decide batch ``batchId`` durably, then commit every handle of it."""
        freezeWorkerHeap()
        ensureLogging()
        self._checkUnplanned()
        with codedErrors(), forgottenIfFenced(self.settings):
            coordinator = openCoordinator(self.sink.createCommitter(), self.settings)
            coordinator.commitBatch(batchId, _results(messages), _times(messages))
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
        self._checkUnplanned()
        with codedErrors(), forgottenIfFenced(self.settings):
            coordinator = openCoordinator(self.sink.createCommitter(), self.settings)
            abortFailedBatch(
                coordinator,
                batchId,
                _results(messages),
                unreported=any(m is None for m in messages),
            )


def _times(messages: list[WriterCommitMessage | None]) -> BatchTimes:
    """When the batch was planned and its tasks ran, from what the tasks reported."""
    reported = [m for m in messages if isinstance(m, TwoPhaseCommitMessage)]
    if not reported:
        return BatchTimes()
    return BatchTimes(
        planned=reported[0].planned,
        tasks=(min(m.started for m in reported), max(m.finished for m in reported)),
    )


def _results(messages: list[WriterCommitMessage | None]) -> list[TaskResult]:
    return [TaskResult.fromJson(m.result) for m in messages if isinstance(m, TwoPhaseCommitMessage)]
