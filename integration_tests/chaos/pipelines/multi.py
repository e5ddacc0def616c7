"""The multi sink's pipeline: sequence -> PostgreSQL, Kafka, a Delta and an Iceberg table and
Parquet files, one decision.

Target ``orders`` is a PostgreSQL table (``id``, ``payload``; partition 0 prepared, the others
staged), target ``events`` a Kafka topic (key = id, value = payload) and target ``ledger`` a
Delta table on the pipeline's disk (``id``, ``payload``; one Delta commit per batch after the
parts' commits, so the schedule covers ``driver.beforeCompleteBatch`` too) and target ``lake``
an Iceberg table beside it (a SQLite catalog; one snapshot per batch, after the Delta commit),
target ``archive`` Parquet files committed by a local rename, target ``bucket`` Parquet files on
the S3 server by multipart uploads completed at the commit (when the servers have one): every
batch lands in all six or in none. The schedule kills PostgreSQL, the broker and the S3
server, and has
outages: the query kept down after a decision for longer than the Kafka target's transaction
timeout, so the broker aborts the decided batch's transactions, the restart writes them again
from Spark's replay, and PostgreSQL's prepared half waits. Verified by ``twophase verify --sink
multi``: each target against the source, then the targets joined on the id.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from integration_tests.chaos.pipelines.base import SOCKET_TIMEOUT, Pipeline
from integration_tests.chaos.pipelines.files import newS3Output
from integration_tests.chaos.pipelines.iceberg import icebergOptions
from integration_tests.chaos.pipelines.kafka import (
    KAFKA_TIMEOUT_MS,
    PAST_TIMEOUT_SECONDS,
    boundedKafka,
    newOutputTopic,
)
from integration_tests.chaos.pipelines.postgres import newTable
from integration_tests.chaos.spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import DataStreamWriter

    from integration_tests.chaos.servers import Services

TARGETS = "orders=postgres,events=kafka,ledger=delta,lake=iceberg,archive=files,bucket=files"
STORE_TARGETS = "orders=postgres,events=kafka,ledger=delta,archive=files"
"""The targets when the files are on an object store (``PipelineSpec.storeUrl``): there
``ledger`` and ``archive`` are on the S3 server already."""
BUCKET = "bucket."
"""The prefix of the ``bucket`` target's options: its ``path`` and its ``fs.*`` (kept in
``PipelineSpec.sinkOptions``, so ``twophase verify`` gets them too)."""


def multiOptions(spec: PipelineSpec) -> dict[str, str]:
    """The ``multi`` pipeline's sink options, as ``twophase verify --sink multi`` takes them."""
    options = {
        "targets": STORE_TARGETS if spec.storeUrl else TARGETS,
        "orders.url": spec.pgUrl,
        "orders.table": spec.table,
        "events.kafka.bootstrap.servers": spec.bootstrap,
        "events.topic": spec.outputTopic,
        "ledger.path": spec.outputLocation,
        "archive.path": f"{spec.outputLocation}-files",
    }
    for target in ("ledger", "archive"):
        options.update({f"{target}.{k}": v for k, v in spec.storeOptions.items()})
    if not spec.storeUrl:
        options.update(icebergOptions(spec, "lake."))
        options[f"{BUCKET}path"] = spec.s3Path
        options.update({k: v for k, v in spec.sinkOptions.items() if k.startswith(BUCKET)})
    return options


class MultiPipeline(Pipeline):
    """sequence -> twophase.multi: a PostgreSQL table, a Kafka topic, a Delta and an Iceberg
    table, Parquet files on the local disk and on S3, one decision."""

    name = "multi"
    servers = ("postgres", "broker", "s3")
    completesBatches = True
    outageSeconds = PAST_TIMEOUT_SECONDS
    kafkaTimeoutSeconds = KAFKA_TIMEOUT_MS / 1000

    def prepare(self, spec: PipelineSpec, services: Services) -> None:
        newTable(spec, services)
        spec.sinkOptions.update(boundedKafka("events."))
        spec.sinkOptions["orders.socketTimeout"] = SOCKET_TIMEOUT
        newOutputTopic(spec, services)
        newS3Output(spec, services, "bucket", BUCKET)

    def sink(self, stream: DataFrame, spec: PipelineSpec) -> DataStreamWriter:
        from pyspark.sql import functions as F

        options = multiOptions(spec)
        stream = stream.select(
            F.struct("id", "payload").alias("orders"),
            F.struct(
                F.col("id").cast("string").alias("key"), F.col("payload").alias("value")
            ).alias("events"),
            *(
                F.struct("id", "payload").alias(name)
                for name in ("ledger", "lake", "archive", "bucket")
                if f"{name}=" in options["targets"]
            ),
        )
        if not spec.storeUrl:
            os.makedirs(f"{spec.output}-iceberg", exist_ok=True)
        return (
            stream.writeStream.format("twophase.multi")
            .options(**options)
            .option("orders.createTable", "true")
            # partition 0 prepares, the others stage: both commit paths in every batch
            .option("orders.maxPreparedPartitions", "1")
        )

    def doctorOptions(self, spec: PipelineSpec) -> dict[str, str]:
        return {**spec.sinkOptions, "orders.url": spec.pgUrl}

    def liveTopic(self, spec: PipelineSpec) -> str | None:
        return spec.outputTopic

    def liveExpected(self, spec: PipelineSpec) -> Any:
        from twophase import verify

        return verify.asKafkaRecords(self.expected(spec))

    def verify(self, spec: PipelineSpec) -> Any:
        from twophase import verify

        return verify.verify(
            "sequence", {"start": "0", "end": str(spec.rows)}, "multi", multiOptions(spec)
        )


MULTI = MultiPipeline()
