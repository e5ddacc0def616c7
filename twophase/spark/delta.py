"""``twophase.delta`` as a Spark data source: the Delta sink's writer and committer, bound.

``df.writeStream.format("twophase.delta").option("path", ...)
.option("checkpointLocation", ...).start()`` after ``twophase.register(spark)``. Everything
the sink does lives in :mod:`twophase.sinks.delta`; this class only builds it from options.
"""

from __future__ import annotations

from typing import ClassVar

from pyspark.sql.types import StructType

from twophase.sinks.delta import SAFE_OPTIONS, DeltaCommitter, DeltaSettings, ensureTable
from twophase.sinks.files import FilesWriter, checkWritable
from twophase.spark.datasource import TwoPhaseDataSource
from twophase.spark.schema import arrowSchemaOf


class DeltaSink(TwoPhaseDataSource):
    """``twophase.delta``: exactly-once appends to a Delta table, one log commit per batch.

    Options are those of :class:`twophase.sinks.delta.DeltaSettings`. ``sink.json`` keeps the
    ones that shape the table (``SAFE_OPTIONS``); keys, secrets and tokens never reach it, so
    ``twophase recover`` takes them from the environment (``AWS_*``).
    """

    safeOptions: ClassVar[frozenset[str]] = SAFE_OPTIONS

    @classmethod
    def name(cls) -> str:
        return "twophase.delta"

    def settings(self) -> DeltaSettings:
        """The parsed options; ``ValueError`` names a bad option."""
        return DeltaSettings.fromOptions(self.options)

    def createWriter(self) -> FilesWriter:
        return FilesWriter(self.settings().files)

    def createCommitter(self) -> DeltaCommitter:
        return DeltaCommitter(self.settings())

    def validate(self, schema: StructType) -> None:
        """Driver: check the options, then create or check the table against the stream."""
        settings = self.settings()
        arrow = arrowSchemaOf(schema, self.name())
        checkWritable(arrow, settings.files)
        ensureTable(
            settings.tableUri,
            arrow,
            settings.partitionBy if settings.partitionGiven else None,
            settings.createTable,
            settings.storage,
        )


__all__ = ["DeltaSink"]
