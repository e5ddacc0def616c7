"""The Delta sink's pipeline: sequence -> twophase.delta, a table on local disk (on S3 when the
pipeline runs on the compose cluster).

Its schedule kills the driver and the executors at every protocol point, the Delta commit's
windows included (between the files' move into the table and the log commit, and after the log
commit before ``committed(N)``); it has no server to kill. Read back through delta-rs, which
sees only the files the table's log names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from integration_tests.chaos.pipelines.base import Pipeline
from integration_tests.chaos.spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import DataStreamWriter


class DeltaPipeline(Pipeline):
    """sequence -> twophase.delta into ``spec.outputLocation``, partitioned by ``id % 3``."""

    name = "delta"
    completesBatches = True

    def sink(self, stream: DataFrame, spec: PipelineSpec) -> DataStreamWriter:
        return (
            stream.selectExpr("id", "payload", "CAST(id % 3 AS INT) AS bucket")
            .writeStream.format("twophase.delta")
            .option("path", spec.outputLocation)
            .option("partitionBy", "bucket")
            .options(**spec.storeOptions)
        )

    def actual(self, spec: PipelineSpec) -> Any:
        from twophase import verify

        return verify.actualFromDelta(spec.outputLocation, self.columns, spec.storeOptions)


DELTA = DeltaPipeline()
