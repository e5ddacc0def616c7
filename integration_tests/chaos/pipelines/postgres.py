"""The PostgreSQL sink's pipeline: sequence -> twophase.postgres, rejected rows set aside.

The table's CHECK constraint refuses one row in 97, which the option ``badRecords`` sets aside
in a dead-letter table inside each task's prepared transaction; every partition is therefore
prepared (the staged path runs in ``multi``, whose PostgreSQL target stages all partitions
but the first). The schedule kills PostgreSQL (an immediate shutdown) besides the driver and
the executors; the dead-letter rows count as held when the table is verified.
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
    """A fresh table name on the PostgreSQL of ``services`` (the sink creates the table). A
    role that may not create in ``public`` (PostgreSQL 15's default for all but its owner)
    writes into a schema of its own name, which it owns."""
    import psycopg

    spec.pgUrl = need(services.pgUrl, "PostgreSQL")
    spec.table = f"chaos_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(spec.pgUrl, autocommit=True) as conn:
        row = conn.execute(
            "SELECT has_schema_privilege('public', 'CREATE'), current_user"
        ).fetchone()
        assert row is not None
        if not row[0]:
            conn.execute("CREATE SCHEMA IF NOT EXISTS AUTHORIZATION CURRENT_USER")
            spec.table = f"{row[1]}.{spec.table}"


class PostgresPipeline(Pipeline):
    """sequence -> twophase.postgres into a fresh table."""

    name = "postgres"
    servers = ("postgres",)

    def prepare(self, spec: PipelineSpec, services: Services) -> None:
        import psycopg

        newTable(spec, services)
        spec.sinkOptions["socketTimeout"] = SOCKET_TIMEOUT
        spec.sinkOptions["badRecords"] = f"{spec.table}_aside"
        with psycopg.connect(spec.pgUrl, autocommit=True) as conn:
            conn.execute(
                f"CREATE TABLE {spec.table} (id bigint NOT NULL, payload text, "
                "CONSTRAINT one_in_97 CHECK (id % 97 <> 13))"
            )

    def sink(self, stream: DataFrame, spec: PipelineSpec) -> DataStreamWriter:
        return (
            stream.writeStream.format("twophase.postgres")
            .option("url", spec.pgUrl)
            .option("table", spec.table)
        )

    def doctorOptions(self, spec: PipelineSpec) -> dict[str, str]:
        return {**spec.sinkOptions, "url": spec.pgUrl}

    def actual(self, spec: PipelineSpec) -> Any:
        from twophase import verify

        aside = {"badRecords": spec.sinkOptions["badRecords"]}
        return verify.actualFromPostgres(spec.pgUrl, spec.table, options=aside)


POSTGRES = PostgresPipeline()
