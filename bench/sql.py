"""``make bench-sql``: the same rows into MariaDB five ways, at 8 and at 200 partitions.

(a) the ``twophase.sql`` sink (exactly-once: multi-row INSERTs into XA transactions, committed
    from the driver);
(b) Spark's JDBC writer inside ``foreachBatch`` (at-least-once), MariaDB Connector/J from Maven
    Central (``spark.jars.packages``) on a ``jdbc:mysql:`` URL (so Spark's MySQL dialect
    applies), ``rewriteBatchedStatements=true``;
(c) raw pymysql ``executemany`` (multi-row INSERTs) of the same rows on one connection, outside
    Spark: the driver's own ceiling;
(d) Spark's ``noop`` sink: the cost of producing the rows in Spark at all;
(e) ``bench.drop``, a Python sink that reads its input and drops it: what PySpark charges any
    Python sink, so ((a) - (e)) / tasks is what ``twophase.sql`` itself costs per task, in wall
    time and in the Python workers' CPU time (which other load on the machine hardly moves).

(a), (b), (d) and (e) run the same streaming query (``twophase.sequence`` source, same batches
and partitions, ``trigger(availableNow=True)``), each warmed up first on a small run. Prints one
table per partition count with rows/s, the ratios (a)/(b), (a)/(c), (a)/(d) and twophase's own
time per task.

``--per-task`` (``bench/sql_tasks.py``) measures instead, outside Spark, where one task's time
goes: ``--tasks`` task attempts of ``--rows-per-task`` rows run through ``SqlWriter`` in one
process, as in a reused PySpark worker (the writer unpickled for each), with the drivers' calls
timed (TLS context, connect, each statement, close) and the rest counted as Python. ``--url``
picks the server (default MariaDB; a ``postgresql+psycopg`` URL works too).

Needs MariaDB: ``make services`` (TWOPHASE_MARIADB_URL from the environment or .services.env).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench._common import (
    CpuSeconds,
    Result,
    commitLine,
    measureCpu,
    sequenceStream,
    serviceValue,
)
from bench.sql_tasks import perTaskBreakdown

JDBC_DRIVER = "org.mariadb.jdbc:mariadb-java-client:3.5.7"
TABLE_DDL = "CREATE TABLE {} (id BIGINT, payload TEXT, value DOUBLE, ts DATETIME(6)) ENGINE=InnoDB"
COLUMNS = ["id", "payload", "double(id) * 1.5 AS value", "timestamp_seconds(id) AS ts"]


def mariadbUrl() -> str:
    return serviceValue("TWOPHASE_MARIADB_URL")


def resetTable(engine: sa.Engine, name: str) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        conn.exec_driver_sql(TABLE_DDL.format(name))


def countRows(engine: sa.Engine, name: str) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql(f"SELECT count(*) FROM {name}").scalar() or 0)


def runTwophase(spark: Any, url: str, table: str, ckpt: str, shape: tuple[int, int, int]) -> float:
    started = time.perf_counter()
    query = (
        sequenceStream(spark, *shape, *COLUMNS)
        .writeStream.format("twophase.sql")
        .option("url", url)
        .option("dbtable", table)
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - started


def jdbcTarget(url: str) -> tuple[str, dict[str, str]]:
    """Spark's JDBC URL and properties for the MariaDB of the SQLAlchemy ``url``."""
    u = sa.make_url(url)
    # jdbc:mysql (permitMysqlScheme): Spark's MySQL dialect (backquoted names) takes the URL.
    jdbc = f"jdbc:mysql://{u.host}:{u.port}/{u.database}?permitMysqlScheme&rewriteBatchedStatements=true"
    props = {
        "user": u.username or "",
        "password": u.password or "",
        "driver": "org.mariadb.jdbc.Driver",
    }
    return jdbc, props


def runJdbc(spark: Any, url: str, table: str, ckpt: str, shape: tuple[int, int, int]) -> float:
    jdbc, props = jdbcTarget(url)

    def writeBatch(df: Any, batchId: int) -> None:
        df.write.option("batchsize", 1000).jdbc(jdbc, table, mode="append", properties=props)

    started = time.perf_counter()
    query = (
        sequenceStream(spark, *shape, *COLUMNS)
        .writeStream.foreachBatch(writeBatch)
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - started


def runNoop(spark: Any, ckpt: str, shape: tuple[int, int, int]) -> float:
    started = time.perf_counter()
    query = (
        sequenceStream(spark, *shape, *COLUMNS)
        .writeStream.format("noop")
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - started


def runDrop(spark: Any, ckpt: str, shape: tuple[int, int, int]) -> float:
    started = time.perf_counter()
    query = (
        sequenceStream(spark, *shape, *COLUMNS)
        .writeStream.format("bench.drop")
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - started


def withCpu(run: Callable[..., float], *args: Any) -> tuple[float, CpuSeconds]:
    """``run(*args)``'s seconds and the CPU seconds spent meanwhile, by role."""
    with measureCpu() as spent:
        seconds = run(*args)
    return seconds, spent


def runRaw(url: str, table: str, rows: int, chunk: int = 1000) -> float:
    """One pymysql connection, ``executemany`` of ``chunk`` rows (one multi-row INSERT each),
    one commit per 100,000 rows; rows made in Python as the sink's writer gets them."""
    import datetime as dt

    import pymysql

    u = sa.make_url(url)
    epoch = dt.datetime(1970, 1, 1)
    started = time.perf_counter()
    conn = pymysql.connect(
        host=u.host, port=u.port or 3306, user=u.username, password=u.password or "",
        database=u.database, init_command="SET time_zone = '+00:00'",
    )  # fmt: skip
    try:
        with conn.cursor() as cur:
            statement = f"INSERT INTO {table} (id, payload, value, ts) VALUES (%s, %s, %s, %s)"
            for start in range(0, rows, chunk):
                batch = [
                    (i, f"row-{i}", i * 1.5, epoch + dt.timedelta(seconds=i))
                    for i in range(start, min(rows, start + chunk))
                ]
                cur.executemany(statement, batch)
                if (start + chunk) % 100_000 == 0:
                    conn.commit()
        conn.commit()
    finally:
        conn.close()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.sql", description=__doc__)
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--rows-per-batch", type=int, default=100_000)
    p.add_argument("--partitions", type=int, nargs="+", default=[8, 200])
    p.add_argument("--master", default="local[2]")
    p.add_argument("--keep", action="store_true", help="keep the tables and checkpoints")
    p.add_argument("--per-task", action="store_true", help="where one task's time goes")
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--rows-per-task", type=int, default=100)
    p.add_argument("--url", help="SQLAlchemy URL for --per-task (default: the MariaDB)")
    args = p.parse_args(argv)
    url = mariadbUrl()
    if args.per_task:
        where = sa.make_url(args.url or url).get_backend_name()
        print(f"{args.tasks} tasks of {args.rows_per_task} rows into {where}, one process:")
        print(perTaskBreakdown(args.url or url, args.tasks, args.rows_per_task), flush=True)
        return 0
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")

    from pyspark.sql import SparkSession

    import twophase
    from bench.drop import DropSink

    spark = (
        SparkSession.builder.master(args.master)
        .appName("twophase-bench-sql")
        .config("spark.ui.enabled", "false")
        .config("spark.jars.packages", JDBC_DRIVER)
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    twophase.register(spark)
    spark.dataSource.register(DropSink)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    work = Path(tempfile.mkdtemp(prefix="twophase-bench-sql-"))
    tables = [f"bench_sql_{k}" for k in ("twophase", "jdbc", "raw", "warm_a", "warm_b")]
    status = 0
    try:
        raw: Result | None = None
        for parts in args.partitions:
            for name in tables:
                resetTable(engine, name)
            spark.conf.set("spark.sql.shuffle.partitions", str(parts))
            warm = (max(parts * 100, 10_000), max(parts * 100, 10_000), parts)
            print(f"warming up at {parts} partitions ({warm[0]:,} rows)...", flush=True)
            runTwophase(spark, url, "bench_sql_warm_a", str(work / f"wa{parts}"), warm)
            runJdbc(spark, url, "bench_sql_warm_b", str(work / f"wb{parts}"), warm)
            runNoop(spark, str(work / f"wn{parts}"), warm)
            runDrop(spark, str(work / f"we{parts}"), warm)
            shape = (args.rows, args.rows_per_batch, parts)
            print(f"measuring: {args.rows:,} rows, batches of {args.rows_per_batch:,}, "
                  f"{parts} partitions, master {args.master}", flush=True)  # fmt: skip
            tp = str(work / f"tp{parts}")
            cpu: dict[str, CpuSeconds] = {}
            seconds, cpu["a"] = withCpu(runTwophase, spark, url, tables[0], tp, shape)
            a = Result("(a) twophase.sql", args.rows, seconds)
            jdbcCkpt = str(work / f"jdbc{parts}")
            seconds, cpu["b"] = withCpu(runJdbc, spark, url, tables[1], jdbcCkpt, shape)
            b = Result("(b) Spark JDBC in foreachBatch", args.rows, seconds)
            if raw is None:  # the raw driver does not depend on the partitions
                raw = Result(
                    "(c) raw pymysql executemany", args.rows, runRaw(url, tables[2], args.rows)
                )
            seconds, cpu["d"] = withCpu(runNoop, spark, str(work / f"n{parts}"), shape)
            d = Result("(d) Spark noop sink", args.rows, seconds)
            seconds, cpu["e"] = withCpu(runDrop, spark, str(work / f"e{parts}"), shape)
            e = Result("(e) bench.drop (Python, no-op)", args.rows, seconds)
            for key, result in ((tables[0], a), (tables[1], b)):
                written = countRows(engine, key)
                if written != args.rows:
                    raise SystemExit(
                        f"{result.name} wrote {written:,} rows, expected {args.rows:,}"
                    )
            print()
            print(f"{parts} partitions:")
            print(f"| {'writer':<32} | {'rows':>9} | {'seconds':>7} | {'rows/s':>9} "
                  f"| CPU s: Python workers | JVM |")  # fmt: skip
            print(f"| {'-' * 32} | {'-' * 9} | {'-' * 7} | {'-' * 9} | ---: | ---: |")
            for key, r in (("a", a), ("b", b), ("c", raw), ("d", d), ("e", e)):
                spent = cpu.get(key)
                used = f"{spent.workers:.1f} | {spent.jvm:.1f}" if spent else "- | -"
                print(f"| {r.name:<32} | {r.rows:>9,} | {r.seconds:>7.1f} | {r.rate:>9,.0f} "
                      f"| {used} |")  # fmt: skip
            ratios = {
                "(a)/(b)": (a, b),
                "(a)/(c)": (a, raw),
                "(a)/(d)": (a, d),
                "(b)/(c)": (b, raw),
            }
            print("   ".join(f"{k} = {x.rate / y.rate:.2f}" for k, (x, y) in ratios.items()))
            tasks = -(-args.rows // args.rows_per_batch) * parts
            overCpu = (cpu["a"].workers - cpu["e"].workers) / tasks * 1e3
            print(f"(a) over (e), per task ({tasks} tasks): "
                  f"{(a.seconds - e.seconds) / tasks * 1e3:.1f} ms of wall time, "
                  f"{overCpu:.1f} ms of Python workers' CPU")  # fmt: skip
            print(f"(a) driver commit time per batch: {commitLine(tp)}")
            print(flush=True)
    finally:
        spark.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            with engine.begin() as conn:
                for name in tables:
                    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        engine.dispose()
    return status


if __name__ == "__main__":
    raise SystemExit(main())
