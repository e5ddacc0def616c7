"""A MariaDB table per path: JDBC in foreachBatch against twophase.sql (XA)."""

from __future__ import annotations

from functools import partial
from typing import Any

from bench import bare
from bench import sql as sqlb
from bench.targets.base import Context, Target
from bench.targets.postgres import COLUMNS


class SqlTarget(Target):
    name = "sql"
    title = "SQL (MariaDB)"
    sparkOwn = "Spark JDBC (MariaDB) in foreachBatch"
    bareTitle = "PyMySQL LOAD DATA LOCAL"
    twophaseFormat = "twophase.sql"
    columns = COLUMNS
    packages = (sqlb.JDBC_DRIVER,)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.url = sqlb.mariadbUrl()
        self.tables: dict[str, str] = {}

    def server(self) -> str | None:
        return str(self.url)

    def _engine(self) -> Any:
        return sqlb.sa.create_engine(self.url, poolclass=sqlb.sa.pool.NullPool)

    def prepare(self, label: str) -> None:
        self.tables[label] = f"bench_shape_{label}_sql".replace("-", "_").lower()
        engine = self._engine()
        try:
            sqlb.resetTable(engine, self.tables[label])
        finally:
            engine.dispose()

    def sparkWriter(self, frame: Any, label: str) -> Any:
        jdbc, props = sqlb.jdbcTarget(self.url)
        table = self.tables[label]

        def writeBatch(df: Any, batchId: int) -> None:
            df.write.option("batchsize", 1000).jdbc(jdbc, table, mode="append", properties=props)

        return frame.writeStream.foreachBatch(writeBatch)

    def twophaseOptions(self, label: str) -> dict[str, str]:
        return {"url": self.url, "dbtable": self.tables[label]}

    def bareTask(self, label: str) -> Any:
        return partial(bare.mariadbRows, url=str(self.url), table=self.tables[label])

    def cleanup(self) -> None:
        if not self.tables:
            return
        engine = self._engine()
        try:
            with engine.begin() as conn:
                for name in self.tables.values():
                    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        finally:
            engine.dispose()
