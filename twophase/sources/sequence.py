"""The ``twophase.sequence`` stream's rows and offset math: replayable, deterministic, Spark-free.

Row ``i`` is a pure function of its offset: ``id = i`` and ``payload = "row-<i>"``, so any
offset range can be read again and gives the same rows, and a sink's output can be checked
against the range with arithmetic alone. ``twophase.spark.sequence`` serves these rows as the
Spark data source ``twophase.sequence`` (offsets ``{"offset": n}``: rows before n offered).

Options: ``rowsPerBatch`` (admission limit per micro-batch, default 1000), ``totalRows``
(stop offering rows after that many; default: unbounded), ``numPartitions`` (default 2),
``startOffset`` (first id, default 0).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from twophase.settings import TwoPhaseConfigError, intOption

SCHEMA = "id long, payload string"
"""The rows' schema as a Spark DDL string."""

ARROW_SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])
CHUNK_ROWS = 65536
"""Rows per record batch when a range is read."""


def sequenceRows(start: int, end: int) -> pa.RecordBatch:
    """The rows of offsets ``[start, end)`` as one Arrow record batch (vectorised)."""
    ids = pa.array(np.arange(start, end, dtype=np.int64))
    payload = pc.binary_join_element_wise("row-", pc.cast(ids, pa.string()), "")
    return pa.RecordBatch.from_arrays([ids, payload], schema=ARROW_SCHEMA)


def readRange(start: int, end: int) -> Iterator[pa.RecordBatch]:
    """The rows of offsets ``[start, end)`` in record batches of at most ``CHUNK_ROWS`` rows."""
    for chunk in range(start, end, CHUNK_ROWS):
        yield sequenceRows(chunk, min(chunk + CHUNK_ROWS, end))


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


class SequenceOffsets:
    """Where the stream starts, where each micro-batch ends, and how a range splits into tasks.

    Offers ``rowsPerBatch`` rows per micro-batch (or the caller's row limit) until
    ``totalRows``; under ``Trigger.AvailableNow`` everything up to ``totalRows`` at once.
    """

    def __init__(self, settings: SequenceSettings) -> None:
        self.settings = settings
        self.availableNowEnd: int | None = None

    def initial(self) -> int:
        """The first offset of a new query."""
        return self.settings.startOffset

    def prepareAvailableNow(self) -> None:
        """Trigger.AvailableNow: everything up to ``totalRows`` (or one batch if unbounded)."""
        self.availableNowEnd = self.settings.endOffset

    def batchEnd(self, begin: int, maxRows: int | None = None, readAll: bool = False) -> int:
        """The end offset of the batch starting at ``begin``, never past ``totalRows``.

        ``readAll``: the caller takes all that is available; else ``maxRows`` rows (default
        ``rowsPerBatch``).
        """
        if readAll:
            end = (
                self.availableNowEnd
                or self.settings.endOffset
                or begin + self.settings.rowsPerBatch
            )
        elif maxRows is not None:
            end = begin + maxRows
        else:
            end = begin + self.settings.rowsPerBatch
        for cap in (self.settings.endOffset, self.availableNowEnd):
            if cap is not None:
                end = min(end, cap)
        return max(begin, end)

    def split(self, first: int, last: int) -> list[tuple[int, int]]:
        """``[first, last)`` as at most ``numPartitions`` contiguous ``(start, end)`` ranges."""
        if last <= first:
            return []
        parts = min(self.settings.numPartitions, last - first)
        bounds = np.linspace(first, last, parts + 1, dtype=np.int64)
        return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


__all__ = [
    "ARROW_SCHEMA",
    "CHUNK_ROWS",
    "SCHEMA",
    "SequenceOffsets",
    "SequenceSettings",
    "readRange",
    "sequenceRows",
]
