"""The built-in sources and sinks as PySpark data sources, registering those this PySpark
runs, and a built-in sink by its name."""

from __future__ import annotations

from typing import Any

from twophase.redaction import getLogger
from twophase.sinks.registry import SINKS, specOf
from twophase.spark.datasource import TwoPhaseDataSource
from twophase.spark.versions import (
    PYSPARK_VERSION,
    DataSource,
    requireDataSources,
    streamingSourceGap,
)

log = getLogger(__name__)


def builtinDataSources() -> list[type[DataSource]]:
    """The built-in sources and sinks, as PySpark data source classes: the sinks of
    ``twophase.sinks.registry`` and the sequence source."""
    from twophase.spark.sequence import SequenceSource

    sinks: list[type[DataSource]] = [spec.bindingClass() for spec in SINKS]
    return sorted([*sinks, SequenceSource], key=lambda cls: cls.name())


def builtinSink(name: str) -> type[TwoPhaseDataSource]:
    """The built-in sink whose format name is ``name`` (``"twophase.kafka"``); a clear error
    naming the built-in sinks for any other name."""
    found: type[TwoPhaseDataSource] = specOf(name).bindingClass()
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
