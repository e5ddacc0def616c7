"""The bench's targets, one module each: what ``make bench-shapes`` writes into, by name."""

from __future__ import annotations

from bench.targets.base import Context, Target
from bench.targets.files import FilesTarget, S3Target
from bench.targets.kafka import KafkaTarget
from bench.targets.postgres import PostgresTarget
from bench.targets.sql import SqlTarget
from bench.targets.tables import DeltaTarget, IcebergTarget

TARGETS: dict[str, type[Target]] = {
    "files": FilesTarget,
    "kafka": KafkaTarget,
    "postgres": PostgresTarget,
    "sql": SqlTarget,
    "s3": S3Target,
    "delta": DeltaTarget,
    "iceberg": IcebergTarget,
}
"""Every target by the name ``--targets`` takes; a new sink's bench adds a module and a line."""

__all__ = ["TARGETS", "Context", "Target"]
