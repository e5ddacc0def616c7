"""The built-in sinks with a server join the contract suite: PostgreSQL, MariaDB, Kafka, S3.

Each class is a context of ``twophase.testing.SinkContract`` against the real server of this
worker's set: a fresh table, topic or prefix per case, the committed rows read as a user reads
them (a query, a ``read_committed`` consumer, Parquet through s3fs), and the leftovers asked of
the server itself (prepared transactions, XA RECOVER, open Kafka transactions of the sink's
prefix, pending multipart uploads). One connection per server serves the whole module.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from kafka import KafkaAdminClient
from psycopg import sql
from pyspark.sql.types import LongType, StringType, StructField, StructType

from integration_tests.conftest import S3Service
from integration_tests.test_kafka_helpers import createTopic, readTopic
from twophase.sinks.files.s3 import S3Calls
from twophase.sinks.kafka.inspect import OPEN_STATES
from twophase.spark.declared import FilesSink, PostgresSink, SqlSink
from twophase.spark.kafka import KafkaSink
from twophase.testing import SinkContract

STREAM = StructType([StructField("id", LongType()), StructField("payload", StringType())])
"""The suite's rows as the driver sees the stream's schema."""


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def pgConnection(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


class TestPostgresContract(SinkContract):
    """Prepared transactions: a prepared task is a row of ``pg_prepared_xacts``."""

    sink = PostgresSink
    commitMode = "prepared"

    @pytest.fixture(autouse=True)
    def _server(self, pg_url: str, pgConnection: psycopg.Connection[Any]) -> Iterator[None]:
        self.url, self.conn, self.tables = pg_url, pgConnection, list[str]()
        yield
        for table in self.tables:
            for name in (table, f"{table}_twophase_staging", f"{table}_twophase_commits"):
                self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))

    def newTarget(self) -> dict[str, str]:
        table = unique("contract_pg")
        self.tables.append(table)
        self.conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint, payload text)").format(sql.Identifier(table))
        )
        options = {"url": self.url, "table": table, "commitMode": self.commitMode}
        PostgresSink(options).validate(STREAM)  # the driver's check, which makes the staging table
        return options

    def readCommitted(self, options: Mapping[str, str]) -> pa.Table:
        query = sql.SQL("SELECT id FROM {}").format(sql.Identifier(options["table"]))
        ids = [row[0] for row in self.conn.execute(query).fetchall()]
        return pa.table({"id": pa.array(ids, pa.int64())})

    def leftovers(self, options: Mapping[str, str]) -> list[Any]:
        found = self.conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE strpos(gid, %s) > 0", (options["sinkId"],)
        ).fetchall()
        return [gid for (gid,) in found]


class TestPostgresStagedContract(TestPostgresContract):
    """Rows staged next to the table: a prepared task is its token's rows in the staging table."""

    commitMode = "staged"

    def leftovers(self, options: Mapping[str, str]) -> list[Any]:
        staging = f"{options['table']}_twophase_staging"
        (exists,) = self.conn.execute("SELECT to_regclass(%s) IS NOT NULL", (staging,)).fetchone()
        if not exists:
            return []
        query = sql.SQL("SELECT DISTINCT __tp_token FROM {} WHERE strpos(__tp_token, %s) > 0")
        found = self.conn.execute(
            query.format(sql.Identifier(staging)), (options["sinkId"],)
        ).fetchall()
        return [token for (token,) in found]


@pytest.fixture(scope="module")
def mariadbConnection(mariadb_url: str) -> Iterator[sa.Connection]:
    engine = sa.create_engine(mariadb_url, poolclass=sa.pool.NullPool)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        yield conn
    engine.dispose()


class TestSqlOnMariadbContract(SinkContract):
    """XA transactions: a prepared task is a row of ``XA RECOVER``."""

    sink = SqlSink

    @pytest.fixture(autouse=True)
    def _server(
        self, mariadb_url: str, mariadbConnection: sa.Connection, tmp_path: Path
    ) -> Iterator[None]:
        self.url, self.conn, self.tables = mariadb_url, mariadbConnection, list[str]()
        self.checkpoint = str(tmp_path / "checkpoint")
        yield
        for table in self.tables:
            self.conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
            self.conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}_twophase_commits")

    def newTarget(self) -> dict[str, str]:
        table = unique("contract_sql")
        self.tables.append(table)
        self.conn.exec_driver_sql(
            f"CREATE TABLE {table} (id BIGINT, payload VARCHAR(200)) ENGINE=InnoDB"
        )
        options = {"url": self.url, "dbtable": table, "checkpointLocation": self.checkpoint}
        SqlSink(options).validate(STREAM)  # the driver's check, which makes the markers table
        return options

    def readCommitted(self, options: Mapping[str, str]) -> pa.Table:
        ids = [row[0] for row in self.conn.exec_driver_sql(f"SELECT id FROM {options['dbtable']}")]
        return pa.table({"id": pa.array(ids, pa.int64())})

    def leftovers(self, options: Mapping[str, str]) -> list[Any]:
        xids = [row[3] for row in self.conn.exec_driver_sql("XA RECOVER")]
        texts = [x.decode() if isinstance(x, bytes) else str(x) for x in xids]
        return [x for x in texts if options["sinkId"] in x]


class TestSqlOnPostgresContract(SinkContract):
    """``twophase.sql`` through SQLAlchemy on PostgreSQL: a prepared task is a row of
    ``pg_prepared_xacts``."""

    sink = SqlSink

    @pytest.fixture(autouse=True)
    def _server(
        self, pg_url: str, pgConnection: psycopg.Connection[Any], tmp_path: Path
    ) -> Iterator[None]:
        self.url = pg_url.replace("postgresql://", "postgresql+psycopg://", 1)
        self.conn, self.tables = pgConnection, list[str]()
        self.checkpoint = str(tmp_path / "checkpoint")
        yield
        for table in self.tables:
            for name in (table, f"{table}_twophase_commits"):
                self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))

    def newTarget(self) -> dict[str, str]:
        table = unique("contract_sqlpg")
        self.tables.append(table)
        self.conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint, payload text)").format(sql.Identifier(table))
        )
        options = {"url": self.url, "dbtable": table, "checkpointLocation": self.checkpoint}
        SqlSink(options).validate(STREAM)  # the driver's check, which makes the markers table
        return options

    def readCommitted(self, options: Mapping[str, str]) -> pa.Table:
        query = sql.SQL("SELECT id FROM {}").format(sql.Identifier(options["dbtable"]))
        ids = [row[0] for row in self.conn.execute(query)]
        return pa.table({"id": pa.array(ids, pa.int64())})

    def leftovers(self, options: Mapping[str, str]) -> list[Any]:
        found = self.conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE strpos(gid, %s) > 0", (options["sinkId"],)
        )
        return [gid for (gid,) in found]


@pytest.fixture(scope="module")
def kafkaAdmin(kafka_bootstrap: str) -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    yield admin
    admin.close()


class TestKafkaContract(SinkContract):
    """Kafka transactions: the record value is the row's id; a prepared task is an open
    transaction whose id starts with the sink's transactional id prefix."""

    sink = KafkaSink
    schema = pa.schema([("value", pa.string())])

    @pytest.fixture(autouse=True)
    def _server(self, kafka_bootstrap: str, kafkaAdmin: KafkaAdminClient) -> None:
        self.bootstrap, self.admin = kafka_bootstrap, kafkaAdmin

    def makeRows(self, ids: Any) -> pa.RecordBatch:
        return pa.record_batch({"value": pa.array([str(i) for i in ids], pa.string())})

    def newTarget(self) -> dict[str, str]:
        return {
            "kafka.bootstrap.servers": self.bootstrap,
            "topic": createTopic(self.bootstrap, prefix="contract"),
            "transactionalIdPrefix": unique("contract"),
        }

    def readCommitted(self, options: Mapping[str, str]) -> pa.Table:
        records = readTopic(self.bootstrap, options["topic"])
        return pa.table({"id": pa.array([int(r.value) for r in records], pa.int64())})

    def leftovers(self, options: Mapping[str, str]) -> list[Any]:
        prefix = options["transactionalIdPrefix"] + "-"
        listed = self.admin.list_transactions(state_filters=list(OPEN_STATES))
        return sorted(
            str(t.transactional_id)
            for rows in listed.values()
            for t in rows
            if str(t.transactional_id).startswith(prefix)
        )


class TestFilesOnS3Contract(SinkContract):
    """Multipart uploads: a prepared task is an upload started and not completed."""

    sink = FilesSink

    @pytest.fixture(autouse=True)
    def _server(self, s3: S3Service) -> Iterator[None]:
        self.s3, self.fs, self.prefixes = s3, s3.filesystem(), list[str]()
        yield
        calls = S3Calls(self.fs)
        for prefix in self.prefixes:
            for upload in calls.pendingUploads(s3.bucket, prefix + "/"):
                calls.abort(s3.bucket, upload.key, upload.uploadId)
            if self.fs.exists(f"{s3.bucket}/{prefix}"):
                self.fs.rm(f"{s3.bucket}/{prefix}", recursive=True)

    def newTarget(self) -> dict[str, str]:
        prefix = f"contract-files-s3/{uuid.uuid4().hex[:10]}"
        self.prefixes.append(prefix)
        return {"path": self.s3.url(f"{prefix}/out"), **self.s3.options()}

    def readCommitted(self, options: Mapping[str, str]) -> pa.Table:
        self.fs.invalidate_cache()
        root = options["path"].removeprefix("s3://")
        if not self.fs.exists(root):
            return self.schema.empty_table()
        return pq.read_table(root, filesystem=self.fs, schema=self.schema)

    def leftovers(self, options: Mapping[str, str]) -> list[Any]:
        bucket, _, key = options["path"].removeprefix("s3://").partition("/")
        prefix = key.rsplit("/", 1)[0] + "/"
        return [u.key for u in S3Calls(self.fs).pendingUploads(bucket, prefix)]
