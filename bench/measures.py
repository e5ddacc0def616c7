"""What ``make bench`` measures: its targets, paths and goals, and one measurement."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench._common import (
    MemoryPeaks,
)

TARGETS = ("files", "postgres", "kafka")
TARGET_TITLES = {"files": "files", "postgres": "PostgreSQL", "kafka": "Kafka"}
PATHS = ("twophase", "spark", "flink", "raw")
PATH_TITLES = {
    "twophase": "twophase (exactly-once)",
    "spark": "Spark's own",
    "flink": "PyFlink exactly-once",
    "raw": "raw client",
}
SPARK_PATH = {
    "files": "Spark Parquet file sink (exactly-once)",
    "postgres": "Spark JDBC in foreachBatch (at-least-once)",
    "kafka": "Spark Kafka sink (at-least-once)",
}
FLINK_PATH = {
    "files": "Flink FileSink via SQL filesystem, CSV (exactly-once)",
    "postgres": "Flink JdbcSink.buildExactlyOnce, XA (exactly-once)",
    "kafka": "Flink KafkaSink, EXACTLY_ONCE (exactly-once)",
}
RAW_PATH = {
    "files": "pyarrow Parquet write",
    "postgres": "psycopg COPY",
    "kafka": "confluent-kafka transactional producer",
}
TWOPHASE_PATH = {
    "files": "twophase.files, Parquet",
    "postgres": "twophase.postgres",
    "kafka": "twophase.kafka",
}
# twophase / peer >= goal
GOALS = {"spark": 0.9, "flink": 1.0, "raw": 0.7}
COMMIT_GOAL_MS = {"files": 50.0, "postgres": 50.0, "kafka": 100.0}
MIB = 1024 * 1024


@dataclass
class Measure:
    target: str
    path: str
    rows: int = 0
    seconds: float = float("nan")
    memory: MemoryPeaks = field(default_factory=MemoryPeaks)
    note: str = ""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.rows and self.seconds > 0 else float("nan")


@dataclass
class Profile:
    rows: int
    rowsPerBatch: int
    partitions: int
    valueBytes: int
    latencyRate: int
    latencySeconds: int
    sweepRows: int
