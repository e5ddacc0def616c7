"""One start of a chaos pipeline: a child process that runs one streaming query until drained.

``python -m integration_tests.chaos.pipeline <spec.json>`` reads a :class:`PipelineSpec` and runs

- ``files``:    twophase.sequence -> twophase.files (Parquet)
- ``s3``:       twophase.sequence -> twophase.files (Parquet) on ``s3://`` (multipart uploads)
- ``postgres``: twophase.sequence -> twophase.postgres (partition 0 in a prepared transaction,
  the others staged: both commit paths)
- ``kafka``:    twophase.sequence -> twophase.kafka (key = id, value = payload)
- ``mariadb``:  twophase.sequence -> twophase.sql on MariaDB (XA transactions)
- ``kafka-kafka``: twophase.kafka source (read_committed) -> twophase.kafka sink (key, value)
- ``multi``:    twophase.sequence -> twophase.multi: target ``orders`` a PostgreSQL table
  (``id``, ``payload``; partition 0 prepared, the others staged) and target ``events`` a Kafka
  topic (key = id, value = payload), every batch in both or in neither

in ``local-cluster[2,1,1024]`` (two executor JVMs, tasks in separate processes, as on a real
cluster) with ``Trigger.availableNow``, so one start ends when the source is drained. It calls
``faults.markQueryProcessGroup()`` before Spark starts: a ``driver.*`` crash point
(``TWOPHASE_CRASH_AT`` with ``TWOPHASE_CRASH_ONCE_DIR``) then kills the driver, its Python
workers and the executors together, like a power cut; the parent kills the same session for a
timed driver crash. Exit 0: drained; 3: the query failed (its error on stderr).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from integration_tests.chaos.spec import PipelineSpec
from integration_tests.spark_processes import QUERY_FAILED, awaitDrained, sessionBuilder
from twophase import faults

PIPELINES = ("files", "postgres", "kafka", "kafka-kafka", "multi", "s3", "mariadb")

__all__ = ["PIPELINES", "QUERY_FAILED", "PipelineSpec", "run"]


def run(spec: PipelineSpec) -> int:
    faults.markQueryProcessGroup()  # before Spark: the JVM and every worker inherit it
    import twophase

    builder = (
        sessionBuilder(spec.master, f"twophase-chaos-{spec.pipeline}", spec.partitions)
        .config("spark.sql.session.timeZone", "UTC")
        # A killed executor is replaced; the app must survive every kill of a long soak.
        .config("spark.deploy.maxExecutorRetries", "-1")
        .config("spark.task.maxFailures", "8")
    )
    for key, value in spec.sparkConf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    twophase.register(spark)
    if spec.pipeline == "kafka-kafka":
        stream = (
            spark.readStream.format("twophase.kafka")
            .option("kafka.bootstrap.servers", spec.bootstrap)
            .option("subscribe", spec.inputTopic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", spec.rowsPerBatch)
            .load()
            .selectExpr("key", "value")
        )
    else:
        stream = (
            spark.readStream.format("twophase.sequence")
            .option("totalRows", spec.rows)
            .option("rowsPerBatch", spec.rowsPerBatch)
            .option("numPartitions", spec.partitions)
            .load()
        )
    if spec.pipeline in ("files", "s3"):
        output = spec.s3Path if spec.pipeline == "s3" else spec.output
        writer = stream.writeStream.format("twophase.files").option("path", output)
    elif spec.pipeline == "postgres":
        writer = (
            stream.writeStream.format("twophase.postgres")
            .option("url", spec.pgUrl)
            .option("table", spec.table)
            .option("createTable", "true")
            # partition 0 prepares, the others stage: both commit paths in every batch
            .option("maxPreparedPartitions", "1")
        )
    elif spec.pipeline == "mariadb":
        writer = (
            stream.writeStream.format("twophase.sql")
            .option("url", spec.sqlUrl)
            .option("dbtable", spec.table)
            .option("createTable", "true")
        )
    elif spec.pipeline in ("kafka", "kafka-kafka"):
        if spec.pipeline == "kafka":
            stream = stream.selectExpr("cast(id as string) AS key", "payload AS value")
        writer = (
            stream.writeStream.format("twophase.kafka")
            .option("kafka.bootstrap.servers", spec.bootstrap)
            .option("topic", spec.outputTopic)
        )
    elif spec.pipeline == "multi":
        from pyspark.sql import functions as F

        stream = stream.select(
            F.struct("id", "payload").alias("orders"),
            F.struct(
                F.col("id").cast("string").alias("key"), F.col("payload").alias("value")
            ).alias("events"),
        )
        writer = (
            stream.writeStream.format("twophase.multi")
            .option("targets", "orders=postgres,events=kafka")
            .option("orders.url", spec.pgUrl)
            .option("orders.table", spec.table)
            .option("orders.createTable", "true")
            # partition 0 prepares, the others stage: both commit paths in every batch
            .option("orders.maxPreparedPartitions", "1")
            .option("events.kafka.bootstrap.servers", spec.bootstrap)
            .option("events.topic", spec.outputTopic)
        )
    else:
        raise SystemExit(f"unknown pipeline {spec.pipeline!r}; one of {', '.join(PIPELINES)}")
    writer = writer.options(**spec.sinkOptions).option("checkpointLocation", spec.checkpoint)
    query = writer.trigger(availableNow=True).start()
    return awaitDrained(spark, query)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("spec", help="JSON file of a PipelineSpec")
    return run(PipelineSpec.load(Path(parser.parse_args(argv).spec)))


if __name__ == "__main__":
    raise SystemExit(main())
