"""The built-in sources and sinks as PySpark data sources, and a built-in sink by its name."""

from __future__ import annotations

from twophase.settings import TwoPhaseConfigError
from twophase.spark.datasource import TwoPhaseDataSource


def builtinDataSources() -> list[type]:
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
