"""``twophase.sequence`` as a Spark streaming source: the deterministic rows, bound to PySpark.

The rows and the offset math live in :mod:`twophase.sources.sequence`; this module translates
Spark's offsets (``{"offset": n}``), read limits and input partitions to and from them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.types import StructType

from twophase.sources.sequence import SCHEMA, SequenceOffsets, SequenceSettings, readRange
from twophase.spark import versions
from twophase.spark.coded import codedErrors
from twophase.spark.worker import freezeWorkerHeap


@dataclass(frozen=True)
class SequenceRange(versions.InputPartition):
    """The offsets ``[start, end)`` one task reads."""

    start: int
    end: int


class SequenceSource(versions.DataSource):
    """Deterministic rows as a stream: ``spark.readStream.format("twophase.sequence")``."""

    @classmethod
    def name(cls) -> str:
        return "twophase.sequence"

    def schema(self) -> str:
        freezeWorkerHeap()
        return SCHEMA

    @codedErrors()
    def streamReader(self, schema: StructType) -> SequenceReader:
        freezeWorkerHeap()
        versions.requireStreamingSources(self.name())
        return SequenceReader(SequenceSettings.fromOptions(self.options))


class SequenceReader(versions.DataSourceStreamReader, versions.SupportsTriggerAvailableNow):
    """Offers ``rowsPerBatch`` rows per micro-batch until ``totalRows``; replayable by range."""

    def __init__(self, settings: SequenceSettings) -> None:
        self.settings = settings
        self.offsets = SequenceOffsets(settings)

    def initialOffset(self) -> dict[str, int]:
        return {"offset": self.offsets.initial()}

    def getDefaultReadLimit(self) -> versions.ReadLimit:
        return versions.ReadMaxRows(self.settings.rowsPerBatch)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: everything up to ``totalRows`` (or one batch if unbounded)."""
        self.offsets.prepareAvailableNow()

    def latestOffset(self, start: dict[str, int], limit: versions.ReadLimit) -> dict[str, int]:
        begin = int(start["offset"])
        if isinstance(limit, versions.ReadAllAvailable):
            end = self.offsets.batchEnd(begin, readAll=True)
        elif isinstance(limit, versions.ReadMaxRows):
            end = self.offsets.batchEnd(begin, maxRows=limit.max_rows)
        else:
            end = self.offsets.batchEnd(begin)
        return {"offset": end}

    def reportLatestOffset(self) -> dict[str, int] | None:
        end = self.settings.endOffset
        return None if end is None else {"offset": end}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[SequenceRange]:
        ranges = self.offsets.split(int(start["offset"]), int(end["offset"]))
        return [SequenceRange(a, b) for a, b in ranges]

    def read(self, partition: versions.InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SequenceRange)
        freezeWorkerHeap()
        yield from readRange(partition.start, partition.end)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the sequence keeps no state."""


__all__ = ["SequenceRange", "SequenceReader", "SequenceSource"]
