"""The SQL sink's pipeline ``mariadb``: sequence -> twophase.sql on MariaDB, XA transactions.

Every task prepares an XA transaction that the driver commits after the decision; a prepared
XA transaction outlives its client and a kill of the server, which the schedule delivers
besides the driver and executor kills.
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


class MariadbPipeline(Pipeline):
    """sequence -> twophase.sql into a fresh MariaDB table."""

    name = "mariadb"
    servers = ("mariadb",)

    def prepare(self, spec: PipelineSpec, services: Services) -> None:
        spec.sqlUrl = need(services.mariadbUrl, "MariaDB")
        spec.table = f"chaos_{uuid.uuid4().hex[:8]}"
        spec.sinkOptions["socketTimeout"] = SOCKET_TIMEOUT

    def sink(self, stream: DataFrame, spec: PipelineSpec) -> DataStreamWriter:
        return (
            stream.writeStream.format("twophase.sql")
            .option("url", spec.sqlUrl)
            .option("dbtable", spec.table)
            .option("createTable", "true")
        )

    def actual(self, spec: PipelineSpec) -> Any:
        from twophase import verify

        return verify.actualFromSql(spec.sqlUrl, spec.table)


MARIADB = MariadbPipeline()
