"""The one binding of every sink declared by its parts: a PySpark data source per registry entry.

A sink whose registry entry (``twophase.sinks.registry``) names its Spark-free parts (settings,
writer, committer, the driver's check) needs no binding module of its own: this module makes
its data source class, ``<Kind>Sink`` (``FilesSink``), at import, so PySpark pickles it by
reference and an executor imports it from here. ``sink.json`` keeps what the sink's declared
options keep.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from pyspark.sql.types import StructType

from twophase.options import keptOptions
from twophase.protocol import Committer, TransactionWriter
from twophase.settings import SinkSettings, optionOf
from twophase.sinks.registry import SINKS, SinkParts, SinkSpec
from twophase.spark.datasource import TwoPhaseDataSource
from twophase.spark.schema import arrowSchemaOf


class DeclaredSink(TwoPhaseDataSource):
    """A built-in sink bound from its parts: options parsed by its settings, a writer per task,
    a committer on the driver, the target checked against the stream before each batch."""

    spec: ClassVar[SinkSpec]

    @classmethod
    def parts(cls) -> SinkParts:
        assert cls.spec.parts is not None
        return cls.spec.parts

    @classmethod
    def name(cls) -> str:
        return cls.spec.name()

    @classmethod
    def publicOptionValue(cls, key: str, value: str) -> str | None:
        return cls.parts().publicOptionValue(key, value)

    def settings(self) -> Any:
        """The parsed options; the sink's error names a bad option."""
        return self.parts().parse(self.options)

    def createWriter(self) -> TransactionWriter[Any]:
        writer: TransactionWriter[Any] = self.parts().newWriter(self.settings())
        return writer

    def createCommitter(self) -> Committer:
        committer: Committer = self.parts().newCommitter(self.settings())
        return committer

    def validate(self, schema: StructType) -> None:
        """Driver, before each batch: check the options, the system and the target."""
        settings = self.settings()
        self.parts().check(settings, arrowSchemaOf(schema, self.name()), self._sinkId())

    def _sinkId(self) -> str:
        """The sink id the query's tasks will use; without a checkpoint location (a check run
        outside a query) the ``sinkId`` option, or empty."""
        if optionOf(self.options, "checkpointLocation"):
            return SinkSettings.fromOptions(self.options, self.name()).sinkId
        return optionOf(self.options, "sinkId") or ""


class _KeptOptions:
    """``safeOptions`` of a declared sink, read from its declaration when first asked: a task
    that never writes ``sink.json`` imports no other sink's settings (psycopg, SQLAlchemy)."""

    def __get__(self, instance: object, owner: type[DeclaredSink]) -> frozenset[str]:
        return _keptOf(owner.spec)


@functools.cache
def _keptOf(spec: SinkSpec) -> frozenset[str]:
    return keptOptions(spec.declaredOptions())


def _bind(spec: SinkSpec) -> type[DeclaredSink]:
    attributes: dict[str, Any] = {
        "spec": spec,
        "safeOptions": _KeptOptions(),
        "__module__": __name__,
        "__qualname__": spec.className,
        "__doc__": f"``{spec.name()}``: the sink declared in ``twophase.sinks.registry``.",
    }
    return type(spec.className, (DeclaredSink,), attributes)


BOUND = {spec.className: _bind(spec) for spec in SINKS if spec.parts is not None}
"""The data source class of every sink declared by its parts, by class name."""


def __getattr__(name: str) -> type[DeclaredSink]:
    """``FilesSink`` and its siblings, for readers that name them (pickle, ``sink.json``)."""
    try:
        return BOUND[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


__all__ = ["BOUND", "DeclaredSink"]
