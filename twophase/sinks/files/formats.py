"""The file formats the files sink writes: their names, compressions, extensions and encoders.

An encoder writes record batches of one schema into one open binary file and never closes the
file itself: the writer owns the file (it syncs it after the encoder's last bytes).
"""

from __future__ import annotations

import gzip
from abc import ABC, abstractmethod
from typing import IO, cast

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from twophase.sinks.files.jsonlines import encodeBatch


def utcTimestamps(type_: pa.DataType) -> pa.DataType:
    """``type_`` with every zoned timestamp, nested ones too, as microseconds in UTC: a table
    format's ``timestamp`` with a zone is an instant (Delta's ``timestamp``, Iceberg's
    ``timestamptz``), and Spark hands batches in the session's zone."""
    if pa.types.is_timestamp(type_):
        return pa.timestamp("us", tz="UTC") if type_.tz else pa.timestamp("us")
    if pa.types.is_struct(type_):
        return pa.struct([f.with_type(utcTimestamps(f.type)) for f in type_])
    if pa.types.is_large_list(type_):
        return pa.large_list(type_.value_field.with_type(utcTimestamps(type_.value_type)))
    if pa.types.is_list(type_):
        return pa.list_(type_.value_field.with_type(utcTimestamps(type_.value_type)))
    if pa.types.is_map(type_):
        return pa.map_(
            type_.key_field.with_type(utcTimestamps(type_.key_type)),
            type_.item_field.with_type(utcTimestamps(type_.item_type)),
        )
    return type_


FORMATS = ("parquet", "json", "csv")
"""The values of the ``format`` option."""

EXTENSIONS: dict[str, dict[str, str]] = {
    "parquet": {
        "snappy": ".snappy.parquet",
        "zstd": ".zstd.parquet",
        "gzip": ".gz.parquet",
        "none": ".parquet",
    },
    "json": {"none": ".json", "gzip": ".json.gz"},
    "csv": {"none": ".csv", "gzip": ".csv.gz"},
}
"""Format -> compression -> file name suffix; the compressions each format supports."""

DEFAULT_COMPRESSION = {"parquet": "snappy", "json": "none", "csv": "none"}

COMPRESSION_ALIASES = {"uncompressed": "none", "gz": "gzip"}
"""Other spellings of a compression accepted by the ``compression`` option."""


class FormatWriter(ABC):
    """Encodes record batches of one schema into one open binary file; never closes the file."""

    @abstractmethod
    def write(self, batch: pa.RecordBatch) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class ParquetWriter(FormatWriter):
    """One row group per written batch, so memory stays at one batch."""

    def __init__(self, raw: IO[bytes], schema: pa.Schema, compression: str) -> None:
        self._writer = pq.ParquetWriter(raw, schema, compression=compression)

    def write(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)

    def close(self) -> None:
        self._writer.close()


class TextWriter(FormatWriter):
    """Shared gzip handling of the line formats (a gzip member spanning the whole file)."""

    def __init__(self, raw: IO[bytes], compression: str) -> None:
        self._gzip: gzip.GzipFile | None = None
        self.out: IO[bytes] = raw
        if compression == "gzip":
            self._gzip = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0)
            self.out = cast(IO[bytes], self._gzip)

    def close(self) -> None:
        if self._gzip is not None:
            self._gzip.close()


class JsonWriter(TextWriter):
    """JSON lines, one object per row (see :mod:`twophase.sinks.files.jsonlines`)."""

    def write(self, batch: pa.RecordBatch) -> None:
        self.out.write(encodeBatch(batch))


class CsvWriter(TextWriter):
    """CSV through pyarrow's writer, with or without a header line."""

    def __init__(self, raw: IO[bytes], schema: pa.Schema, compression: str, header: bool) -> None:
        super().__init__(raw, compression)
        options = pacsv.WriteOptions(include_header=header)
        self._writer = pacsv.CSVWriter(self.out, schema, write_options=options)

    def write(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)

    def close(self) -> None:
        self._writer.close()
        super().close()


def formatWriter(
    raw: IO[bytes], schema: pa.Schema, format: str, compression: str, header: bool
) -> FormatWriter:
    """The encoder of ``format`` over the open file ``raw`` for rows of ``schema``."""
    if format == "parquet":
        return ParquetWriter(raw, schema, compression)
    if format == "json":
        return JsonWriter(raw, compression)
    return CsvWriter(raw, schema, compression, header)


def checkFormatSupports(schema: pa.Schema, format: str) -> None:
    """Refuse columns ``format`` cannot hold (nested columns in csv); the error names the fix."""
    if format != "csv":
        return
    for f in schema:
        t = f.type
        if pa.types.is_dictionary(t):
            t = t.value_type
        if pa.types.is_nested(t):
            raise ValueError(
                f"option format=csv cannot write column {f.name!r} of type {f.type}; "
                "use format=parquet or format=json, or flatten the column"
            )


__all__ = [
    "COMPRESSION_ALIASES",
    "DEFAULT_COMPRESSION",
    "EXTENSIONS",
    "FORMATS",
    "FormatWriter",
    "checkFormatSupports",
    "formatWriter",
]
