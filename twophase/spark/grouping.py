"""How ``twophase.foreachBatch`` groups Spark's input partitions into write tasks.

PySpark charges every Python task a fixed cost, and a batch after any aggregation or join has
Spark's 200 shuffle partitions. ``foreachBatch`` therefore writes each batch with about as many
tasks as the cluster has task slots (option ``writerTasks``): ``coalesce`` joins input
partitions into tasks without a shuffle. Each row carries the id of the input partition it
came from (``spark_partition_id()`` taken before the ``coalesce``), so every task reports which
inputs its transaction holds.

Spark groups coalesced partitions by where their data lives, so after an executor is lost a
replay of the same batch can group them differently. A replay that must write the lost
transactions of a decided batch again (Kafka's transaction timeout, an S3 lifecycle rule) does
not trust any grouping: it keeps the rows of the lost transactions' inputs and shuffles them so
that task ``i`` holds exactly the inputs of the ``i``-th lost transaction, whatever Spark did
the first time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from twophase.settings import TwoPhaseConfigError, optionOf
from twophase.spark import connect

WRITER_TASKS_OPTION = "writerTasks"
INPUT_COLUMN = "__twophase_input_partition"
"""The input partition each row came from, added before the grouping, dropped before writing."""
TARGET_COLUMN = "__twophase_target"
"""In a rewrite: the bucket key that sends a row to the task of its lost transaction."""
_KEEP_INPUT = ("0", "input")


def writerTasksOf(options: Mapping[str, str]) -> int | None:
    """``writerTasks`` from the options: a positive count, ``0`` to keep the input's partitions,
    or ``None`` (unset) for the cluster's task slots."""
    raw = optionOf(options, WRITER_TASKS_OPTION)
    if raw is None:
        return None
    text = raw.strip().lower()
    if text in _KEEP_INPUT:
        return 0
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise TwoPhaseConfigError(
            f"option {WRITER_TASKS_OPTION}={raw!r} must be a number of tasks (1 or more), or 0 / "
            "'input' to write with one task per input partition; leave it unset for one task "
            "per task slot of the cluster"
        )
    return value


def refuseWriterTasks(options: Mapping[str, str], sinkName: str) -> None:
    """``writeStream.format(...)`` cannot choose its tasks: refuse ``writerTasks`` there."""
    if optionOf(options, WRITER_TASKS_OPTION) is not None:
        raise TwoPhaseConfigError(
            f"option {WRITER_TASKS_OPTION} applies to twophase.foreachBatch only: with "
            f"writeStream.format({sinkName!r}) Spark writes one task per partition of the "
            f"batch. Add .coalesce(n) before writeStream, or write with "
            f'.foreachBatch(twophase.foreachBatch("{sinkName}", options))'
        )


def withoutWriterTasks(options: Mapping[str, str]) -> dict[str, str]:
    """The options without ``writerTasks`` (any case): the sink itself never sees it."""
    lowered = WRITER_TASKS_OPTION.lower()
    return {k: v for k, v in options.items() if k.lower() != lowered}


def taskSlots(spark: Any) -> int | None:
    """How many tasks the cluster runs at once, or ``None`` when the session cannot tell.

    A classic session asks the SparkContext (``defaultParallelism``: the executors' cores, or
    the threads of ``local[n]``). A Spark Connect session has no SparkContext: it reads
    ``spark.default.parallelism`` when set, else counts the slots of a ``local[...]`` master.
    """
    if not connect.isConnectSession(spark):
        return int(spark.sparkContext.defaultParallelism)
    conf = spark.conf
    explicit = conf.get("spark.default.parallelism", None)
    if explicit:
        return int(explicit)
    return localSlots(conf.get("spark.master", None) or "")


def localSlots(master: str) -> int | None:
    """Task slots of a ``local`` or ``local-cluster`` master URL; ``None`` for a cluster."""
    import os
    import re

    if master == "local":
        return 1
    match = re.fullmatch(r"local\[(\*|\d+)(?:,\s*\d+)?\]", master)
    if match:
        return os.cpu_count() or 1 if match.group(1) == "*" else int(match.group(1))
    match = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", master)
    if match:
        return int(match.group(1)) * int(match.group(2))
    return None


def grouped(df: DataFrame, tasks: int) -> DataFrame:
    """``df`` with each row's input partition, joined into at most ``tasks`` tasks (0: as is)."""
    tagged = df.withColumn(INPUT_COLUMN, F.spark_partition_id())
    return tagged.coalesce(tasks) if tasks > 0 else tagged


def regrouped(df: DataFrame, lost: Sequence[Sequence[int]], bucketKeys: Sequence[int]) -> DataFrame:
    """The rows of the lost transactions' inputs, task ``i`` holding exactly ``lost[i]``'s.

    ``bucketKeys[i]`` is a value that Spark's hash partitioning into ``len(lost)`` partitions
    sends to partition ``i`` (``bucketKeysFor``), so ``repartition`` on it places every row of
    ``lost[i]``'s inputs in task ``i``.
    """
    targetOf = {inp: bucketKeys[i] for i, inputs in enumerate(lost) for inp in inputs}
    if not targetOf:
        raise ValueError("a rewrite needs the inputs of at least one lost transaction")
    tagged = df.withColumn(INPUT_COLUMN, F.spark_partition_id())
    kept = tagged.where(F.col(INPUT_COLUMN).isin(sorted(targetOf)))
    pairs: list[Column] = []
    for inp, key in sorted(targetOf.items()):
        pairs += [F.lit(inp), F.lit(key).cast("bigint")]
    target = F.element_at(F.create_map(*pairs), F.col(INPUT_COLUMN))
    return kept.withColumn(TARGET_COLUMN, target).repartition(len(lost), F.col(TARGET_COLUMN))


def bucketKeysFor(spark: Any, partitions: int) -> list[int]:
    """For each partition ``i`` of ``partitions``, a bigint that ``repartition`` sends to ``i``.

    Asked of Spark itself (``pmod(hash(key), n)`` is the partition id of its hash
    partitioning), so the answer is Spark's own, not a copy of its hash function.
    """
    found: dict[int, int] = {}
    limit = 64 * partitions
    while len(found) < partitions:
        rows = (
            spark.range(0, limit)
            .selectExpr("id", f"pmod(hash(id), {partitions}) AS bucket")
            .groupBy("bucket")
            .agg(F.min("id").alias("id"))
            .collect()
        )
        found = {int(r["bucket"]): int(r["id"]) for r in rows}
        limit *= 4
    return [found[i] for i in range(partitions)]


def splitInputs(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, set[int]]:
    """A task's Arrow batch without the grouping columns, and the input partitions it held."""
    names = batch.schema.names
    inputs: set[int] = set()
    if INPUT_COLUMN in names and batch.num_rows:
        inputs = {int(i) for i in pc.unique(batch.column(INPUT_COLUMN)).to_pylist()}
    extra = [n for n in (INPUT_COLUMN, TARGET_COLUMN) if n in names]
    return (batch.drop_columns(extra) if extra else batch), inputs
