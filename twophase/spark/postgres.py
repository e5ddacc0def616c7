"""``twophase.postgres`` as a Spark data source: the postgres sink's writer and committer, bound.

``df.writeStream.format("twophase.postgres").option("url", ...).option("table", ...)
.option("checkpointLocation", ...).start()`` after ``twophase.register(spark)``. Everything
the sink does lives in :mod:`twophase.sinks.postgres`; this class only builds it from options.
"""

from __future__ import annotations

from typing import ClassVar

from pyspark.sql.types import StructType

from twophase.sinks.postgres import (
    SAFE_OPTIONS,
    PostgresCommitter,
    PostgresSettings,
    PostgresWriter,
    publicOptionValue,
    validateTarget,
)
from twophase.spark.datasource import TwoPhaseDataSource
from twophase.spark.schema import arrowSchemaOf


class PostgresSink(TwoPhaseDataSource):
    """``twophase.postgres``: exactly-once into one PostgreSQL table via prepared transactions,
    or (``commitMode``) rows staged next to it and moved by the driver.

    Options are those of :class:`twophase.sinks.postgres.PostgresSettings`. ``sink.json`` keeps
    the ones the committer needs (``SAFE_OPTIONS``), the ``url`` without its password; the
    password (``password``, ``sslpassword``) is never written there, so ``twophase recover``
    takes it from ``PGPASSWORD``, ``~/.pgpass`` or an option given again.
    """

    safeOptions: ClassVar[frozenset[str]] = SAFE_OPTIONS

    @classmethod
    def name(cls) -> str:
        return "twophase.postgres"

    @classmethod
    def publicOptionValue(cls, key: str, value: str) -> str | None:
        """The form of allowed option ``key`` that ``sink.json`` keeps (``None``: leave it out):
        ``url`` as a password-free libpq ``key=value`` string, other options as given."""
        return publicOptionValue(key, value)

    def settings(self) -> PostgresSettings:
        """The parsed options; ``TwoPhaseConfigError`` names a bad option."""
        return PostgresSettings.fromOptions(self.options)

    def createWriter(self) -> PostgresWriter:
        return PostgresWriter(self.settings())

    def createCommitter(self) -> PostgresCommitter:
        return PostgresCommitter(self.settings())

    def validate(self, schema: StructType) -> None:
        """Driver, before each batch: check the options, the server and the table."""
        validateTarget(self.settings(), arrowSchemaOf(schema, "the postgres sink"))


__all__ = ["PostgresSink"]
