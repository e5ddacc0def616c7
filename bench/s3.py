"""``make bench-s3``: twophase.files on S3 (multipart upload) against Spark's own Parquet sink.

The same rows (``twophase.sequence``: id and a padded payload; same batches and partitions,
``trigger(availableNow=True)``) go, in one Spark session, to

(t) ``twophase.files`` (Parquet) on ``s3://<bucket>/bench-s3/<run>/twophase`` through s3fs;
(s) Spark's ``parquet`` file sink on ``s3a://<bucket>/bench-s3/<run>/spark`` through Hadoop's
    S3A connector (``org.apache.hadoop:hadoop-aws`` of pyspark's own Hadoop version, resolved
    by its Maven coordinates with ``spark.jars.packages``);
(n) Spark's ``noop`` sink: the engine's ceiling for the same query.

Each is warmed up on a small run first. Prints seconds and rows/s, then (t)/(s) and (t)/(n) as
rates (above 1: twophase is faster). Checks that both S3 outputs hold every row once.

Needs the S3 server of ``make services`` (TWOPHASE_S3_* from the environment or .services.env).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench._common import Result, ratio, sequenceStream, serviceValue


def hadoopVersion() -> str:
    """The Hadoop version pyspark ships (from its hadoop-client-api jar)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    for jar in jars.glob("hadoop-client-api-*.jar"):
        return jar.name[len("hadoop-client-api-") : -len(".jar")]
    raise SystemExit(f"no hadoop-client-api jar in {jars}: cannot pick hadoop-aws")


def s3Service() -> dict[str, str]:
    """Endpoint, credentials and bucket of the S3 server of ``make services``."""
    return {
        "endpoint": serviceValue("TWOPHASE_S3_ENDPOINT"),
        "key": serviceValue("TWOPHASE_S3_ACCESS_KEY"),
        "secret": serviceValue("TWOPHASE_S3_SECRET_KEY"),
        "bucket": serviceValue("TWOPHASE_S3_BUCKET"),
    }


def s3aPackage() -> str:
    """Spark's S3A connector by Maven coordinates, of pyspark's own Hadoop version."""
    return f"org.apache.hadoop:hadoop-aws:{hadoopVersion()}"


def s3aConf(s3: dict[str, str]) -> dict[str, str]:
    """The Spark settings that point S3A at ``s3``'s server."""
    return {
        "spark.hadoop.fs.s3a.endpoint": s3["endpoint"],
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.access.key": s3["key"],
        "spark.hadoop.fs.s3a.secret.key": s3["secret"],
    }


def filesOptions(s3: dict[str, str]) -> dict[str, str]:
    """The files sink's ``fs.*`` options for ``s3``'s server."""
    return {"fs.endpoint_url": s3["endpoint"], "fs.key": s3["key"], "fs.secret": s3["secret"]}


def removePrefix(s3: dict[str, str], base: str) -> None:
    """Delete ``s3://<base>`` and below (best effort: the bucket is the test server's)."""
    try:
        from twophase.sinks.files.storage import Storage

        Storage(
            f"s3://{base}",
            {"endpoint_url": s3["endpoint"], "key": s3["key"], "secret": s3["secret"]},
        ).removeTree("")
    except Exception as exc:
        print(f"could not remove s3://{base}: {exc}", file=sys.stderr)


def session(s3: dict[str, str], partitions: int) -> Any:
    from pyspark.sql import SparkSession

    import twophase

    builder = (
        SparkSession.builder.master(os.environ.get("BENCH_MASTER", "local[2]"))
        .appName("twophase-bench-s3")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.jars.packages", s3aPackage())
        .config("spark.sql.shuffle.partitions", str(partitions))
    )
    for key, value in s3aConf(s3).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    twophase.register(spark)
    return spark


def stream(spark: Any, rows: int, per: int, parts: int, valueBytes: int) -> Any:
    return sequenceStream(
        spark, rows, per, parts, "id", f"rpad(payload, {valueBytes}, '.') AS payload"
    )


def run(
    spark: Any, fmt: str, path: str, ckpt: str, shape: tuple[int, ...], s3: dict[str, str]
) -> float:
    rows, per, parts, valueBytes = shape
    writer = stream(spark, rows, per, parts, valueBytes).writeStream.format(fmt)
    if fmt == "twophase.files":
        writer = writer.option("path", path).option("format", "parquet").options(**filesOptions(s3))
    elif fmt == "parquet":
        writer = writer.option("path", path)
    query = writer.option("checkpointLocation", ckpt).trigger(availableNow=True).start()
    started = time.perf_counter()
    query.awaitTermination()
    return time.perf_counter() - started


def countRows(url: str, s3: dict[str, str]) -> int:
    from twophase.verify import actualFromFiles

    table = actualFromFiles(url.replace("s3a://", "s3://"), "parquet", options=filesOptions(s3))
    return int(table.num_rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rows-per-batch", type=int, default=250_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args(argv)
    s3 = s3Service()
    shape = (args.rows, args.rows_per_batch, args.partitions, args.value_bytes)
    warm = (min(args.rows, 50_000), min(args.rows, 25_000), args.partitions, args.value_bytes)
    base = f"{s3['bucket']}/bench-s3/{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="twophase-bench-s3-"))
    spark = session(s3, args.partitions)
    paths = {
        "twophase.files": f"s3://{base}/twophase",
        "parquet": f"s3a://{base}/spark",
        "noop": "",
    }
    names = {
        "twophase.files": "twophase.files on S3",
        "parquet": "Spark parquet on s3a",
        "noop": "Spark noop",
    }
    results: dict[str, Result] = {}
    try:
        for fmt, path in paths.items():
            run(spark, fmt, path + "-warm" if path else "", str(work / f"{fmt}-warm"), warm, s3)
            seconds = run(spark, fmt, path, str(work / fmt), shape, s3)
            results[fmt] = Result(names[fmt], args.rows, seconds)
            print(f"{names[fmt]}: {seconds:.1f} s, {results[fmt].rate:,.0f} rows/s", flush=True)
        for fmt in ("twophase.files", "parquet"):
            held = countRows(paths[fmt], s3)
            if held != args.rows:
                print(f"{names[fmt]} holds {held} rows, not {args.rows}", file=sys.stderr)
                return 1
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
        removePrefix(s3, base)
    t, s, n = (results[f].rate for f in ("twophase.files", "parquet", "noop"))
    print(
        f"{args.rows:,} rows, {args.rows_per_batch:,} per batch, {args.partitions} partitions, "
        f"{args.value_bytes}-byte payloads, one run"
    )
    print(f"twophase.files on S3 / Spark parquet on s3a (rows/s): {ratio(t, s):.2f}")
    print(f"twophase.files on S3 / Spark noop (rows/s): {ratio(t, n):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
