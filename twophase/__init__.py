"""twophase: end-to-end exactly-once sinks for Spark Structured Streaming.

Subclass ``TwoPhaseCommitSink`` (one class) or ``TwoPhaseDataSource`` (a ``TransactionWriter``
and a ``Committer``) for any system with a prepare/commit protocol, register it with
``spark.dataSource.register`` and write with ``df.writeStream.format(MySink.name())``; or wrap
it with ``twophase.foreachBatch``. ``twophase.register(spark)`` registers the built-in sources
and sinks (``twophase.files``, ``twophase.postgres``, ``twophase.kafka``, ``twophase.sequence``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twophase.protocol import (
    Committer,
    Handle,
    RecoveryScope,
    SinkContractError,
    TaskResult,
    TransactionContext,
    TransactionLostError,
    TransactionWriter,
    TransientCommitError,
    TwoPhaseParticipant,
)
from twophase.settings import SinkSettings, TwoPhaseConfigError
from twophase.spark.datasource import TwoPhaseCommitSink, TwoPhaseDataSource
from twophase.spark.foreach_batch import foreachBatch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "Committer",
    "Handle",
    "RecoveryScope",
    "SinkContractError",
    "SinkSettings",
    "TaskResult",
    "TransactionContext",
    "TransactionLostError",
    "TransactionWriter",
    "TransientCommitError",
    "TwoPhaseCommitSink",
    "TwoPhaseConfigError",
    "TwoPhaseDataSource",
    "TwoPhaseParticipant",
    "builtinDataSources",
    "foreachBatch",
    "register",
]


def builtinDataSources() -> list[type]:
    """The built-in sources and sinks, as PySpark data source classes."""
    from twophase.spark.files import FilesSink
    from twophase.spark.kafka import KafkaSink
    from twophase.spark.postgres import PostgresSink
    from twophase.spark.sequence import SequenceSource

    return [FilesSink, KafkaSink, PostgresSink, SequenceSource]


def register(spark: SparkSession) -> None:
    """Register every built-in twophase source and sink with ``spark``."""
    for dataSource in builtinDataSources():
        spark.dataSource.register(dataSource)
