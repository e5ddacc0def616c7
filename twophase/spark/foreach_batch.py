"""The ``foreachBatch`` adapter: the same sink, tasks and coordinator, driven from a function.

For users already on ``foreachBatch``, and the fastest way to write a batch of many partitions::

    query = (df.writeStream
             .foreachBatch(twophase.foreachBatch("twophase.kafka", {
                 "kafka.bootstrap.servers": servers, "topic": "out",
                 "checkpointLocation": ckpt}))
             .option("checkpointLocation", ckpt)
             .start())

The function runs on the driver once per micro-batch: claim and recover, then one Spark job
(``mapInArrow``) in which every task prepares a transaction and returns its handle, then the
coordinator's decision and commit. The job writes with as many tasks as the cluster has task
slots (option ``writerTasks``; ``twophase.spark.grouping``), however many partitions the batch
has. A replayed batch that the log already holds is not written, except the transactions the
system lost after the decision, which the replay writes again from the same inputs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from twophase.coordinator.figures import BatchTimes
from twophase.protocol import TaskResult, TransactionContext
from twophase.redaction import getLogger, rememberSecrets
from twophase.resources import Resources
from twophase.settings import SinkSettings
from twophase.spark import connect, grouping
from twophase.spark.builtins import builtinSink
from twophase.spark.checkpoint import checkpointQueryId
from twophase.spark.coded import codedErrors
from twophase.spark.datasource import TwoPhaseDataSource
from twophase.spark.driver import (
    abortFailedBatch,
    beforeBatch,
    forgottenIfFenced,
    openCoordinator,
    stoppedBatch,
)
from twophase.spark.query_end import releaseWhenStopped
from twophase.spark.task import runTask

log = getLogger(__name__)

_RESULT_SCHEMA = "result string"

STOP_INTERRUPT_SECONDS = 30.0
"""How long a batch a clean stop gave up waits for Spark's stop to interrupt it."""


def foreachBatch(
    sink: str | TwoPhaseDataSource | type[TwoPhaseDataSource],
    options: Mapping[str, str] | None = None,
) -> Callable[[DataFrame, int], None]:
    """Return a ``foreachBatch`` function that writes each micro-batch exactly once to ``sink``.

    ``sink`` is a built-in format name (``"twophase.kafka"``, with the same options as
    ``format("twophase.kafka")``), a sink class (built with ``options``) or an instance. The
    options must include ``checkpointLocation``: the same directory as the query's, so the
    decision log lives with Spark's own progress. ``writerTasks`` sets how many tasks write
    each batch: unset, one per task slot of the cluster; ``0`` or ``"input"``, one per
    partition of the batch.
    """
    given = dict(options or {})
    if isinstance(sink, TwoPhaseDataSource):
        instance = sink
        tasks = grouping.writerTasksOf(given or instance.options)
    else:
        cls = builtinSink(sink) if isinstance(sink, str) else sink
        instance = cls(grouping.withoutWriterTasks(given))
        tasks = grouping.writerTasksOf(given)
    rememberSecrets(instance.options, instance.safeOptions)
    settings = SinkSettings.fromOptions(instance.options, instance.name())
    return _ForeachBatchWriter(instance, settings, tasks)


class _ForeachBatchWriter:
    """The callable handed to ``foreachBatch``; holds the sink, its parsed settings and the
    number of write tasks asked for (``None``: the cluster's slots)."""

    def __init__(self, sink: TwoPhaseDataSource, settings: SinkSettings, tasks: int | None):
        self.sink = sink
        self.settings = settings
        self.tasks = tasks

    def __call__(self, df: DataFrame, batchId: int) -> None:
        with codedErrors():
            self._write(df, batchId)

    def _write(self, df: DataFrame, batchId: int) -> None:
        spark = df.sparkSession
        streamId = _queryIdOf(spark)
        queryId = streamId or checkpointQueryId(self.settings.checkpointLocation)
        if stoppedBatch(self.settings, queryId, batchId):
            interruptedByStop(spark, batchId)
        releaseWhenStopped(spark, streamId, Resources.ofProcess())
        self.sink.validate(df.schema)
        committer = self.sink.createCommitter()
        planStarted = time.time()
        plan = beforeBatch(self.sink, committer, self.settings, queryId, batchId)
        planned = (planStarted, time.time())
        coordinator = openCoordinator(committer, self.settings, plan.epoch)
        if not plan.writesAny(batchId):
            return  # a replay of a batch the log holds: recovery above has finished it
        lost = sorted(plan.rewrite.get(batchId, ()))
        if lost:
            # Decided, with transactions the system aborted since: write exactly their inputs.
            state = coordinator.log.state(batchId)
            inputs = [state.inputsOf(p) if state is not None else (p,) for p in lost]
            keys = grouping.bucketKeysFor(spark, len(lost))
            frame = grouping.regrouped(df, inputs, keys)
            log.info(
                "twophase sink %s: batch %d: writing the inputs of lost partitions %s again",
                self.settings.sinkId,
                batchId,
                lost,
            )
        else:
            inputs = []
            frame = grouping.grouped(df, self._writerTasks(spark))
        taskFn = _taskFunction(
            self.sink,
            self.settings,
            batchId,
            queryId or "",
            uuid.uuid4().hex[:8],
            rewrite=list(zip(lost, inputs, strict=True)),
        )
        with forgottenIfFenced(self.settings):
            tasksStarted = time.time()
            try:
                rows = frame.mapInArrow(taskFn, _RESULT_SCHEMA).collect()
            except BaseException:
                # Any task may still be preparing: abort the batch, then sweep once more.
                abortFailedBatch(coordinator, batchId, [], unreported=True)
                raise
            times = BatchTimes(planned, (tasksStarted, time.time()))
            results = [TaskResult.fromJson(json.loads(row["result"])) for row in rows]
            coordinator.commitBatch(batchId, results, times)

    def _writerTasks(self, spark: object) -> int:
        """The tasks to write a batch with: as asked, else one per slot (0: as the input is)."""
        if self.tasks is not None:
            return self.tasks
        slots = grouping.taskSlots(spark)
        return slots if slots is not None else 0


def interruptedByStop(spark: Any, batchId: int) -> None:
    """End a batch that a clean stop gave up, the one way Spark records nothing of it.

    Returning would let Spark mark the batch done (``commits/N``) with nothing written; a
    Python error would fail the query. The function's calls into the JVM run on the stream's
    own thread (PySpark's pinned threads), which the stop interrupts: a JVM sleep there raises
    Java's ``InterruptedException``, which Spark, seeing it come back through Py4J, takes for
    its stop's own interruption (SPARK-39218). It comes back as ``StopInterrupted``, whose
    short text Spark's pattern for it reads without running out of stack, and which Py4J's
    callback server does not log.
    """
    from py4j.protocol import Py4JJavaError

    quietStopInterruptions()
    jvm = spark.sparkContext._jvm
    try:
        jvm.java.lang.Thread.sleep(int(STOP_INTERRUPT_SECONDS * 1000))
    except Py4JJavaError as exc:
        java = str(exc.java_exception.getClass().getName())
        raise StopInterrupted(
            f"py4j.protocol.Py4JJavaError: An error occurred while calling Thread.sleep: {java}: "
            f"batch {batchId} given up by a clean stop"
        ) from None
    raise RuntimeError(
        f"twophase: batch {batchId} was given up by a clean stop, but Spark did not interrupt "
        f"it within {STOP_INTERRUPT_SECONDS:.0f} s (are PySpark's pinned threads off, "
        "PYSPARK_PIN_THREAD=false?); nothing of it was written, and the next start writes it"
    )


class StopInterrupted(Exception):
    """The end of a batch a clean stop gave up (``interruptedByStop``)."""


class _QuietStops(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, StopInterrupted)


_quiet = _QuietStops()


def quietStopInterruptions() -> None:
    """Keep Py4J's callback server from logging a ``StopInterrupted`` as a failure."""
    logger = logging.getLogger("py4j.clientserver")
    if _quiet not in logger.filters:
        logger.addFilter(_quiet)


def _queryIdOf(spark: Any) -> str | None:
    """The streaming query's id as Spark gives it to the batch's jobs; ``None`` on Spark
    Connect, whose foreachBatch session has no SparkContext (the checkpoint says it there)."""
    if connect.isConnectSession(spark):
        return None
    return spark.sparkContext.getLocalProperty("sql.streaming.queryId")


def _taskFunction(
    sink: TwoPhaseDataSource,
    settings: SinkSettings,
    batchId: int,
    queryId: str,
    runId: str,
    *,
    rewrite: Sequence[tuple[int, tuple[int, ...]]],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executor side: one prepared transaction per task, one result row out.

    A first write of the batch reports the input partitions its rows came from. A rewrite
    (``rewrite`` lists the lost partitions and their inputs, in task order) writes task ``i``'s
    rows as lost partition ``rewrite[i]``, and checks they are that partition's inputs.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        rememberSecrets(sink.options, sink.safeOptions)
        task = TaskContext.get()
        taskPartition = task.partitionId() if task else 0
        partitionId, expected = rewrite[taskPartition] if rewrite else (taskPartition, None)
        ctx = TransactionContext(
            sinkId=settings.sinkId,
            queryId=queryId,
            batchId=batchId,
            partitionId=partitionId,
            attemptNumber=task.attemptNumber() if task else 0,
            runId=runId,
            options=dict(sink.options),
        )
        seen: set[int] = set()

        def rows() -> Iterator[pa.RecordBatch]:
            for batch in batches:
                data, inputs = grouping.splitInputs(batch)
                seen.update(inputs)
                if expected is not None and not inputs <= set(expected):
                    raise RuntimeError(
                        f"twophase: the rewrite of batch {batchId} partition {partitionId} got "
                        f"rows of input partitions {sorted(inputs - set(expected))}, which its "
                        "decided transaction did not hold; nothing of it is written"
                    )
                yield data

        with codedErrors():
            result = runTask(sink.createWriter, ctx, rows(), alreadyDecided=False)
        held = tuple(expected) if expected is not None else tuple(sorted(seen))
        result = dataclasses.replace(result, inputs=held)
        yield pa.RecordBatch.from_pydict({"result": [json.dumps(result.toJson())]})

    return run
