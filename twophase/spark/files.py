"""``twophase.files`` as a Spark data source: the files sink's writer and committer, bound.

``df.writeStream.format("twophase.files").option("path", ...)
.option("checkpointLocation", ...).start()`` after ``twophase.register(spark)``. Everything
the sink does lives in :mod:`twophase.sinks.files`; this class only builds it from options.
"""

from __future__ import annotations

from typing import ClassVar

from pyspark.sql.types import StructType

from twophase.sinks.files import (
    SAFE_OPTIONS,
    FilesCommitter,
    FilesSettings,
    FilesWriter,
    checkWritable,
)
from twophase.spark.datasource import TwoPhaseDataSource
from twophase.spark.schema import arrowSchemaOf


class FilesSink(TwoPhaseDataSource):
    """``twophase.files``: exactly-once Parquet, JSON lines or CSV files on any fsspec store.

    Options are those of :class:`twophase.sinks.files.FilesSettings`. ``sink.json`` keeps the
    ones that shape the output (``SAFE_OPTIONS``); storage credentials (``fs.key``,
    ``fs.secret``, ``fs.token``...) are never written there, so ``twophase recover`` takes them
    from the environment the store's library reads (``AWS_*``, ``AZURE_STORAGE_*``...).
    """

    safeOptions: ClassVar[frozenset[str]] = SAFE_OPTIONS

    @classmethod
    def name(cls) -> str:
        return "twophase.files"

    def settings(self) -> FilesSettings:
        """The parsed options; ``ValueError`` names a bad option."""
        return FilesSettings.fromOptions(self.options)

    def createWriter(self) -> FilesWriter:
        return FilesWriter(self.settings())

    def createCommitter(self) -> FilesCommitter:
        return FilesCommitter(self.settings())

    def validate(self, schema: StructType) -> None:
        """Driver: check the options and that they can write the query's columns."""
        settings = self.settings()
        checkWritable(arrowSchemaOf(schema, self.name()), settings)


__all__ = ["FilesSink"]
