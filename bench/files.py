"""The files target of ``make bench``: Parquet through Spark, counted, and pyarrow alone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench import kafka as kb
from bench._common import (
    sequenceStream,
)


def fileStream(spark: Any, rows: int, per: int, parts: int, valueBytes: int) -> Any:
    return sequenceStream(
        spark, rows, per, parts, "id", f"rpad(payload, {valueBytes}, '.') AS payload"
    )


def writeFiles(
    spark: Any, fmt: str, path: str, ckpt: str, rows: int, per: int, parts: int, valueBytes: int
) -> float:
    writer = (
        fileStream(spark, rows, per, parts, valueBytes)
        .writeStream.format(fmt)
        .option("path", path)
        .option("checkpointLocation", ckpt)
    )
    if fmt == "twophase.files":
        writer = writer.option("format", "parquet")
    return kb.runQuery(writer)


def committedFileRows(path: str) -> int:
    """Rows in the visible Parquet files (not staging, not hidden), as a reader sees them."""
    files = [
        p
        for p in Path(path).rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts)
    ]
    return sum(pq.ParquetFile(p).metadata.num_rows for p in files)


def writeParquetRaw(path: str, rows: int, valueBytes: int, chunk: int = 250_000) -> float:
    """One pyarrow ParquetWriter (snappy), the same rows in chunks: the library alone."""
    from twophase.sources.sequence import sequenceRows

    Path(path).mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    schema = pa.schema([("id", pa.int64()), ("payload", pa.string())])
    with pq.ParquetWriter(f"{path}/part-0.parquet", schema, compression="snappy") as writer:
        for start in range(0, rows, chunk):
            batch = sequenceRows(start, min(rows, start + chunk))
            padded = pc.utf8_rpad(batch.column("payload"), valueBytes, ".")
            writer.write_batch(pa.record_batch([batch.column("id"), padded], schema=schema))
    return time.perf_counter() - started


def flinkFileRows(path: str) -> int:
    total = 0
    for p in Path(path).rglob("*"):
        if p.is_file() and not p.name.startswith((".", "_")):
            with p.open("rb") as handle:
                total += sum(1 for _ in handle)
    return total
