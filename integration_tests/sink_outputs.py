"""What a sink under test is, and how its committed output is read and checked exactly once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from twophase.sinks.files import defaultStagingPath
from twophase.sinks.files.layout import AttemptName, attemptOfStagedFile

FILES_SINK = "twophase.spark.declared:FilesSink"


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


LEGACY_STAGING = ("_twophase", "staging")
"""Where earlier releases staged, inside the output path."""


def filesStaging(output: Path) -> Path:
    """The files sink's default staging path for ``output``: beside it, outside it."""
    return Path(defaultStagingPath(str(output)))


def readFilesOutput(output: Path) -> pa.Table:
    """Rows of every Parquet file below the output, hidden directories included (as DuckDB's
    and polars' ``**/*.parquet`` globs read them): a staged file there would count."""
    files = filesVisible(output)
    if not files:
        return pa.table({"id": pa.array([], pa.int64()), "payload": pa.array([], pa.string())})
    return ds.dataset([str(f) for f in files], format="parquet").to_table(columns=["id", "payload"])


def filesVisible(output: Path) -> list[Path]:
    """Every ``*.parquet`` file below the output, ``_``- and ``.``-prefixed directories too."""
    if not output.exists():
        return []
    return sorted(output.rglob("*.parquet"))


def filesPrepared(output: Path, batch: int | None = None) -> list[Path]:
    """One entry per staged attempt of ``batch`` (``None``: any batch, and stray files too):
    ``<staging path>/<sink>/<attempt name>`` (the prefix of its staged files), and the
    earlier layout's ``<output>/_twophase/staging/<sink>/<batch>/<attempt dir>``."""
    found: set[Path] = set()
    staging = filesStaging(output)
    if staging.exists():
        for file in staging.glob("*/*"):
            attempt = attemptOfStagedFile(file.name)
            parsed = AttemptName.parse(attempt) if attempt else None
            if parsed is None:
                if batch is None:
                    found.add(file)
            elif batch is None or parsed.batchId == batch:
                found.add(file.parent / str(attempt))
    legacy = output.joinpath(*LEGACY_STAGING)
    if legacy.exists():
        if batch is not None:
            found.update(legacy.glob(f"*/{batch}/*"))
        else:
            found.update(legacy.glob("*/*"))
            found.update(p for p in legacy.glob("*") if p.is_file())
    return sorted(found)


def filesStagedOf(output: Path, staging: str) -> list[Path]:
    """The files still staged for one attempt: ``staging`` is its handle's (or open
    transaction's) ``staging`` value, relative to the default staging path of ``output``."""
    base = filesStaging(output)
    if (base / staging).is_dir():  # the earlier layout: a directory per attempt
        return sorted(p for p in (base / staging).rglob("*") if p.is_file())
    return sorted(base.glob(f"{staging}-f*.staged"))


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
