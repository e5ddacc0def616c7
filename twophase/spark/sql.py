"""``twophase.sql`` as a Spark data source: the sql sink's writer and committer, bound.

``df.writeStream.format("twophase.sql").option("url", "mysql+pymysql://...")
.option("dbtable", ...).option("checkpointLocation", ...).start()`` after
``twophase.register(spark)``. Everything the sink does lives in :mod:`twophase.sinks.sql`;
this class only builds it from options.
"""

from __future__ import annotations

from typing import ClassVar

from pyspark.sql.types import StructType

from twophase.settings import SinkSettings
from twophase.sinks.sql import (
    SAFE_OPTIONS,
    SqlCommitter,
    SqlSettings,
    SqlWriter,
    publicOptionValue,
    validateTarget,
)
from twophase.spark.datasource import TwoPhaseDataSource
from twophase.spark.schema import arrowSchemaOf


class SqlSink(TwoPhaseDataSource):
    """``twophase.sql``: exactly-once into one table of any database whose SQLAlchemy dialect
    has two-phase commit (MySQL/MariaDB XA, PostgreSQL).

    Options are those of :class:`twophase.sinks.sql.SqlSettings`. ``sink.json`` keeps the
    ones the committer needs (``SAFE_OPTIONS``), the ``url`` without its password, so
    ``twophase recover`` takes the password from a ``password`` option given again.
    """

    safeOptions: ClassVar[frozenset[str]] = SAFE_OPTIONS

    @classmethod
    def name(cls) -> str:
        return "twophase.sql"

    @classmethod
    def publicOptionValue(cls, key: str, value: str) -> str | None:
        """``url`` without its password; other allowed options as given."""
        return publicOptionValue(key, value)

    def settings(self) -> SqlSettings:
        """The parsed options; ``TwoPhaseConfigError`` names a bad option."""
        return SqlSettings.fromOptions(self.options)

    def createWriter(self) -> SqlWriter:
        return SqlWriter(self.settings())

    def createCommitter(self) -> SqlCommitter:
        return SqlCommitter(self.settings())

    def validate(self, schema: StructType) -> None:
        """Driver, before each batch: check the options, the server and the table."""
        sinkId = SinkSettings.fromOptions(self.options, self.name()).sinkId
        validateTarget(self.settings(), arrowSchemaOf(schema, "the sql sink"), sinkId)


__all__ = ["SqlSink"]
