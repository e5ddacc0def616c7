"""The table-format benches' growth measurement: a committer driven without Spark, its log.

``--log-growth`` of ``bench.delta`` and ``bench.iceberg`` commits one tiny Parquet file per
micro-batch through the format's committer for thousands of micro-batches, then reports how the
commit time and the table's log grew and how long opening the table takes at the end.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bench._common import fmtNumber, markdownTable, percentiles, ratio
from bench.session import log

if TYPE_CHECKING:
    from bench.tableformats import TableFormat

GROWTH_WINDOW = 100
"""Commits compared at the start and at the end of ``--log-growth``."""

T = TypeVar("T")


@dataclass(frozen=True)
class LogTerms:
    """How a format's growth report names its committer, its log and its commit count."""

    committer: str
    """The committer class driven directly, e.g. ``DeltaCommitter``."""
    logDir: str
    """The directory whose files are counted, e.g. ``_delta_log``."""
    openCall: str
    """What opening the table is, e.g. ``DeltaTable(path)``."""
    commitsAt: str
    """The table's commits in the report's last line, ``{}`` the count: ``at version {}``."""
    commitsWrong: str
    """The same when the count is wrong: ``version {}``."""


@dataclass
class Growth:
    """What one Spark-free growth run saw: commit seconds in order, the log's files, the open
    time, what the table holds, and the format's own findings."""

    batches: int
    rowsPerFile: int
    seconds: list[float] = field(default_factory=list)
    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Files of the log by kind: (count, bytes)."""
    openSeconds: float = float("nan")
    openAgainSeconds: float = float("nan")
    held: int = 0
    commits: int = 0
    """Commits that added rows (Delta: the version; Iceberg: the snapshots)."""
    keptCommits: int | None = None
    """The commits the table keeps by its own expiry (Iceberg's ``retainSnapshots``), when
    fewer than ``batches`` are expected to remain; ``None``: every one."""
    notes: list[str] = field(default_factory=list)
    """Markdown paragraphs after the files table."""
    after: list[str] = field(default_factory=list)
    """Markdown paragraphs after the open time: maintenance and what it changed."""
    afterWrong: list[str] = field(default_factory=list)
    """What the table got wrong after that maintenance, for ``check``."""

    def check(self, terms: LogTerms) -> str:
        wrong = []
        if self.held != self.batches * self.rowsPerFile:
            wrong.append(f"{self.held:,} rows, not {self.batches * self.rowsPerFile:,}")
        expected = self.batches if self.keptCommits is None else self.keptCommits
        if self.commits != expected:
            wrong.append(f"{terms.commitsWrong.format(self.commits)}, not {expected}")
        wrong.extend(self.afterWrong)
        return "WRONG COUNT: " + "; ".join(wrong) if wrong else "ok"


def timed(call: Callable[[], T]) -> tuple[T, float]:
    """``call()``'s result and the seconds it took."""
    started = time.perf_counter()
    result = call()
    return result, time.perf_counter() - started


def driveCommits(
    fmt: TableFormat,
    batches: int,
    rowsPerFile: int,
    directory: Path,
    root: str,
    files: Any,
    complete: Callable[[str, int, list[Any]], None],
) -> list[float]:
    """``complete`` (a committer's ``completeBatch``) for ``batches`` micro-batches, each one
    tiny Parquet file written at its final name in ``directory`` first (as the files sink's
    ``commit`` leaves a task's file; its handle rooted at ``root``); the seconds of each
    commit, file writes excluded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from twophase.protocol import TransactionContext
    from twophase.sinks.files.handles import StagedFile, preparedHandle
    from twophase.sinks.files.layout import (
        attemptName,
        finalFileName,
        sinkStagingDir,
        stagedFileName,
    )

    sinkId = growthSinkId(fmt)
    schema = growthSchema()
    seconds = []
    for batchId in range(batches):
        ctx = TransactionContext(sinkId, f"bench-{fmt.name}", batchId, 0, 0)
        staging = f"{sinkStagingDir(sinkId)}/{attemptName(batchId, '', 0, 0)}"
        final = finalFileName(sinkId, batchId, 0, 0, files.extension)
        ids = range(batchId * rowsPerFile, (batchId + 1) * rowsPerFile)
        rows = pa.table({"id": list(ids), "payload": [f"row-{i}" for i in ids]}, schema=schema)
        pq.write_table(rows, directory / final, compression=files.compression)
        staged = StagedFile(stagedFileName(staging, 0), final, rowsPerFile)
        handle = preparedHandle(ctx, root, files.staging, staging, [staged])
        started = time.perf_counter()
        complete(sinkId, batchId, [handle])
        seconds.append(time.perf_counter() - started)
        if (batchId + 1) % 1000 == 0:
            log(f"  {batchId + 1:,} commits, the last in {seconds[-1] * 1000:.1f} ms")
    return seconds


def growthSinkId(fmt: TableFormat) -> str:
    """The sink id ``driveCommits`` commits under."""
    return f"bench-{fmt.name}-growth"


def growthSchema() -> Any:
    """The growth tables' columns: ``id`` and ``payload``."""
    import pyarrow as pa

    return pa.schema([("id", pa.int64()), ("payload", pa.string())])


def filesByKind(directory: Path, kind: Callable[[str], str]) -> dict[str, tuple[int, int]]:
    """Every file under ``directory`` by ``kind(name)``: (count, bytes)."""
    found: dict[str, tuple[int, int]] = {}
    for entry in sorted(directory.rglob("*")):
        if entry.is_file():
            count, size = found.get(kind(entry.name), (0, 0))
            found[kind(entry.name)] = (count + 1, size + entry.stat().st_size)
    return found


def filesTable(files: dict[str, tuple[int, int]]) -> str:
    """Files by kind as a Markdown table, with their sum."""
    rows = [
        [kind, fmtNumber(count), fmtNumber(size)] for kind, (count, size) in sorted(files.items())
    ]
    total = sum(count for count, _ in files.values())
    totalBytes = sum(size for _, size in files.values())
    rows.append(["all", fmtNumber(total), fmtNumber(totalBytes)])
    return markdownTable(["files", "count", "bytes"], rows)


def growthReport(terms: LogTerms, growth: Growth) -> str:
    """``--log-growth``'s findings as Markdown."""
    window = min(GROWTH_WINDOW, len(growth.seconds))
    first, last = growth.seconds[:window], growth.seconds[-window:]
    rows = [
        [f"first {window}", *(fmtNumber(s * 1000, 1) for s in percentiles(first)),
         fmtNumber(statistics.fmean(first) * 1000, 1)],
        [f"last {window}", *(fmtNumber(s * 1000, 1) for s in percentiles(last)),
         fmtNumber(statistics.fmean(last) * 1000, 1)],
        [f"all {len(growth.seconds)}", *(fmtNumber(s * 1000, 1) for s in
         percentiles(growth.seconds)), fmtNumber(statistics.fmean(growth.seconds) * 1000, 1)],
    ]  # fmt: skip
    slower = ratio(statistics.median(last), statistics.median(first))
    notes = "".join(f"\n\n{note}" for note in growth.notes)
    after = "".join(f"\n{note}\n" for note in growth.after)
    return (
        f"`{terms.committer}.completeBatch` driven directly (no Spark) for {growth.batches:,} "
        f"micro-batches of one {growth.rowsPerFile}-row Parquet file each.\n\n"
        "Commit time per micro-batch (ms):\n\n"
        + markdownTable(["commits", "p50", "p95", "max", "mean"], rows)
        + f"\n\nMedian commit time, last {window} over first {window}: {slower:.2f}\n\n"
        f"`{terms.logDir}` at the end:\n\n" + filesTable(growth.files) + f"{notes}\n\n"
        f"`{terms.openCall}` at the end: {growth.openSeconds * 1000:.1f} ms, "
        f"{growth.openAgainSeconds * 1000:.1f} ms the second time; the table holds "
        f"{growth.held:,} rows {terms.commitsAt.format(f'{growth.commits:,}')}: "
        f"{growth.check(terms)}\n{after}"
    )
