"""``twophase.multi`` as a Spark data source: one query's batch into several sinks, one decision.

``df.writeStream.format("twophase.multi").option("targets", "orders=postgres,events=kafka")``
with one struct column per target (``F.struct(...).alias("orders")``) and each target's options
under its name (``orders.url``, ``events.kafka.bootstrap.servers``). The targets are the
built-in data sources or any ``TwoPhaseDataSource`` (``module:Class``); this class builds them
from their options, checks the input against each before a task runs, and hands their writers
and committers to :mod:`twophase.sinks.multi`.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import StructType

from twophase.loading import importQualified
from twophase.settings import SinkSettings, TwoPhaseConfigError
from twophase.sinks.multi import MultiCommitter, MultiWriter, Target, parseTargets, targetOptions
from twophase.sinks.registry import multiTargetKinds, specOf
from twophase.spark.datasource import TwoPhaseDataSource


def targetClass(kind: str) -> type[TwoPhaseDataSource]:
    """The data source class of a target kind: a built-in name or ``module:Class``."""
    if kind in multiTargetKinds():
        builtin: type[TwoPhaseDataSource] = specOf(kind).bindingClass()
        return builtin
    try:
        found: Any = importQualified(kind)
    except (ImportError, AttributeError) as exc:
        raise TwoPhaseConfigError(
            f"twophase.multi: target class {kind!r} cannot be imported ({exc}); give a data "
            "source class as module:Class, importable on the driver and the executors"
        ) from None
    if not (isinstance(found, type) and issubclass(found, TwoPhaseDataSource)):
        raise TwoPhaseConfigError(
            f"twophase.multi: {kind!r} is not a twophase data source; a target must subclass "
            "twophase.TwoPhaseDataSource or twophase.TwoPhaseCommitSink"
        )
    return found


class MultiSink(TwoPhaseDataSource):
    """``twophase.multi``: every target of a batch committed under one decision.

    Options: ``targets`` (``name=kind,...``), each target's options prefixed with its name, and
    the usual ``checkpointLocation``. ``sink.json`` keeps ``targets`` and every target's safe
    options (prefixed), in the form the target's own class keeps them.
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        sinkId = SinkSettings.fromOptions(self.options, self.name()).sinkId
        self.targets: list[Target] = parseTargets(self.options, sinkId)
        self.sinks: list[tuple[Target, TwoPhaseDataSource]] = [
            (t, targetClass(t.kind)(targetOptions(self.options, t))) for t in self.targets
        ]
        self.safeOptions = frozenset(  # type: ignore[misc]  # per instance: by the targets
            {"targets"}
            | {
                f"{t.name.lower()}.{option.lower()}"
                for t, sink in self.sinks
                for option in sink.safeOptions
            }
        )

    @classmethod
    def name(cls) -> str:
        return "twophase.multi"

    def publicOptionValue(self, key: str, value: str) -> str | None:  # type: ignore[override]
        """A target's option in the form that target's class keeps it."""
        for target, sink in self.sinks:
            prefix = f"{target.name.lower()}."
            if key.lower().startswith(prefix):
                return sink.publicOptionValue(key[len(prefix) :], value)
        return value

    def createWriter(self) -> MultiWriter:
        return MultiWriter([(t, sink.createWriter(), dict(sink.options)) for t, sink in self.sinks])

    def createCommitter(self) -> MultiCommitter:
        return MultiCommitter([(t, sink.createCommitter()) for t, sink in self.sinks])

    def validate(self, schema: StructType) -> None:
        """Driver: each target's struct column is there, and fits its target."""
        for target, sink in self.sinks:
            fields = [f for f in schema.fields if f.name.lower() == target.name.lower()]
            if not fields:
                raise TwoPhaseConfigError(
                    f"twophase.multi: target {target.name!r} ({target.kind}) needs a struct "
                    f"column named {target.name!r}, e.g. F.struct(...).alias({target.name!r}); "
                    f"the input has {', '.join(schema.fieldNames())}"
                )
            column = fields[0]
            if not isinstance(column.dataType, StructType):
                raise TwoPhaseConfigError(
                    f"twophase.multi: column {column.name!r} of target {target.name!r} is "
                    f"{column.dataType.simpleString()}, not a struct; build it with "
                    f"F.struct(<the {target.kind} sink's columns>).alias({target.name!r})"
                )
            before = dict(sink.options)
            where = f"twophase.multi: target {target.name!r} ({target.kind}), struct column "
            try:
                sink.validate(column.dataType)
            except TwoPhaseConfigError as exc:
                raise TwoPhaseConfigError(f"{where}{column.name!r}: {exc}") from exc
            except Exception as exc:  # a server down stays what it is (retryable), named here
                exc.add_note(f"{where}{column.name!r}")
                raise
            for key, value in sink.options.items():  # what validate resolved (Kafka's timeout)
                if before.get(key) != value:
                    self.options[f"{target.name.lower()}.{key}"] = value


__all__ = ["MultiSink", "targetClass"]
