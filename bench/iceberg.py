"""``make bench-iceberg``: twophase.iceberg against pyiceberg's ``table.append`` in foreachBatch,
Spark's Parquet sink and Spark's noop sink, plus how an Iceberg table's metadata grows under
one snapshot per batch.

The same rows (``id`` and a padded ``payload``), batches and write tasks go, in one Spark
session (``local[*]``), to

(t) ``twophase.iceberg`` (options ``table``, ``catalog.*``): exactly once, one snapshot per
    micro-batch;
(f) the same sink through ``twophase.foreachBatch("twophase.iceberg", ...)``, which writes with
    one task per task slot whatever the batch's partitions;
(w) what users write today: ``foreachBatch`` calling pyiceberg's
    ``table.append(batch_df.toArrow())`` on a table it creates from the first batch, at least
    once (a driver that dies between the append and Spark's commit log appends the batch again
    on restart);
(p) Spark's ``parquet`` file sink: the engine's own file path, no table;
(n) Spark's ``noop`` sink: the engine's ceiling for the same query.

Every table is ``bench.<run>`` in a SQL catalog on SQLite with a local warehouse, both under
the bench's temporary directory. Shapes, timings, ratios and checks are those of
``bench.delta``: a JVM source (``rate-micro-batch``) at 8 and at 200 partitions and the Python
``twophase.sequence`` source at 200, each path warmed up once first; seconds per micro-batch
(Spark's ``triggerExecution``) p50, p95 and max, rows/s, then (t)/(w), (f)/(w), (t)/(p) and
(t)/(n). After each run the tables must hold exactly ``rows`` rows and (t), (f) exactly one
snapshot per micro-batch with rows (``WRONG COUNT`` otherwise).

``--log-growth N`` (Spark-free): ``IcebergCommitter.completeBatch`` driven directly for N
micro-batches of one tiny Parquet file each in the table's ``data`` directory; the files of its
``metadata`` directory by kind (``metadata.json``, manifest lists ``snap-*.avro``, manifests),
the commit time of the last 100 against the first 100 and how long ``load_table`` takes at the
end; then every snapshot but the last 100 expired and the metadata after. Three times: with
pyiceberg's defaults (fast appends, every metadata file kept), as the sink creates the table
(merged manifests, old metadata files deleted) and with option ``retainSnapshots=100``. N is
1,000 by default (300 with ``--quick``), not Delta's 10,000: each commit writes a
``metadata.json`` listing every snapshot the table keeps, so unexpired growth is quadratic in
disk and time.

Writes ``bench/results/iceberg.md`` and prints it. Local disk only: no service is needed.
What is Iceberg's is here; the runner is ``bench.tableformats``, shared with ``bench.delta``.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from bench._common import fmtNumber
from bench.session import log
from bench.tableformats import TableFormat
from bench.tableformats import main as runBench
from bench.tablegrowth import (
    Growth,
    LogTerms,
    driveCommits,
    filesByKind,
    filesTable,
    growthSchema,
    growthSinkId,
    timed,
)

KEEP_SNAPSHOTS = 100
"""Snapshots the growth measurement's expiry keeps."""

PYICEBERG_DEFAULTS = {
    "commit.manifest-merge.enabled": "false",
    "write.metadata.delete-after-commit.enabled": "false",
}
"""Table properties that undo what the sink sets or assumes (merged manifests, old metadata
files deleted): pyiceberg's own defaults, for comparison."""

VARIANTS: tuple[tuple[str, dict[str, str], dict[str, str]], ...] = (
    ("with pyiceberg's defaults (fast appends, every metadata file kept)", PYICEBERG_DEFAULTS, {}),
    ("as the sink creates the table (merged manifests, old metadata files deleted)", {}, {}),
    ("the same with option `retainSnapshots=100`", {}, {"retainSnapshots": "100"}),
)
"""Each growth run: its heading, the table properties set first and the sink's options."""


def catalogOptions(work: Path) -> dict[str, str]:
    """A SQL catalog on SQLite under ``work``, its warehouse beside it."""
    return {
        "catalog.type": "sql",
        "catalog.uri": f"sqlite:///{work}/catalog.db",
        "catalog.warehouse": f"file://{work}/warehouse",
    }


def options(work: Path, label: str) -> dict[str, str]:
    """``twophase.iceberg``'s options for run ``label``: a table of its own, ``bench.<label>``
    (``[a-z0-9_]`` only), in the catalog under ``work``."""
    return {"table": f"bench.{re.sub(r'[^a-z0-9_]', '_', label.lower())}", **catalogOptions(work)}


def openCatalog(options: Mapping[str, str]) -> tuple[Any, str]:
    """The catalog and the table name those options name, as the sink reads them."""
    from twophase.sinks.iceberg import IcebergSettings, loadCatalog

    settings = IcebergSettings.fromOptions(options)
    return loadCatalog(settings.catalogName, settings.catalog), settings.table


def appendWithPyiceberg(options: Mapping[str, str]) -> Callable[[Any, int], None]:
    """The ``foreachBatch`` function users write today: each batch appended by pyiceberg from
    the driver (the table created from the first batch's schema), with no record of which
    batches the table holds (at least once)."""
    opened: list[Any] = []

    def append(batch: Any, batchId: int) -> None:
        import pyarrow as pa

        if hasattr(batch, "toArrow"):
            data = batch.toArrow()
        else:
            data = pa.Table.from_pandas(batch.toPandas(), preserve_index=False)
        if not len(data):
            return
        if not opened:
            catalog, name = openCatalog(options)
            catalog.create_namespace_if_not_exists(name.rsplit(".", 1)[0])
            opened.append(catalog.create_table_if_not_exists(name, schema=data.schema))
        opened[0].append(data)

    return append


def heldRows(table: Any) -> int:
    """Rows of the table's current snapshot, read from its data files."""
    return int(table.scan(selected_fields=("id",)).to_arrow().num_rows)


def countTable(options: Mapping[str, str], createdEmpty: bool) -> tuple[int, int]:
    """Rows the table holds and its snapshots (creating a table adds none, whoever creates it)."""
    catalog, name = openCatalog(options)
    table = catalog.load_table(name)
    return heldRows(table), len(table.snapshots())


def metadataKind(name: str) -> str:
    """The kind of a file of the table's ``metadata`` directory, by its name."""
    if name.endswith(".metadata.json"):
        return "metadata.json"
    if name.startswith("snap-") and name.endswith(".avro"):
        return "manifest lists (snap-*.avro)"
    if name.endswith(".avro"):
        return "manifests (*.avro)"
    return "other"


def localPath(uri: str) -> Path:
    """The local path of a ``file://`` URI (or of a plain path)."""
    return Path(unquote(urlparse(uri).path))


def currentMetadata(table: Any) -> str:
    """The table's current ``metadata.json``: its bytes, the snapshots it lists and the earlier
    metadata files its ``metadata-log`` names."""
    size = localPath(table.metadata_location).stat().st_size
    return (
        f"{fmtNumber(size)} bytes, {len(table.snapshots()):,} snapshots, "
        f"{len(table.metadata.metadata_log):,} entries in its metadata-log"
    )


def metadataGrowth(batches: int, work: Path) -> list[tuple[str, Growth]]:
    """``--log-growth`` for each of ``VARIANTS``."""
    measured: list[tuple[str, Growth]] = []
    for heading, properties, sinkOptions in VARIANTS:
        title = f"Iceberg metadata under one snapshot per micro-batch, {heading}"
        log(f"  {title.replace('`', '')}")
        place = work / f"growth-{len(measured)}"
        measured.append((title, growthRun(batches, place, properties, sinkOptions)))
        shutil.rmtree(place, ignore_errors=True)
    return measured


def growthRun(
    batches: int,
    work: Path,
    properties: Mapping[str, str],
    sinkOptions: Mapping[str, str],
    rowsPerFile: int = 10,
) -> Growth:
    """Drive ``IcebergCommitter.completeBatch`` for ``batches`` micro-batches, each one tiny
    Parquet file written into the table's ``data`` directory first (as ``commit`` leaves a
    task's file), and time each commit; then the ``metadata`` directory, ``load_table``'s
    time, and the same after expiring every snapshot but the last ``KEEP_SNAPSHOTS``."""
    from twophase.sinks.iceberg import LOCATION_OPTION, IcebergCommitter, ensureTable

    work.mkdir(parents=True, exist_ok=True)
    given = options(work, "growth")
    catalog, name = openCatalog(given)
    table = ensureTable(catalog, name, growthSchema(), None, True)
    if properties:
        table.transaction().set_properties(dict(properties)).commit_transaction()
    location = table.location().rstrip("/")
    committer = IcebergCommitter.fromOptions({**given, **sinkOptions, LOCATION_OPTION: location})
    files = committer.settings.files
    data = localPath(location) / "data"
    data.mkdir(parents=True, exist_ok=True)
    growth = Growth(batches, rowsPerFile)
    growth.seconds = driveCommits(
        ICEBERG, batches, rowsPerFile, data, files.path, files, committer.completeBatch
    )
    metadata = localPath(location) / "metadata"
    growth.files = filesByKind(metadata, metadataKind)
    opened, growth.openSeconds = timed(lambda: catalog.load_table(name))
    _, growth.openAgainSeconds = timed(lambda: catalog.load_table(name))
    growth.held = heldRows(opened)
    growth.commits = len(opened.snapshots())
    if "retainSnapshots" in sinkOptions:
        growth.keptCommits = min(batches, int(sinkOptions["retainSnapshots"]))
    growth.notes.append(f"The current `metadata.json`: {currentMetadata(opened)}.")
    expireAllButLast(growth, catalog, name, opened, metadata)
    return growth


def expireAllButLast(growth: Growth, catalog: Any, name: str, table: Any, metadata: Path) -> None:
    """Expire every snapshot older than the ``KEEP_SNAPSHOTS``-th newest (pyiceberg 0.12 has
    ``older_than`` and ``by_ids``, no retain-last); record what the metadata is after, and
    whether the table still holds every row and the sink's last batch."""
    from twophase.sinks.iceberg.table import committedBatch

    snapshots = sorted(table.snapshots(), key=lambda s: (s.timestamp_ms, s.sequence_number or 0))
    if len(snapshots) <= KEEP_SNAPSHOTS:
        growth.after.append(f"No expiry: {len(snapshots)} snapshots, {KEEP_SNAPSHOTS} kept.")
        return
    oldestKept = snapshots[-KEEP_SNAPSHOTS].timestamp_ms
    cutoff = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=oldestKept)
    _, expireSeconds = timed(
        lambda: table.maintenance.expire_snapshots().older_than(cutoff).commit()
    )
    after, openSeconds = timed(lambda: catalog.load_table(name))
    held = heldRows(after)
    batch = committedBatch(after, growthSinkId(ICEBERG))
    if held != growth.batches * growth.rowsPerFile:
        growth.afterWrong.append(f"{held:,} rows after the expiry")
    if batch != growth.batches - 1:
        growth.afterWrong.append(f"batch property {batch} after the expiry")
    growth.after.append(
        f"Every snapshot but the last {KEEP_SNAPSHOTS} expired "
        "(`table.maintenance.expire_snapshots().older_than(<the time of the "
        f"{KEEP_SNAPSHOTS}th newest>)`) in {expireSeconds * 1000:.1f} ms: "
        f"{len(snapshots) - len(after.snapshots()):,} expired. The current `metadata.json` "
        f"after: {currentMetadata(after)}. `metadata/` after (pyiceberg deletes no manifest "
        "list, manifest or data file of an expired snapshot):\n\n"
        + filesTable(filesByKind(metadata, metadataKind))
        + f"\n\n`catalog.load_table(name)` after: {openSeconds * 1000:.1f} ms; the table holds "
        f"{held:,} rows and the sink's batch property says {batch}."
    )


ICEBERG = TableFormat(
    name="iceberg",
    title="twophase.iceberg against pyiceberg's table.append, Spark's Parquet and noop sinks",
    atLeastOnce="pyiceberg table.append in foreachBatch (at least once)",
    pathsNote="(w) is at least once: a driver that dies after `table.append` and before "
    "Spark's commit log appends the batch again on restart; (t) records each batch in the "
    "table's properties (`twophase.batch.<sinkId>` = batch id) in the same catalog commit as "
    "its snapshot.",
    options=options,
    appendBatch=appendWithPyiceberg,
    count=countTable,
    growth=metadataGrowth,
    terms=LogTerms(
        committer="IcebergCommitter",
        logDir="metadata/",
        openCall="catalog.load_table(name)",
        commitsAt="in {} snapshots",
        commitsWrong="{} snapshots",
    ),
    growthBatches=(1_000, 300),
)


def main(argv: list[str] | None = None) -> int:
    return runBench(ICEBERG, argv, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
