"""The bench's shared runner: its one Spark session, its cache directory and its log lines."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench import kafka as kb
from bench import postgres as pb


def cacheDir() -> Path:
    path = Path(os.environ.get("TWOPHASE_CACHE", Path.home() / ".cache" / "twophase"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def benchSession(
    master: str,
    partitions: int,
    packages: tuple[str, ...] = (),
    conf: dict[str, str] | None = None,
) -> Any:
    """The one Spark session every bench run uses: Kafka connector, JDBC driver, twophase;
    plus ``packages`` (Maven coordinates) and ``conf`` for the targets a run adds."""
    from pyspark.sql import SparkSession

    import twophase

    builder = (
        SparkSession.builder.master(master)
        .appName("twophase-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.jars", kb.sparkKafkaJar())
        .config(
            "spark.jars.packages",
            ",".join((kb.SPARK_KAFKA_PACKAGES, pb.JDBC_DRIVER, *packages)),
        )
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    twophase.register(spark)
    return spark
