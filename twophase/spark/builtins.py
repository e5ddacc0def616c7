"""The built-in sources and sinks as PySpark data sources, registering those this PySpark
runs, and a built-in sink by its name."""

from __future__ import annotations

from typing import Any

from twophase.redaction import getLogger
from twophase.settings import TwoPhaseConfigError
from twophase.spark.datasource import TwoPhaseDataSource
from twophase.spark.versions import (
    PYSPARK_VERSION,
    DataSource,
    requireDataSources,
    streamingSourceGap,
)

log = getLogger(__name__)


def builtinDataSources() -> list[type[DataSource]]:
    """The built-in sources and sinks, as PySpark data source classes."""
    from twophase.spark.delta import DeltaSink
    from twophase.spark.files import FilesSink
    from twophase.spark.iceberg import IcebergSink
    from twophase.spark.kafka import KafkaSink
    from twophase.spark.multi import MultiSink
    from twophase.spark.postgres import PostgresSink
    from twophase.spark.sequence import SequenceSource
    from twophase.spark.sql import SqlSink

    return [
        DeltaSink,
        FilesSink,
        IcebergSink,
        KafkaSink,
        MultiSink,
        PostgresSink,
        SequenceSource,
        SqlSink,
    ]


def builtinSink(name: str) -> type[TwoPhaseDataSource]:
    """The built-in sink whose format name is ``name`` (``"twophase.kafka"``); a clear error
    naming the built-in sinks for any other name."""
    sinks = {cls.name(): cls for cls in builtinDataSources() if issubclass(cls, TwoPhaseDataSource)}
    found = sinks.get(name.strip())
    if found is None:
        raise TwoPhaseConfigError(
            f"{name!r} is not a twophase sink; the built-in sinks are {', '.join(sorted(sinks))}. "
            "For a sink of your own, pass its class (or an instance) instead of a name"
        )
    return found


def registerBuiltins(spark: Any) -> list[str]:
    """Register with ``spark`` the built-ins this PySpark runs; return their names.

    Raises ``SparkVersionError`` (naming ``twophase.foreachBatch``) on a PySpark without Python
    data sources. Where the streaming sources cannot run, the sinks are registered alone
    (``twophase.kafka`` then writes only) and one log line says what was skipped and why.
    """
    requireDataSources()
    gap = streamingSourceGap()
    registered, skipped = [], []
    for cls in builtinDataSources():
        if gap is not None and not issubclass(cls, TwoPhaseDataSource):
            skipped.append(cls.name())
            continue
        spark.dataSource.register(cls)
        registered.append(cls.name())
    if gap is not None:
        log.warning(
            "twophase on PySpark %s: registered the sinks only; skipped the source%s %s, and "
            "twophase.kafka reads no stream (it writes): %s",
            PYSPARK_VERSION,
            "" if len(skipped) == 1 else "s",
            ", ".join(skipped),
            gap,
        )
    return registered
