"""``twophase.sequence``: a replayable, deterministic stream for demos, benchmarks and proofs.

Row ``i`` is a pure function of its offset: ``id = i`` and ``payload = "row-<i>"``, so any
offset range can be read again and gives the same rows, and a sink's output can be checked
against the range with arithmetic alone. Offsets are ``{"offset": n}`` (rows before n offered).

Options: ``rowsPerBatch`` (admission limit per micro-batch, default 1000), ``totalRows``
(stop offering rows after that many; default: unbounded), ``numPartitions`` (default 2),
``startOffset`` (first id, default 0).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from twophase.settings import TwoPhaseConfigError, intOption
from twophase.worker_gc import freezeWorkerHeap

SCHEMA = "id long, payload string"
ARROW_SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])
CHUNK_ROWS = 65536


def sequenceRows(start: int, end: int) -> pa.RecordBatch:
    """The rows of offsets ``[start, end)`` as one Arrow record batch (vectorised)."""
    ids = pa.array(np.arange(start, end, dtype=np.int64))
    payload = pc.binary_join_element_wise("row-", pc.cast(ids, pa.string()), "")
    return pa.RecordBatch.from_arrays([ids, payload], schema=ARROW_SCHEMA)


@dataclass(frozen=True)
class SequenceSettings:
    """The sequence source's options, validated once."""

    rowsPerBatch: int
    totalRows: int | None
    numPartitions: int
    startOffset: int

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> SequenceSettings:
        total = intOption(options, "totalRows", -1)
        if total < -1:
            raise TwoPhaseConfigError(f"option totalRows={total} must be 0 or more")
        return cls(
            rowsPerBatch=intOption(options, "rowsPerBatch", 1000, minimum=1),
            totalRows=None if total == -1 else total,
            numPartitions=intOption(options, "numPartitions", 2, minimum=1),
            startOffset=intOption(options, "startOffset", 0, minimum=0),
        )

    @property
    def endOffset(self) -> int | None:
        return None if self.totalRows is None else self.startOffset + self.totalRows


@dataclass(frozen=True)
class SequenceRange(InputPartition):
    """The offsets ``[start, end)`` one task reads."""

    start: int
    end: int


class SequenceSource(DataSource):
    """Deterministic rows as a stream: ``spark.readStream.format("twophase.sequence")``."""

    @classmethod
    def name(cls) -> str:
        return "twophase.sequence"

    def schema(self) -> str:
        freezeWorkerHeap()
        return SCHEMA

    def streamReader(self, schema: StructType) -> SequenceReader:
        freezeWorkerHeap()
        return SequenceReader(SequenceSettings.fromOptions(self.options))


class SequenceReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offers ``rowsPerBatch`` rows per micro-batch until ``totalRows``; replayable by range."""

    def __init__(self, settings: SequenceSettings) -> None:
        self.settings = settings
        self.availableNowEnd: int | None = None

    def initialOffset(self) -> dict[str, int]:
        return {"offset": self.settings.startOffset}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.settings.rowsPerBatch)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: everything up to ``totalRows`` (or one batch if unbounded)."""
        self.availableNowEnd = self.settings.endOffset

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        begin = int(start["offset"])
        if isinstance(limit, ReadAllAvailable):
            end = (
                self.availableNowEnd
                or self.settings.endOffset
                or begin + self.settings.rowsPerBatch
            )
        elif isinstance(limit, ReadMaxRows):
            end = begin + limit.max_rows
        else:
            end = begin + self.settings.rowsPerBatch
        for cap in (self.settings.endOffset, self.availableNowEnd):
            if cap is not None:
                end = min(end, cap)
        return {"offset": max(begin, end)}

    def reportLatestOffset(self) -> dict[str, int] | None:
        end = self.settings.endOffset
        return None if end is None else {"offset": end}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[SequenceRange]:
        first, last = int(start["offset"]), int(end["offset"])
        if last <= first:
            return []
        parts = min(self.settings.numPartitions, last - first)
        bounds = np.linspace(first, last, parts + 1, dtype=np.int64)
        return [SequenceRange(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SequenceRange)
        freezeWorkerHeap()
        for chunk in range(partition.start, partition.end, CHUNK_ROWS):
            yield sequenceRows(chunk, min(chunk + CHUNK_ROWS, partition.end))

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the sequence keeps no state."""
