"""twophase: end-to-end exactly-once sinks for Spark Structured Streaming.

Subclass ``TwoPhaseCommitSink`` for any system with a prepare/commit protocol, register it with
``spark.dataSource.register`` and write with ``df.writeStream.format(MySink.name())``; or wrap it
with ``twophase.foreachBatch``. ``twophase.register(spark)`` registers the built-in sources
and sinks (``twophase.files``, ``twophase.sequence``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twophase.foreach_batch import foreachBatch
from twophase.protocol import (
    Handle,
    RecoveryScope,
    TaskResult,
    TransactionContext,
    TransactionLostError,
    TransientCommitError,
    TwoPhaseParticipant,
)
from twophase.settings import SinkSettings, TwoPhaseConfigError
from twophase.sink import ParticipantSink, TwoPhaseCommitSink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "Handle",
    "ParticipantSink",
    "RecoveryScope",
    "SinkSettings",
    "TaskResult",
    "TransactionContext",
    "TransactionLostError",
    "TransientCommitError",
    "TwoPhaseCommitSink",
    "TwoPhaseConfigError",
    "TwoPhaseParticipant",
    "builtinDataSources",
    "foreachBatch",
    "register",
]


def builtinDataSources() -> list[type]:
    """The built-in sources and sinks, as PySpark data source classes."""
    from twophase.sinks.files import FilesSink
    from twophase.sinks.kafka import KafkaSink
    from twophase.sinks.postgres import PostgresSink
    from twophase.sources.sequence import SequenceSource

    return [FilesSink, KafkaSink, PostgresSink, SequenceSource]


def register(spark: SparkSession) -> None:
    """Register every built-in twophase source and sink with ``spark``."""
    for dataSource in builtinDataSources():
        spark.dataSource.register(dataSource)
