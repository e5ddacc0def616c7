"""Spark's own dates of a query's batches: when it planned each (``offsets/N``), when it ended it.

Spark writes ``offsets/N`` when it plans batch N, before any of the sink's work, and
``commits/N`` when the batch is over, after the sink's commit; their modification times (as the
checkpoint's store dates them) bound the whole batch, whatever happened in between: the
sink's planning and the recovery before the batch, every task attempt, failed ones included,
the decision and the commit. ``twophase status`` holds them beside the decision log's own
figures to say where a slow batch's time went. Spark keeps the newest of these files only
(``spark.sql.streaming.minBatchesToRetain``): an older batch has no dates here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import fsspec.core

from twophase.coordinator.storage import modifiedAt


@dataclass(frozen=True)
class SparkBatch:
    """When Spark planned batch N and when it marked it done; ``None`` where it has no file."""

    plannedAt: datetime | None = None
    endedAt: datetime | None = None

    @property
    def seconds(self) -> float | None:
        """The whole batch as Spark dates it: ``offsets/N`` to ``commits/N``."""
        if self.plannedAt is None or self.endedAt is None:
            return None
        return max(0.0, (self.endedAt - self.plannedAt).total_seconds())


def sparkBatches(checkpoint: str) -> dict[int, SparkBatch]:
    """Every batch of ``offsets/`` and ``commits/`` under the checkpoint, with its dates (two
    listings; an unreadable checkpoint gives none)."""
    try:
        fs, root = fsspec.core.url_to_fs(checkpoint)
    except (OSError, ValueError, ImportError):
        return {}
    base = root.rstrip("/")
    planned = _dated(fs, f"{base}/offsets")
    ended = _dated(fs, f"{base}/commits")
    return {
        batchId: SparkBatch(planned.get(batchId), ended.get(batchId))
        for batchId in sorted(planned.keys() | ended.keys())
    }


def _dated(fs: Any, path: str) -> dict[int, datetime | None]:
    try:
        listed = fs.ls(path, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except OSError:
        return {}
    found: dict[int, datetime | None] = {}
    for entry in listed:
        if not isinstance(entry, Mapping):
            continue
        name = str(entry.get("name", "")).rstrip("/").rsplit("/", 1)[-1]
        if name.isdigit():
            found[int(name)] = modifiedAt(entry)
    return found


__all__ = ["SparkBatch", "sparkBatches"]
