"""The compatibility suite: twophase beside each PySpark it supports (3.5 to 4.3), kept short.

For each built-in sink (files, Kafka, PostgreSQL; marked ``allsinks``: MariaDB through
``twophase.sql``, Delta, Iceberg, files on S3, and ``twophase.multi`` over PostgreSQL and Kafka)
and each way of writing (``twophase.foreachBatch`` on every version, ``writeStream.format`` on
4.0+), one query is SIGKILLed with its driver once the batch it is writing is decided and not
yet committed (``driver.afterDecision`` of batch 1), restarted from the same checkpoint, and
must end with every row exactly once in every target and nothing left prepared. The queries
read Spark's own JSON file source (``spark_harness``'s ``--source files``), which every version
has. One more test checks what ``twophase.register`` does on
this PySpark: refuse on 3.5 naming ``foreachBatch``, register the sinks alone on 4.0 and 4.1
and say why, run the ``twophase.sequence`` source from 4.2 on.

Marked ``compat``: ``make test-compat`` runs it under PySpark 3.5, 4.0, 4.1, 4.2 and 4.3 (one
cached venv each); ``pytest -m compat integration_tests`` runs it under the venv's PySpark.
``make test`` runs the first three sinks only (``COMPAT_SINKS=core``), for its time budget.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

import twophase
from integration_tests.conftest import S3Service
from integration_tests.sink_outputs import FILES, FILES_SINK, exactlyOnceReport, readFilesOutput
from integration_tests.spark_harness import FILES_SOURCE, FOREACH_BATCH, Harness
from integration_tests.test_kafka_helpers import createTopic, readTopic
from integration_tests.test_kafka_spark import openTransactions, sequenceTable
from twophase.spark import versions
from twophase.verify.held import readSink

pytestmark = [pytest.mark.compat, pytest.mark.timeout(600)]

ROWS = 600
ROWS_PER_BATCH = 200
PARTITIONS = 2
KILL = "driver.afterDecision:1"
"""Batch 1 decided in the log, none of its transactions committed: the restart must commit
them, not write the batch again."""


IDENTITY = ("id", "payload")
HINTS = pa.schema([("id", pa.int64()), ("payload", pa.string())])


@dataclass
class Target:
    """A built-in sink as the suite drives it: its class, options and input columns, what a
    reader sees of its output (``id``, ``payload``) and what it left prepared."""

    spec: str
    read: Callable[[Path], pa.Table]
    leftovers: Callable[[Path], list[Any]]
    options: dict[str, str] = field(default_factory=dict)
    columns: dict[str, str] = field(default_factory=dict)
    more: dict[str, Callable[[Path], pa.Table]] = field(default_factory=dict)
    """Other targets of one decision (``twophase.multi``), by name, read the same way."""


def held(sink: str, options: dict[str, str]) -> Callable[[Path], pa.Table]:
    """What ``twophase verify`` reads of one sink (``id``, ``payload``)."""

    def read(_: Path) -> pa.Table:
        table, _ = readSink(sink, options, IDENTITY, HINTS)
        return table.select(list(IDENTITY))

    return read


def nothing(_: Path) -> list[Any]:
    """Iceberg holds nothing prepared outside the table: a staged file the table's metadata
    never names is invisible to its readers (the exactly-once check reads through them)."""
    return []


@pytest.fixture
def files() -> Target:
    return Target(FILES_SINK, readFilesOutput, lambda output: FILES.prepared(output, None))


@pytest.fixture
def s3files(s3: S3Service) -> Iterator[Target]:
    from twophase.sinks.files.s3 import S3Calls

    prefix = f"it-compat/{uuid.uuid4().hex[:10]}"
    options = {"path": s3.url(f"{prefix}/out"), **s3.options()}
    calls = S3Calls(s3.filesystem())
    yield Target(
        FILES_SINK,
        held("files", options),
        lambda _: [u.key for u in calls.pendingUploads(s3.bucket, prefix + "/")],
        options,
    )
    fs = s3.filesystem()
    if fs.exists(f"{s3.bucket}/{prefix}"):
        fs.rm(f"{s3.bucket}/{prefix}", recursive=True)


@pytest.fixture
def sql(mariadb_url: str) -> Iterator[Target]:
    import sqlalchemy as sa

    from twophase.sinks.relational.naming import sinkPrefix

    table = f"it_compat_{uuid.uuid4().hex[:8]}"
    sinkId = f"it-compat-{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(mariadb_url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {table} (id BIGINT NOT NULL, payload TEXT)")

    def prepared(_: Path) -> list[Any]:
        with engine.connect() as conn:
            xids = [bytes(r[3]).decode() for r in conn.exec_driver_sql("XA RECOVER")]
        return [x for x in xids if x.startswith(sinkPrefix(sinkId))]

    options = {"url": mariadb_url, "dbtable": table, "sinkId": sinkId}
    yield Target("twophase.spark.declared:SqlSink", held("sql", options), prepared, options)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
    engine.dispose()


@pytest.fixture
def delta(tmp_path: Path) -> Target:
    table = tmp_path / "delta"
    options = {"path": str(table)}
    return Target(
        "twophase.spark.declared:DeltaSink",
        held("delta", options),
        lambda _: FILES.prepared(table, None),  # staged beside the table, as the files sink
        options,
    )


@pytest.fixture
def iceberg(tmp_path: Path) -> Target:
    (tmp_path / "iceberg").mkdir()
    options = {
        "table": "compat.events",
        "catalog.type": "sql",
        "catalog.uri": f"sqlite:///{tmp_path / 'iceberg'}/catalog.db",
        "catalog.warehouse": f"file://{tmp_path / 'iceberg'}/warehouse",
    }
    return Target("twophase.spark.iceberg:IcebergSink", held("iceberg", options), nothing, options)


@pytest.fixture
def multi(postgres: Target, kafka: Target) -> Target:
    """One decision over a PostgreSQL table and a Kafka topic: both hold every row once."""
    options = {"targets": "orders=postgres,events=kafka"}
    options.update({f"orders.{k}": v for k, v in postgres.options.items()})
    options.update({f"events.{k}": v for k, v in kafka.options.items()})

    def leftovers(output: Path) -> list[Any]:
        return postgres.leftovers(output) + kafka.leftovers(output)

    return Target(
        "twophase.spark.multi:MultiSink",
        postgres.read,
        leftovers,
        options,
        {
            "orders": "named_struct('id', id, 'payload', payload)",
            "events": "named_struct('key', CAST(id AS STRING), 'value', payload)",
        },
        more={"events": kafka.read},
    )


@pytest.fixture
def kafka(kafka_bootstrap: str) -> Target:
    topic = createTopic(kafka_bootstrap, partitions=2, prefix="it-compat")
    prefix = f"it-compat-{uuid.uuid4().hex[:8]}"
    return Target(
        "twophase.spark.kafka:KafkaSink",
        lambda _: sequenceTable(readTopic(kafka_bootstrap, topic)),
        lambda _: openTransactions(kafka_bootstrap, prefix),
        {
            "kafka.bootstrap.servers": kafka_bootstrap,
            "topic": topic,
            "transactionalIdPrefix": prefix,
        },
        {"key": "CAST(id AS STRING)", "value": "payload"},
    )


@pytest.fixture
def postgres(pg_url: str, pg_table: str) -> Target:
    sinkId = f"it-compat-{uuid.uuid4().hex[:8]}"

    def read(_: Path) -> pa.Table:
        with psycopg.connect(pg_url) as conn:
            rows = conn.execute(f"SELECT id, payload FROM {pg_table}").fetchall()
        return pa.table(
            {
                "id": pa.array([r[0] for r in rows], pa.int64()),
                "payload": pa.array([r[1] for r in rows], pa.string()),
            }
        )

    def prepared(_: Path) -> list[Any]:
        with psycopg.connect(pg_url) as conn:
            gids = conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"tp1:{sinkId}:%",)
            ).fetchall()
        return [g[0] for g in gids]

    return Target(
        "twophase.spark.declared:PostgresSink",
        read,
        prepared,
        {"url": pg_url, "table": pg_table, "createTable": "true", "sinkId": sinkId},
    )


MORE_SINKS = ("sql", "delta", "iceberg", "s3files", "multi")
"""Beyond files, Kafka and PostgreSQL: ``make test-compat`` runs them, ``make test`` does not."""


@pytest.mark.parametrize("via", [FOREACH_BATCH, "format"])
@pytest.mark.parametrize(
    "system",
    ["files", "kafka", "postgres"]
    + [pytest.param(name, marks=pytest.mark.allsinks) for name in MORE_SINKS],
)
def test_the_driver_killed_after_the_decision_restarts_exactly_once(
    system: str, via: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if via == "format" and not versions.DATA_SOURCES:
        pytest.skip(f"PySpark {versions.PYSPARK_VERSION} has no Python data sources")
    target: Target = request.getfixturevalue(system)
    query = Harness(
        tmp_path / "query",
        "local",
        sink=target.spec,
        rows=ROWS,
        rowsPerBatch=ROWS_PER_BATCH,
        partitions=PARTITIONS,
        via=via,
        source=FILES_SOURCE,
        options=target.options,
        columns=target.columns,
    )
    query.crashRun(KILL)
    query.restartUntilExhausted()
    want = {"rows": ROWS, "duplicates": 0, "missing": 0, "unexpected": 0, "wrongPayloads": 0}
    for name, read in {system: target.read, **target.more}.items():
        report = exactlyOnceReport(read(query.output), ROWS)
        assert report == want, f"{name} via {via}: {report}\n{query.describeRuns()}"
    assert target.leftovers(query.output) == [], f"{system} via {via} left prepared work"


@pytest.fixture
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("twophase-compat")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def test_register_registers_what_this_pyspark_runs(
    spark: Any, kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if not versions.DATA_SOURCES:
        with pytest.raises(versions.SparkVersionError, match=r"twophase\.foreachBatch"):
            twophase.register(spark)
        return
    with caplog.at_level(logging.WARNING, logger="twophase"):
        twophase.register(spark)
    skipped = [r.getMessage() for r in caplog.records if "registered the sinks only" in r.message]
    if not versions.STREAMING_READ_LIMITS:
        assert len(skipped) == 1 and "twophase.sequence" in skipped[0], skipped
        stream = (
            spark.readStream.format("twophase.kafka")
            .option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", "it-compat-never-read")
            .load()
        )
        with pytest.raises(Exception, match=r"needs PySpark 4\.2 or later"):
            query = stream.writeStream.format("noop").start()
            try:
                query.awaitTermination(120)
            finally:
                query.stop()
        return
    assert skipped == []
    output = tmp_path / "output"
    rows = spark.readStream.format("twophase.sequence").options(totalRows=300, rowsPerBatch=100)
    query = (
        rows.load()
        .writeStream.format("twophase.files")
        .options(path=str(output), checkpointLocation=str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    report = exactlyOnceReport(readFilesOutput(output), 300)
    assert report == {
        "rows": 300,
        "duplicates": 0,
        "missing": 0,
        "unexpected": 0,
        "wrongPayloads": 0,
    }
