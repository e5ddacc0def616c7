"""The PyFlink side of ``make bench``: one exactly-once Flink job per call, timed.

Runs under the bench's own PyFlink venv (``bench.bench`` creates it), so it imports only pyflink
and the standard library. Usage::

    flink_jobs.py {kafka,jdbc,files} --rows N --parallelism P --checkpoint-ms MS \
        --jars a.jar,b.jar --target T [--warm-target W --warm-rows M] [target options]

Every job reads the same rows as the Spark side, ``id`` 0..N-1 from Flink's
``NumberSequenceSource`` (a JVM source, no Python in the data path), shaped with Flink SQL:

- ``kafka``: key ``<id>``, value ``row-<id>`` right-padded with ``.`` to ``--value-bytes``,
  through the Kafka SQL connector, which is Flink's ``KafkaSink`` with
  ``sink.delivery-guarantee = exactly-once`` (transactions committed on checkpoints);
- ``jdbc``: ``(id, payload, value, ts)`` as ``bench.postgres`` writes them, through
  flink-connector-jdbc's ``JdbcSink`` built with ``buildExactlyOnce`` (XA on PostgreSQL,
  one transaction per connection, prepared on checkpoint, committed when it completes);
- ``files``: ``(id, payload)`` through the SQL ``filesystem`` connector (the ``FileSink``
  machinery: in-progress files become visible when a checkpoint completes), CSV, since
  Parquet needs Hadoop on the classpath.

Checkpointing is on, exactly-once, every ``--checkpoint-ms``; the input is bounded, so the job
ends with a final checkpoint that commits the last records. What is timed: from submitting the
job to ``execute`` returning (that final commit included), after a warm-up run of the same job
into ``--warm-target`` in the same JVM. Prints one JSON line ``{"rows", "seconds", ...}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def environment(args: argparse.Namespace) -> tuple[Any, Any]:
    from pyflink.common import Configuration
    from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
    from pyflink.table import StreamTableEnvironment

    config = Configuration()
    config.set_string("pipeline.jars", ";".join(f"file://{j}" for j in args.jars.split(",")))
    config.set_string("restart-strategy.type", "none")  # fail, don't loop, on any error
    config.set_string("taskmanager.numberOfTaskSlots", str(args.parallelism))
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(args.parallelism)
    env.enable_checkpointing(args.checkpoint_ms, CheckpointingMode.EXACTLY_ONCE)
    return env, StreamTableEnvironment.create(env)


def sequence(env: Any, tenv: Any, rows: int, name: str) -> None:
    """Register view ``name`` with one BIGINT column ``id``: 0..rows-1."""
    from pyflink.common import WatermarkStrategy
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource

    stream = env.from_source(
        NumberSequenceSource(0, rows - 1), WatermarkStrategy.no_watermarks(), f"seq-{name}"
    )
    tenv.create_temporary_view(name, tenv.from_data_stream(stream).alias("id"))


def payload(valueBytes: int) -> str:
    return f"RPAD(CONCAT('row-', CAST(id AS STRING)), {valueBytes}, '.')"


def insert(env: Any, tenv: Any, rows: int, target: str, table: str, select: str) -> None:
    """``INSERT INTO`` a temporary table (``table``: its columns and ``WITH``) from the rows."""
    view = f"src_{abs(hash(target))}"
    sequence(env, tenv, rows, view)
    sink = f"sink_{abs(hash(target))}"
    tenv.execute_sql(f"CREATE TEMPORARY TABLE {sink} {table}")
    tenv.execute_sql(f"INSERT INTO {sink} SELECT {select} FROM {view}").wait()


def runKafka(env: Any, tenv: Any, args: argparse.Namespace, target: str, rows: int) -> None:
    table = f"""(k STRING, v STRING) WITH (
        'connector' = 'kafka', 'topic' = '{target}',
        'properties.bootstrap.servers' = '{args.bootstrap}',
        'key.format' = 'raw', 'key.fields' = 'k',
        'value.format' = 'raw', 'value.fields-include' = 'EXCEPT_KEY',
        'sink.delivery-guarantee' = 'exactly-once',
        'sink.transactional-id-prefix' = 'bench-flink-{target}',
        'properties.transaction.timeout.ms' = '600000')"""
    select = f"CAST(id AS STRING), {payload(args.value_bytes)}"
    insert(env, tenv, rows, target, table, select)


def runFiles(env: Any, tenv: Any, args: argparse.Namespace, target: str, rows: int) -> None:
    table = (
        "(id BIGINT, payload STRING) WITH ("
        f"'connector' = 'filesystem', 'path' = 'file://{target}', 'format' = 'csv')"
    )
    insert(env, tenv, rows, target, table, f"id, {payload(args.value_bytes)}")


def runJdbc(env: Any, tenv: Any, args: argparse.Namespace, target: str, rows: int) -> None:
    from pyflink.datastream.connectors.base import Sink
    from pyflink.java_gateway import get_gateway

    jvm = get_gateway().jvm
    view = f"src_{abs(hash(target))}"
    sequence(env, tenv, rows, view)
    table = tenv.sql_query(
        f"SELECT id, CONCAT('row-', CAST(id AS STRING)) AS payload, "
        f"CAST(id AS DOUBLE) * 1.5 AS `value`, CAST(TO_TIMESTAMP_LTZ(id, 0) AS TIMESTAMP(3)) "
        f"AS ts FROM {view}"
    )
    stream = tenv.to_data_stream(table)
    jdbc = jvm.org.apache.flink.connector.jdbc
    helpers = jvm.io.twophase.bench.BenchJdbc
    supplier = helpers.PgXaSupplier(args.jdbc_url, args.jdbc_user, args.jdbc_password)
    exactlyOnce = jdbc.JdbcExactlyOnceOptions.builder().withTransactionPerConnection(True).build()
    execution = (
        jdbc.JdbcExecutionOptions.builder()
        .withBatchSize(args.jdbc_batch)
        .withBatchIntervalMs(0)
        .withMaxRetries(0)
        .build()
    )
    sink = (
        jdbc.core.datastream.sink.JdbcSink.builder()
        .withExecutionOptions(execution)
        .withQueryStatement(
            f"INSERT INTO {target} (id, payload, value, ts) VALUES (?, ?, ?, ?)",
            helpers.RowStatementBuilder(),
        )
        .buildExactlyOnce(exactlyOnce, supplier)
    )
    stream.sink_to(Sink(sink))
    env.execute(f"bench-jdbc-{target}")


JOBS = {"kafka": runKafka, "files": runFiles, "jdbc": runJdbc}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="flink_jobs", description=__doc__)
    p.add_argument("job", choices=sorted(JOBS))
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--parallelism", type=int, default=8)
    p.add_argument("--checkpoint-ms", type=int, default=2000)
    p.add_argument("--jars", required=True, help="comma-separated absolute jar paths")
    p.add_argument("--target", required=True, help="topic, table or directory")
    p.add_argument("--warm-target", default="")
    p.add_argument("--warm-rows", type=int, default=10_000)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--bootstrap", default="")
    p.add_argument("--jdbc-url", default="")
    p.add_argument("--jdbc-user", default="")
    p.add_argument("--jdbc-password", default="")
    p.add_argument("--jdbc-batch", type=int, default=5000)
    args = p.parse_args(argv)
    job = JOBS[args.job]
    env, tenv = environment(args)
    warm = 0.0
    if args.warm_target:
        started = time.perf_counter()
        job(env, tenv, args, args.warm_target, args.warm_rows)
        warm = time.perf_counter() - started
        env, tenv = environment(args)
    started = time.perf_counter()
    job(env, tenv, args, args.target, args.rows)
    seconds = time.perf_counter() - started
    print(json.dumps({"job": args.job, "rows": args.rows, "seconds": seconds, "warm": warm}))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
