"""What a sink under test is, and how its committed output is read and checked exactly once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

FILES_SINK = "twophase.spark.files:FilesSink"


@dataclass(frozen=True)
class SinkUnderTest:
    """A sink as the tests see it: how the child loads it, how a reader sees its output.

    ``read(output)`` returns the committed rows (``id``, ``payload``) as a reader that skips
    uncommitted data would; ``visibleFiles(output)`` lists committed data files;
    ``prepared(output, batch)`` lists what uncommitted transactions left on disk (one entry per
    attempt: a staging directory, a pending file), of one batch or, for ``None``, anything.
    """

    id: str
    spec: str
    read: Callable[[Path], pa.Table]
    visibleFiles: Callable[[Path], list[Path]]
    prepared: Callable[[Path, int | None], list[Path]]

    def __str__(self) -> str:
        return self.id


STAGING = ("_twophase", "staging")


def readFilesOutput(output: Path) -> pa.Table:
    """Committed Parquet rows of the files sink; pyarrow skips ``_``- and ``.``-prefixed paths."""
    files = filesVisible(output)
    if not files:
        return pa.table({"id": pa.array([], pa.int64()), "payload": pa.array([], pa.string())})
    return ds.dataset([str(f) for f in files], format="parquet").to_table(columns=["id", "payload"])


def filesVisible(output: Path) -> list[Path]:
    if not output.exists():
        return []
    return sorted(Path(f) for f in ds.dataset(str(output), format="parquet").files)


def filesPrepared(output: Path, batch: int | None = None) -> list[Path]:
    """Attempt directories under ``_twophase/staging/<sink>/<batch>/``; for ``batch=None``
    everything below the per-sink directories (batch directories and stray files too)."""
    staging = output.joinpath(*STAGING)
    if not staging.exists():
        return []
    if batch is not None:
        return sorted(staging.glob(f"*/{batch}/*"))
    return sorted(staging.glob("*/*")) + sorted(p for p in staging.glob("*") if p.is_file())


FILES = SinkUnderTest("files", FILES_SINK, readFilesOutput, filesVisible, filesPrepared)


def exactlyOnceReport(table: pa.Table, rows: int) -> dict[str, int]:
    """Rows, duplicates, missing ids, unexpected ids and wrong payloads against ``[0, rows)``."""
    ids = table.column("id").to_numpy() if len(table) else np.array([], dtype=np.int64)
    unique = np.unique(ids)
    expected = np.arange(rows, dtype=np.int64)
    wrong = 0
    if len(table):
        want = pc.binary_join_element_wise("row-", pc.cast(table.column("id"), pa.string()), "")
        wrong = len(table) - int(pc.sum(pc.equal(table.column("payload"), want)).as_py() or 0)
    return {
        "rows": len(table),
        "duplicates": len(ids) - len(unique),
        "missing": len(np.setdiff1d(expected, unique, assume_unique=True)),
        "unexpected": len(np.setdiff1d(unique, expected, assume_unique=True)),
        "wrongPayloads": wrong,
    }


def visibleIds(sink: SinkUnderTest, output: Path) -> np.ndarray:
    table = sink.read(output)
    return np.sort(table.column("id").to_numpy()) if len(table) else np.array([], np.int64)
