"""The built-in sinks without a server join the contract suite: files on local disk, Delta, Iceberg.

Each class is a context of ``twophase.testing.SinkContract`` over a real target in the test's
own directory: the sink's Spark binding built from options, its driver check (``validate``)
run as the driver runs it before the first task, the table read back by the table format's own
reader, and the staged files that no commit or abort finished listed as leftovers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from twophase.sinks.files import FilesSettings
from twophase.spark.declared import DeltaSink, FilesSink
from twophase.spark.iceberg import IcebergSink
from twophase.testing import SinkContract

STREAM = StructType([StructField("id", LongType()), StructField("payload", StringType())])
"""The suite's rows as the driver sees the stream's schema."""


def stagedFiles(settings: FilesSettings) -> list[str]:
    """Every file still staged for the sink: prepared by a task, not yet committed or aborted."""
    fs, root = fsspec.core.url_to_fs(settings.staging)
    return sorted(fs.find(root)) if fs.exists(root) else []


def validated(sink: Any) -> dict[str, str]:
    """The options after the driver's check of the stream, which may add what tasks need."""
    sink.validate(STREAM)
    return dict(sink.options)


class LocalContract(SinkContract):
    """A context whose targets live in the test's own directory (``root``), once the
    package its sink needs (``needs``) is found."""

    needs = ""

    @pytest.fixture(autouse=True)
    def _directory(self, tmp_path: Path) -> None:
        if self.needs:
            pytest.importorskip(self.needs)
        self.root = tmp_path

    def checkpoint(self) -> dict[str, str]:
        """The query's checkpoint, which the driver's check requires, as Spark passes it."""
        return {"checkpointLocation": str(self.root / "checkpoint")}


class TestFilesContract(LocalContract):
    sink = FilesSink

    def newTarget(self) -> dict[str, str]:
        return validated(FilesSink({"path": str(self.root / "out"), **self.checkpoint()}))

    def readCommitted(self, options: Mapping[str, str]) -> pa.Table:
        path = options["path"]
        if not Path(path).exists():
            return self.schema.empty_table()
        return ds.dataset(path, self.schema, format="parquet", partitioning="hive").to_table()

    def leftovers(self, options: Mapping[str, str]) -> list[Any]:
        return stagedFiles(FilesSettings.fromOptions(options))


class TestDeltaContract(LocalContract):
    sink = DeltaSink
    needs = "deltalake"

    def newTarget(self) -> dict[str, str]:
        return validated(DeltaSink({"path": str(self.root / "table"), **self.checkpoint()}))

    def readCommitted(self, options: Mapping[str, str]) -> pa.Table:
        import deltalake

        return deltalake.DeltaTable(options["path"]).to_pyarrow_table()

    def leftovers(self, options: Mapping[str, str]) -> list[Any]:
        return stagedFiles(DeltaSink(dict(options)).settings().files)


class TestIcebergContract(LocalContract):
    sink = IcebergSink
    needs = "pyiceberg"

    def newTarget(self) -> dict[str, str]:
        options = {
            "table": "contract.events",
            "catalog.type": "sql",
            "catalog.uri": f"sqlite:///{self.root}/catalog.db",
            "catalog.warehouse": f"file://{self.root}/warehouse",
            **self.checkpoint(),
        }
        return validated(IcebergSink(options))

    def readCommitted(self, options: Mapping[str, str]) -> pa.Table:
        from twophase.sinks.iceberg import catalogOf

        settings = IcebergSink(dict(options)).settings()
        table = catalogOf(settings).load_table(settings.table)
        return table.scan(selected_fields=("id",)).to_arrow()

    def leftovers(self, options: Mapping[str, str]) -> list[Any]:
        return stagedFiles(IcebergSink(dict(options)).settings().files)
