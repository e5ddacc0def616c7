"""The Kafka source: topics as a replayable stream, ``read_committed`` by default.

Spark-free: ``KafkaSourceSettings`` parses Spark's Kafka source options, ``KafkaPlanner``
chooses each micro-batch's offset ranges on the driver, ``readRanges`` reads ranges into Arrow
batches, several topic partitions with one consumer. The Spark data source
(``spark.readStream.format("twophase.kafka")``) is ``twophase.spark.kafka``; verify reads Kafka
through the same pieces. See docs/kafka.md.
"""

from twophase.sources.kafka.errors import KafkaSourceError, KafkaSourceUnreachableError
from twophase.sources.kafka.offsets import (
    EARLIEST,
    LATEST,
    KafkaRange,
    Offsets,
    Positions,
    cappedEnd,
    offsetsOf,
    packRanges,
    parseOffsetsJson,
    rowsOf,
    splitRanges,
)
from twophase.sources.kafka.planner import KafkaPlanner
from twophase.sources.kafka.reader import RecordBatchBuilder, readRange, readRanges, recordSchema
from twophase.sources.kafka.settings import BASE_SCHEMA, HEADERS_SCHEMA, KafkaSourceSettings

__all__ = [
    "BASE_SCHEMA",
    "EARLIEST",
    "HEADERS_SCHEMA",
    "LATEST",
    "KafkaPlanner",
    "KafkaRange",
    "KafkaSourceError",
    "KafkaSourceUnreachableError",
    "KafkaSourceSettings",
    "Offsets",
    "Positions",
    "RecordBatchBuilder",
    "cappedEnd",
    "offsetsOf",
    "packRanges",
    "parseOffsetsJson",
    "readRange",
    "readRanges",
    "recordSchema",
    "rowsOf",
    "splitRanges",
]
