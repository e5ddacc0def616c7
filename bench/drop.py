"""The floor's Python ends: a data source and a ``mapInArrow`` function that drop their rows.

Kept in a module of their own that imports little: Spark's Python workers import the module a
pickled function or class comes from, and a floor that pulled in the benches' heavy imports
(database drivers, S3 clients) would charge that start-up to PySpark. Both freeze the worker's
heap at entry, as twophase's tasks do, so the floor is PySpark's cost and not a naive task's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from twophase.spark.worker import freezeWorkerHeap


class DropWriter(DataSourceStreamArrowWriter):
    """A Python stream writer that reads its input and writes nothing: PySpark's floor."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        freezeWorkerHeap()
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        freezeWorkerHeap()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        freezeWorkerHeap()


class DropSink(DataSource):
    """``bench.drop``: a Python sink that reads its input and drops it."""

    @classmethod
    def name(cls) -> str:
        return "bench.drop"

    def streamWriter(self, schema: Any, overwrite: bool) -> DropWriter:
        freezeWorkerHeap()
        return DropWriter()


def dropRows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` function that counts its rows and drops them: one ``rows`` row out."""
    freezeWorkerHeap()
    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]})
