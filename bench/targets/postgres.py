"""A PostgreSQL table per path: JDBC in foreachBatch against twophase.postgres."""

from __future__ import annotations

from functools import partial
from typing import Any

from bench import bare
from bench import postgres as pb
from bench.targets.base import Context, Target

COLUMNS = ("id", "payload", "CAST(id AS DOUBLE) AS value", "CAST(id AS TIMESTAMP) AS ts")
"""The four columns of ``bench.postgres``'s table, and of ``bench.sql``'s."""


class PostgresTarget(Target):
    name = "postgres"
    title = "PostgreSQL"
    sparkOwn = "Spark JDBC in foreachBatch"
    bareTitle = "psycopg COPY"
    twophaseFormat = "twophase.postgres"
    columns = COLUMNS
    packages = (pb.JDBC_DRIVER,)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.tables: dict[str, str] = {}

    def server(self) -> str | None:
        return self.ctx.pgUrl

    def prepare(self, label: str) -> None:
        self.tables[label] = f"bench_shape_{label}".replace("-", "_").lower()
        pb.resetTable(self.ctx.pgUrl, self.tables[label])

    def sparkWriter(self, frame: Any, label: str) -> Any:
        jdbc, props = pb.jdbcTarget(self.ctx.pgUrl)
        table = self.tables[label]

        def writeBatch(df: Any, batchId: int) -> None:
            df.write.jdbc(jdbc, table, mode="append", properties=props)

        return frame.writeStream.foreachBatch(writeBatch)

    def twophaseOptions(self, label: str) -> dict[str, str]:
        return {"url": self.ctx.pgUrl, "table": self.tables[label]}

    def bareTask(self, label: str) -> Any:
        return partial(bare.postgresRows, url=self.ctx.pgUrl, table=self.tables[label])

    def cleanup(self) -> None:
        if self.tables:
            pb.dropTables(self.ctx.pgUrl, list(self.tables.values()))
