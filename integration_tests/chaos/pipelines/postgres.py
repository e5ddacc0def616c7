"""The PostgreSQL sink's pipeline: sequence -> twophase.postgres, both of its commit paths.

Partition 0 of every batch goes through a prepared transaction and the others are staged
(``maxPreparedPartitions=1``), so every crash window is hit on both paths. The schedule kills
PostgreSQL (an immediate shutdown) besides the driver and the executors.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from integration_tests.chaos.pipelines.base import SOCKET_TIMEOUT, Pipeline, need
from integration_tests.chaos.spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import DataStreamWriter

    from integration_tests.chaos.servers import Services


def newTable(spec: PipelineSpec, services: Services) -> None:
    """A fresh table name on the PostgreSQL of ``services`` (the sink creates the table)."""
    spec.pgUrl = need(services.pgUrl, "PostgreSQL")
    spec.table = f"chaos_{uuid.uuid4().hex[:8]}"


class PostgresPipeline(Pipeline):
    """sequence -> twophase.postgres into a fresh table."""

    name = "postgres"
    servers = ("postgres",)

    def prepare(self, spec: PipelineSpec, services: Services) -> None:
        newTable(spec, services)
        spec.sinkOptions["socketTimeout"] = SOCKET_TIMEOUT

    def sink(self, stream: DataFrame, spec: PipelineSpec) -> DataStreamWriter:
        return (
            stream.writeStream.format("twophase.postgres")
            .option("url", spec.pgUrl)
            .option("table", spec.table)
            .option("createTable", "true")
            # partition 0 prepares, the others stage: both commit paths in every batch
            .option("maxPreparedPartitions", "1")
        )

    def actual(self, spec: PipelineSpec) -> Any:
        from twophase import verify

        return verify.actualFromPostgres(spec.pgUrl, spec.table)


POSTGRES = PostgresPipeline()
