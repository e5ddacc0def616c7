"""The SQL sink's pipeline ``mariadb``: sequence -> twophase.sql on MariaDB, XA transactions.

Every task prepares an XA transaction that the driver commits after the decision; a prepared
XA transaction outlives its client and a kill of the server, which the schedule delivers
besides the driver and executor kills. The table refuses one row in 4,001 (a CHECK
constraint), which the sink sets aside in its ``badRecords`` table inside the same
transactions: the check counts the rows of both tables, each source row once. A task writes
at least 1,200 rows, so that the sink loads them by ``LOAD DATA LOCAL``; about a third of the
tasks hold a refused row, whose load is undone to its savepoint and sent again as ``INSERT``s:
kills land in both paths.
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
    minRowsPerBatch = 2 * 1200  # two partitions, each above loaddata.MIN_ROWS

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
                    "CONSTRAINT one_in_4001 CHECK (MOD(id, 4001) <> 13)) ENGINE=InnoDB"
                )
        finally:
            engine.dispose()

    def sink(self, stream: DataFrame, spec: PipelineSpec) -> DataStreamWriter:
        return (
            stream.writeStream.format("twophase.sql")
            .option("url", spec.sqlUrl)
            .option("dbtable", spec.table)
        )

    def doctorOptions(self, spec: PipelineSpec) -> dict[str, str]:
        return {**spec.sinkOptions, "url": spec.sqlUrl}

    def actual(self, spec: PipelineSpec) -> Any:
        from twophase import verify

        aside = {"badRecords": spec.sinkOptions["badRecords"]}
        return verify.actualFromSql(spec.sqlUrl, spec.table, options=aside)


MARIADB = MariadbPipeline()
