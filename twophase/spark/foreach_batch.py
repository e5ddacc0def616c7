"""The ``foreachBatch`` adapter: the same sink, tasks and coordinator, driven from a function.

For users already on ``foreachBatch``::

    query = (df.writeStream
             .foreachBatch(twophase.foreachBatch(FilesSink, {"path": out,
                                                             "checkpointLocation": ckpt}))
             .option("checkpointLocation", ckpt)
             .start())

The function runs on the driver once per micro-batch: claim and recover, then one Spark job
(``mapInArrow``) in which every task prepares a transaction and returns its handle, then the
coordinator's decision and commit. A replayed batch that the log already holds is not written.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping

import pyarrow as pa
from pyspark.sql import DataFrame

from twophase.protocol import TaskResult, TransactionContext
from twophase.redaction import rememberSecrets
from twophase.settings import SinkSettings
from twophase.spark.checkpoint import checkpointQueryId
from twophase.spark.datasource import TwoPhaseDataSource
from twophase.spark.driver import BatchPlan, beforeBatch, openCoordinator
from twophase.spark.task import runTask

_RESULT_SCHEMA = "result string"


def foreachBatch(
    sink: TwoPhaseDataSource | type[TwoPhaseDataSource],
    options: Mapping[str, str] | None = None,
) -> Callable[[DataFrame, int], None]:
    """Return a ``foreachBatch`` function that writes each micro-batch exactly once to ``sink``.

    ``sink`` is a sink class (built with ``options``) or an instance. The options must include
    ``checkpointLocation``: the same directory as the query's, so the decision log lives with
    Spark's own progress.
    """
    instance = sink(dict(options or {})) if isinstance(sink, type) else sink
    rememberSecrets(instance.options, instance.safeOptions)
    settings = SinkSettings.fromOptions(instance.options, instance.name())
    return _ForeachBatchWriter(instance, settings)


class _ForeachBatchWriter:
    """The callable handed to ``foreachBatch``; holds the sink and its parsed settings."""

    def __init__(self, sink: TwoPhaseDataSource, settings: SinkSettings) -> None:
        self.sink = sink
        self.settings = settings

    def __call__(self, df: DataFrame, batchId: int) -> None:
        spark = df.sparkSession
        queryId = spark.sparkContext.getLocalProperty("sql.streaming.queryId") or (
            checkpointQueryId(self.settings.checkpointLocation)
        )
        self.sink.validate(df.schema)
        committer = self.sink.createCommitter()
        plan = beforeBatch(self.sink, committer, self.settings, queryId, batchId)
        coordinator = openCoordinator(committer, self.settings)
        if not plan.writesAny(batchId):
            return  # a replay of a batch the log holds: recovery above has finished it
        taskFn = _taskFunction(
            self.sink, self.settings, plan, batchId, queryId or "", uuid.uuid4().hex[:8]
        )
        try:
            rows = df.mapInArrow(taskFn, _RESULT_SCHEMA).collect()
        except BaseException:
            coordinator.abortBatch(batchId, [])  # sweeps whatever the failed job prepared
            raise
        results = [TaskResult.fromJson(json.loads(row["result"])) for row in rows]
        coordinator.commitBatch(batchId, results)


def _taskFunction(
    sink: TwoPhaseDataSource,
    settings: SinkSettings,
    plan: BatchPlan,
    batchId: int,
    queryId: str,
    runId: str,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executor side: one prepared transaction per partition, one result row out."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        rememberSecrets(sink.options, sink.safeOptions)
        task = TaskContext.get()
        ctx = TransactionContext(
            sinkId=settings.sinkId,
            queryId=queryId,
            batchId=batchId,
            partitionId=task.partitionId() if task else 0,
            attemptNumber=task.attemptNumber() if task else 0,
            runId=runId,
            options=dict(sink.options),
        )
        decided = not plan.writes(batchId, ctx.partitionId)
        result = runTask(sink.createWriter, ctx, batches, alreadyDecided=decided)
        yield pa.RecordBatch.from_pydict({"result": [json.dumps(result.toJson())]})

    return run
