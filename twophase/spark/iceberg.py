"""``twophase.iceberg`` as a Spark data source: the Iceberg sink's writer and committer, bound.

``df.writeStream.format("twophase.iceberg").option("table", "ns.name")
.option("catalog.type", "sql")...option("checkpointLocation", ...).start()`` after
``twophase.register(spark)``. Everything the sink does lives in :mod:`twophase.sinks.iceberg`;
this class builds it from options and resolves the table's place for the tasks.
"""

from __future__ import annotations

from typing import ClassVar

from pyspark.sql.types import StructType

from twophase.settings import optionErrors
from twophase.sinks.files import FilesWriter, checkWritable
from twophase.sinks.iceberg import (
    LOCATION_OPTION,
    SAFE_OPTIONS,
    IcebergCommitter,
    IcebergSettings,
    catalogOf,
    ensureTable,
)
from twophase.sinks.iceberg.table import tablePartitionColumns
from twophase.spark.datasource import TwoPhaseDataSource
from twophase.spark.schema import arrowSchemaOf


class IcebergSink(TwoPhaseDataSource):
    """``twophase.iceberg``: exactly-once appends to an Iceberg table, one snapshot per batch.

    Options are those of :class:`twophase.sinks.iceberg.IcebergSettings`. ``sink.json`` keeps
    the ones that name the catalog and shape the table (``SAFE_OPTIONS``, ``catalog.uri``
    without its password); keys, secrets and tokens never reach it, so ``twophase recover``
    takes them from the environment (``PGPASSWORD``, ``AWS_*``).
    """

    safeOptions: ClassVar[frozenset[str]] = SAFE_OPTIONS

    @classmethod
    def name(cls) -> str:
        return "twophase.iceberg"

    @classmethod
    def publicOptionValue(cls, key: str, value: str) -> str | None:
        """``catalog.uri`` without a password (``None`` when it is not a URL); the rest as is."""
        if key.lower() != "catalog.uri" or "://" not in value:
            return value
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        from twophase.sinks.sql.settings import withoutPassword

        try:
            return withoutPassword(make_url(value))
        except ArgumentError:
            return None

    def settings(self) -> IcebergSettings:
        """The parsed options; ``TwoPhaseConfigError`` names a bad option."""
        with optionErrors():
            return IcebergSettings.fromOptions(self.options)

    def createWriter(self) -> FilesWriter:
        return FilesWriter(self.settings().files)

    def createCommitter(self) -> IcebergCommitter:
        return IcebergCommitter(self.settings())

    def validate(self, schema: StructType) -> None:
        """Driver: check the options, create or check the table against the stream, and hand
        the tasks the table's location and partition columns."""
        settings = self.settings()
        arrow = arrowSchemaOf(schema, self.name())
        catalog = catalogOf(settings)
        table = ensureTable(
            catalog,
            settings.table,
            arrow,
            settings.partitionBy if settings.partitionGiven else None,
            settings.createTable,
        )
        partitions = tablePartitionColumns(table, settings.table)
        if partitions and not settings.partitionGiven:
            self.options["partitionBy"] = ",".join(partitions)
        self.options[LOCATION_OPTION] = table.location()
        checkWritable(arrow, self.settings().files)


__all__ = ["IcebergSink"]
