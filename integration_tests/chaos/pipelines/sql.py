"""The SQL sink's pipeline ``mariadb``: sequence -> twophase.sql on MariaDB, XA transactions.

Every task prepares an XA transaction that the driver commits after the decision; a prepared
XA transaction outlives its client and a kill of the server, which the schedule delivers
besides the driver and executor kills. The table refuses one row in 97 (a CHECK constraint),
which the sink sets aside in its ``badRecords`` table inside the same transactions: the check
counts the rows of both tables, each source row once.
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
        import sqlalchemy as sa

        spec.sqlUrl = need(services.mariadbUrl, "MariaDB")
        spec.table = f"chaos_{uuid.uuid4().hex[:8]}"
        spec.sinkOptions["socketTimeout"] = SOCKET_TIMEOUT
        spec.sinkOptions["badRecords"] = f"{spec.table}_aside"
        engine = sa.create_engine(spec.sqlUrl, poolclass=sa.pool.NullPool)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    f"CREATE TABLE {spec.table} (id BIGINT NOT NULL, payload TEXT, "
                    "CONSTRAINT one_in_97 CHECK (MOD(id, 97) <> 13)) ENGINE=InnoDB"
                )
        finally:
            engine.dispose()

    def sink(self, stream: DataFrame, spec: PipelineSpec) -> DataStreamWriter:
        return (
            stream.writeStream.format("twophase.sql")
            .option("url", spec.sqlUrl)
            .option("dbtable", spec.table)
        )

    def actual(self, spec: PipelineSpec) -> Any:
        from twophase import verify

        aside = {"badRecords": spec.sinkOptions["badRecords"]}
        return verify.actualFromSql(spec.sqlUrl, spec.table, options=aside)


MARIADB = MariadbPipeline()
