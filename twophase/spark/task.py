"""One task attempt on an executor: begin, stream the input in, prepare, report the handle.

Shared by the Data Source stream writer and the ``foreachBatch`` adapter, so both run the
exact same executor-side protocol. Input is consumed batch by batch as it arrives: memory per
task is bounded by one Arrow record batch plus whatever the writer buffers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from twophase.faults import crashPoint
from twophase.protocol import TaskResult, TransactionContext, TransactionWriter, checkedHandle
from twophase.redaction import getLogger
from twophase.spark.worker import freezeWorkerHeap

log = getLogger(__name__)


def runTask(
    makeWriter: Callable[[], TransactionWriter[Any]],
    ctx: TransactionContext,
    batches: Iterable[pa.RecordBatch],
    *,
    alreadyDecided: bool,
) -> TaskResult:
    """Write ``batches`` in one prepared transaction and return its handle as a TaskResult.

    When the decision log already holds this batch (``alreadyDecided``: Spark replays a batch
    the coordinator committed before a crash), nothing is written: the input is drained and the
    result carries no handle. If anything fails before ``preCommit`` returns, the open
    transaction is rolled back here (best effort) and the error propagates, so Spark retries
    the task; what a killed attempt leaves behind is swept by ``recoverAndAbort``.
    """
    freezeWorkerHeap()
    if alreadyDecided:
        for _ in batches:
            pass
        log.info(
            "batch %d partition %d already decided in the log; writing nothing",
            ctx.batchId,
            ctx.partitionId,
        )
        return _result(ctx, None, 0)

    writer = makeWriter()
    started = time.monotonic()
    txn = writer.beginTransaction(ctx)
    crashPoint("task.afterBegin", ctx.batchId)
    rows = size = 0
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            writer.write(txn, batch)
            rows += batch.num_rows
            size += batch.nbytes
            crashPoint("task.afterWrite", ctx.batchId)
        handle = checkedHandle(writer, writer.preCommit(txn))
    except BaseException:
        try:
            writer.abortTransaction(txn)
        except Exception:  # the original error matters more; recovery sweeps the rest
            log.warning("could not roll back %s after a failure", ctx.transactionTag, exc_info=True)
        raise
    seconds = time.monotonic() - started
    crashPoint("task.afterPreCommit", ctx.batchId)
    return _result(ctx, handle, rows, size, seconds)


def _result(
    ctx: TransactionContext,
    handle: dict[str, object] | None,
    rows: int,
    size: int = 0,
    seconds: float | None = None,
) -> TaskResult:
    return TaskResult(
        sinkId=ctx.sinkId,
        queryId=ctx.queryId,
        batchId=ctx.batchId,
        partitionId=ctx.partitionId,
        attemptNumber=ctx.attemptNumber,
        handle=handle,
        rows=rows,
        bytes=size,
        seconds=seconds,
    )
