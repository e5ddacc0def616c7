"""The Iceberg sink's pipeline: sequence -> twophase.iceberg, a table on local disk whose SQL
catalog is a SQLite file beside it.

Its schedule kills the driver and the executors at every protocol point, the Iceberg commit's
windows included (between the files' move under the table and the snapshot, and after the
snapshot before ``committed(N)``); it has no server to kill. Read back through pyiceberg, which
sees only the files the current snapshot names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from integration_tests.chaos.pipelines.base import Pipeline
from integration_tests.chaos.spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import DataStreamWriter

TABLE = "chaos.events"


def icebergOptions(spec: PipelineSpec, prefix: str = "") -> dict[str, str]:
    """The table and its catalog (on the pipeline's disk), as the sink and verify take them."""
    return {
        f"{prefix}table": TABLE,
        f"{prefix}catalog.type": "sql",
        f"{prefix}catalog.uri": f"sqlite:///{spec.output}-iceberg/catalog.db",
        f"{prefix}catalog.warehouse": f"file://{spec.output}-iceberg/warehouse",
    }


class IcebergPipeline(Pipeline):
    """sequence -> twophase.iceberg, partitioned by ``id % 3``."""

    name = "iceberg"
    completesBatches = True

    def sink(self, stream: DataFrame, spec: PipelineSpec) -> DataStreamWriter:
        import os

        os.makedirs(f"{spec.output}-iceberg", exist_ok=True)
        writer = (
            stream.selectExpr("id", "payload", "CAST(id % 3 AS INT) AS bucket")
            .writeStream.format("twophase.iceberg")
            .option("partitionBy", "bucket")
        )
        for key, value in icebergOptions(spec).items():
            writer = writer.option(key, value)
        return writer

    def actual(self, spec: PipelineSpec) -> Any:
        from twophase.verify.iceberg import readIceberg

        return readIceberg(icebergOptions(spec), self.columns)[0]


ICEBERG = IcebergPipeline()
