"""``make bench-delta``: twophase.delta against ``write_deltalake`` in foreachBatch, Spark's
Parquet sink and Spark's noop sink, plus how the Delta log grows under one commit per batch.

The same rows (``id`` and a padded ``payload``), batches and write tasks go, in one Spark
session (``local[*]``), to

(t) ``twophase.delta`` (option ``path``): exactly once, one Delta commit per micro-batch;
(f) the same sink through ``twophase.foreachBatch("twophase.delta", ...)``, which writes with
    one task per task slot whatever the batch's partitions;
(w) what users write today: ``foreachBatch`` calling ``deltalake.write_deltalake(path,
    batch_df.toArrow(), mode="append")``, at least once (a driver that dies between the write
    and Spark's commit log appends the batch again on restart);
(p) Spark's ``parquet`` file sink: the engine's own file path, no table;
(n) Spark's ``noop`` sink: the engine's ceiling for the same query.

Shapes: a JVM source (``rate-micro-batch``) at 8 and at 200 partitions, run with a
``processingTime`` trigger until ``rows / rowsPerBatch`` micro-batches finished (it has no
``availableNow``; its rows are filtered to ``id < rows``, so the micro-batches a stop cuts
short are empty and every table holds exactly ``rows``), and the Python ``twophase.sequence``
source at 200 partitions with ``trigger(availableNow=True)``. Every path is warmed up once on a
small run first. For each shape and path: seconds per micro-batch (Spark's
``triggerExecution`` of every micro-batch with rows) p50, p95 and max, and rows/s over their
sum; then (t)/(w), (f)/(w), (t)/(p) and (t)/(n) as rates (above 1: twophase is faster).
After each run the Delta tables must hold exactly ``rows`` rows and (t), (f) exactly one commit
per micro-batch with rows (``WRONG COUNT`` otherwise).

``--log-growth N`` (Spark-free): ``DeltaCommitter.completeBatch`` driven directly for N
micro-batches of one tiny Parquet file each; the size of ``_delta_log`` after them (JSON
commits and the checkpoints delta-rs writes on its own), the commit time of the last 100
against the first 100, and how long opening the table takes at the end.

Writes ``bench/results/delta.md`` and prints it. Local disk only: no service is needed.
What is Delta's is here; the runner is ``bench.tableformats``, shared with ``bench.iceberg``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench._common import fmtNumber
from bench.tableformats import TableFormat
from bench.tableformats import main as runBench
from bench.tablegrowth import (
    Growth,
    LogTerms,
    driveCommits,
    filesByKind,
    growthSchema,
    timed,
)


def options(work: Path, label: str) -> dict[str, str]:
    """``twophase.delta``'s options for run ``label``: a table directory of its own."""
    return {"path": str(work / f"{label}-out")}


def appendWithWriteDeltalake(options: Mapping[str, str]) -> Callable[[Any, int], None]:
    """The ``foreachBatch`` function users write today: each batch appended by delta-rs from
    the driver, with no record of which batches the table holds (at least once)."""
    table = options["path"]

    def append(batch: Any, batchId: int) -> None:
        import deltalake

        data = batch.toArrow() if hasattr(batch, "toArrow") else batch.toPandas()
        if len(data):
            deltalake.write_deltalake(table, data, mode="append")

    return append


def countTable(options: Mapping[str, str], createdEmpty: bool) -> tuple[int, int]:
    """Rows the table holds and its commits that added rows: after the creation commit when
    the sink created it empty, all of them otherwise (the first write creates it)."""
    import deltalake

    table = deltalake.DeltaTable(options["path"])
    held = int(table.to_pyarrow_dataset().count_rows())
    return held, table.version() if createdEmpty else table.version() + 1


def logKind(name: str) -> str:
    """The kind of a file of ``_delta_log``, by its name."""
    if name.endswith(".checkpoint.parquet") or ".checkpoint." in name:
        return "checkpoint parquet"
    if name.endswith(".json"):
        return "JSON commits"
    if name == "_last_checkpoint":
        return "_last_checkpoint"
    if name.endswith(".crc"):
        return "crc"
    return "other"


def logGrowth(batches: int, work: Path, rowsPerFile: int = 10) -> list[tuple[str, Growth]]:
    """Drive ``DeltaCommitter.completeBatch`` for ``batches`` micro-batches, each one tiny
    Parquet file written into the table's directory beside it (as ``commit`` leaves a task's
    file), and time each commit; then the log's files and the table's open time."""
    import deltalake

    from twophase.sinks.delta import DeltaCommitter, ensureTable

    table = work / "growth" / "table"
    ensureTable(str(table), growthSchema(), None, True)
    committer = DeltaCommitter.fromOptions({"path": str(table)})
    growth = Growth(batches, rowsPerFile)
    growth.seconds = driveCommits(
        DELTA,
        batches,
        rowsPerFile,
        table,
        str(table),
        committer.settings.files,
        committer.completeBatch,
    )
    growth.files = filesByKind(table / "_delta_log", logKind)
    checkpoints: dict[int, int] = {}
    for entry in (table / "_delta_log").rglob("*"):
        if entry.is_file() and logKind(entry.name) == "checkpoint parquet":
            version = int(entry.name.split(".")[0])
            checkpoints[version] = checkpoints.get(version, 0) + entry.stat().st_size
    growth.notes.append(
        f"Checkpoints delta-rs wrote on its own: {checkpointsLine(checkpoints, growth.seconds)}"
    )
    opened, growth.openSeconds = timed(lambda: deltalake.DeltaTable(str(table)))
    _, growth.openAgainSeconds = timed(lambda: deltalake.DeltaTable(str(table)))
    growth.held = int(opened.to_pyarrow_dataset().count_rows())
    growth.commits = int(opened.version())
    return [("The Delta log under one commit per micro-batch", growth)]


def checkpointsLine(checkpoints: dict[int, int], seconds: list[float]) -> str:
    """The checkpoints delta-rs wrote (bytes by the version they hold), and the median commit
    time of the commits that wrote one against the others'."""
    versions = sorted(checkpoints)
    if not versions:
        return "none"
    # Batch b is version b + 1 (the creation is version 0): its commit time is seconds[b].
    withCheckpoint = [seconds[v - 1] for v in versions if 0 < v <= len(seconds)]
    others = [s for v, s in enumerate(seconds, start=1) if v not in checkpoints]
    return (
        f"{len(versions)}, at versions {', '.join(str(v) for v in versions[:5])}"
        f"{' ...' if len(versions) > 5 else ''}; the last (version {versions[-1]:,}) "
        f"{fmtNumber(checkpoints[versions[-1]])} bytes. Median commit time of the "
        f"commits that wrote one: {fmtNumber(statistics.median(withCheckpoint) * 1000, 1)} "
        f"ms, of the others: {fmtNumber(statistics.median(others) * 1000, 1)} ms"
    )


DELTA = TableFormat(
    name="delta",
    title="twophase.delta against write_deltalake, Spark's Parquet and noop sinks",
    atLeastOnce="write_deltalake in foreachBatch (at least once)",
    pathsNote="(w) is at least once: a driver that dies after `write_deltalake` and before "
    "Spark's commit log appends the batch again on restart; (t) records each batch in the "
    "table's log (txn `twophase-<sinkId>`, version = batch id) in the same commit as its files.",
    options=options,
    appendBatch=appendWithWriteDeltalake,
    count=countTable,
    growth=logGrowth,
    terms=LogTerms(
        committer="DeltaCommitter",
        logDir="_delta_log",
        openCall="DeltaTable(path)",
        commitsAt="at version {}",
        commitsWrong="version {}",
    ),
)


def main(argv: list[str] | None = None) -> int:
    return runBench(DELTA, argv, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
