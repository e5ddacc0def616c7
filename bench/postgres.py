"""``make bench-postgres``: the same rows into PostgreSQL three ways, in one run.

(a) the ``twophase.postgres`` sink (exactly-once: COPY into prepared transactions, commit from
    the driver);
(b) Spark's JDBC writer inside ``foreachBatch`` (at-least-once), with the PostgreSQL JDBC
    driver from Maven Central (``spark.jars.packages``) and ``reWriteBatchedInserts=true``;
(c) raw psycopg ``COPY`` of the same rows, generated with pyarrow, outside Spark.

(a) and (b) run the same streaming query (``twophase.sequence`` source, same batches and
partitions) with ``trigger(availableNow=True)``; each is warmed up first on a small run so JVM
start-up, jar download and Python worker start are not counted. Prints rows/s and the ratios,
then the driver commit time per batch of (a) (p50, p95), as ``twophase status`` reports it.

Needs the services: ``make services`` (TWOPHASE_PG_URL from the environment or .services.env).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from bench._common import Result, commitLine, pgUrl, sequenceStream
from twophase.sinks.postgres.staging import MARKERS_SUFFIX, STAGING_SUFFIX

JDBC_DRIVER = "org.postgresql:postgresql:42.7.14"
TABLE_DDL = "CREATE TABLE {} (id bigint, payload text, value double precision, ts timestamptz)"
COLUMNS = ["id", "payload", "double(id) * 1.5 AS value", "timestamp_seconds(id) AS ts"]


def _dropWithStaging(conn: psycopg.Connection[Any], name: str) -> None:
    """Drop a table and the staging and marker tables twophase.postgres made beside it."""
    for table in (name, *(name + suffix for suffix in (STAGING_SUFFIX, MARKERS_SUFFIX))):
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def resetTable(url: str, name: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        _dropWithStaging(conn, name)
        conn.execute(sql.SQL(TABLE_DDL).format(sql.Identifier(name)))


def dropTables(url: str, names: list[str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for name in names:
            _dropWithStaging(conn, name)


def countRows(url: str, name: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(name)))
        return int(row.fetchone()[0])  # type: ignore[index]


def jdbcTarget(url: str) -> tuple[str, dict[str, str]]:
    params = conninfo_to_dict(url)
    jdbc = (
        f"jdbc:postgresql://{params.get('host', 'localhost')}:{params.get('port', 5432)}/"
        f"{params['dbname']}?reWriteBatchedInserts=true"
    )
    props = {"user": str(params.get("user", "")), "driver": "org.postgresql.Driver"}
    if params.get("password"):
        props["password"] = str(params["password"])
    return jdbc, props


def stream(spark: Any, rows: int, rowsPerBatch: int, partitions: int) -> Any:
    return sequenceStream(spark, rows, rowsPerBatch, partitions, *COLUMNS)


def runTwophase(
    spark: Any, url: str, table: str, ckpt: str, rows: int, per: int, parts: int
) -> float:
    started = time.perf_counter()
    query = (
        stream(spark, rows, per, parts)
        .writeStream.format("twophase.postgres")
        .option("url", url)
        .option("table", table)
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - started


def runJdbc(spark: Any, url: str, table: str, ckpt: str, rows: int, per: int, parts: int) -> float:
    jdbc, props = jdbcTarget(url)

    def writeBatch(df: Any, batchId: int) -> None:
        df.write.jdbc(jdbc, table, mode="append", properties=props)

    started = time.perf_counter()
    query = (
        stream(spark, rows, per, parts)
        .writeStream.foreachBatch(writeBatch)
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - started


def runCopy(url: str, table: str, rows: int, chunk: int = 100_000) -> float:
    """One connection, one COPY, rows generated with pyarrow and encoded by its CSV writer."""
    import pyarrow.csv as pacsv

    options = pacsv.WriteOptions(include_header=False)
    started = time.perf_counter()
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        statement = sql.SQL("COPY {} (id, payload, value, ts) FROM STDIN (FORMAT csv)")
        with cur.copy(statement.format(sql.Identifier(table))) as copy:
            for start in range(0, rows, chunk):
                ids = pa.array(range(start, min(rows, start + chunk)), pa.int64())
                batch = pa.record_batch(
                    {
                        "id": ids,
                        "payload": pc.binary_join_element_wise("row-", ids.cast(pa.string()), ""),
                        "value": pc.multiply(ids.cast(pa.float64()), 1.5),
                        "ts": pc.multiply(ids, 1_000_000).cast(pa.timestamp("us", tz="UTC")),
                    }
                )
                out = io.BytesIO()
                pacsv.write_csv(batch, out, options)
                copy.write(out.getbuffer())
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.postgres", description=__doc__)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--rows-per-batch", type=int, default=250_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--keep", action="store_true", help="keep the tables and checkpoints")
    args = p.parse_args(argv)
    url = pgUrl()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")

    from pyspark.sql import SparkSession

    import twophase

    spark = (
        SparkSession.builder.master(args.master)
        .appName("twophase-bench-postgres")
        .config("spark.ui.enabled", "false")
        .config("spark.jars.packages", JDBC_DRIVER)
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    twophase.register(spark)
    work = Path(tempfile.mkdtemp(prefix="twophase-bench-pg-"))
    tables = {k: f"bench_pg_{k}" for k in ("twophase", "jdbc", "copy", "warm_a", "warm_b")}
    try:
        for name in tables.values():
            resetTable(url, name)
        warm = max(args.partitions * 1000, 10_000)
        print(f"warming up (twophase and JDBC, {warm:,} rows each)...", flush=True)
        runTwophase(spark, url, tables["warm_a"], str(work / "warm_a"), warm, warm, args.partitions)
        runJdbc(spark, url, tables["warm_b"], str(work / "warm_b"), warm, warm, args.partitions)

        shape = (args.rows, args.rows_per_batch, args.partitions)
        print(f"measuring: {args.rows:,} rows, batches of {args.rows_per_batch:,}, "
              f"{args.partitions} partitions, master {args.master}", flush=True)  # fmt: skip
        runs: list[tuple[str, str, Callable[[], float]]] = [
            ("(b) Spark JDBC in foreachBatch", "jdbc",
             lambda: runJdbc(spark, url, tables["jdbc"], str(work / "jdbc"), *shape)),
            ("(a) twophase.postgres sink", "twophase",
             lambda: runTwophase(spark, url, tables["twophase"], str(work / "tp"), *shape)),
            ("(c) raw psycopg COPY", "copy", lambda: runCopy(url, tables["copy"], args.rows)),
        ]  # fmt: skip
        results: dict[str, Result] = {}
        for label, key, run in runs:
            seconds = run()
            written = countRows(url, tables[key])
            if written != args.rows:
                raise SystemExit(f"{label} wrote {written:,} rows, expected {args.rows:,}")
            results[key] = Result(label, written, seconds)
            print(f"  {label}: {seconds:.1f} s", flush=True)

        a, b, c = results["twophase"], results["jdbc"], results["copy"]
        print()
        print(f"| {'writer':<34} | {'rows':>10} | {'seconds':>7} | {'rows/s':>10} |")
        print(f"| {'-' * 34} | {'-' * 10} | {'-' * 7} | {'-' * 10} |")
        for r in (a, b, c):
            print(f"| {r.name:<34} | {r.rows:>10,} | {r.seconds:>7.1f} | {r.rate:>10,.0f} |")
        print()
        print(f"(a) / (b) = {a.rate / b.rate:.2f}  (target >= 0.9)")
        print(f"(a) / (c) = {a.rate / c.rate:.2f}")
        print(f"(b) / (c) = {b.rate / c.rate:.2f}")
        print(f"(a) driver commit time per batch: {commitLine(str(work / 'tp'))}")
        return 0 if a.rate >= 0.9 * b.rate else 1
    finally:
        spark.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            dropTables(url, list(tables.values()))


if __name__ == "__main__":
    raise SystemExit(main())
