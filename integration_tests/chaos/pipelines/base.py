"""What a chaos pipeline is: its source, its sink, the servers it may kill, and its check.

A pipeline lives in two processes. The runner (the parent) calls :meth:`Pipeline.prepare`
before the first start, to make the pipeline's table or topics and fill the spec, and
:meth:`Pipeline.verify` once the source is drained. Each start's child process
(``chaos.pipeline``) calls :meth:`Pipeline.source` and :meth:`Pipeline.sink` to build the
query. The parent-side methods import their clients (``twophase.verify``, Kafka admin) where
they are used, so that a child, started once per kill, does not pay for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from integration_tests.chaos.spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

    from integration_tests.chaos.servers import Services


SOCKET_TIMEOUT = "10"
"""``socketTimeout`` of the PostgreSQL and SQL sinks under chaos: a partition or a lost reply
fails the call in seconds rather than the default two minutes."""


def need(value: Any, what: str) -> Any:
    """``value``, or exit saying that ``what`` (a server of ``make services``) is not configured."""
    if not value:
        raise SystemExit(f"{what} is not configured: start the servers with `make services`")
    return value


class Pipeline:
    """One chaos pipeline. Subclasses set :attr:`name` and :attr:`servers`, and say how the
    sink is written (:meth:`sink`) and read back (:meth:`actual`)."""

    name: ClassVar[str]
    servers: ClassVar[tuple[str, ...]] = ()
    """Kinds of ``servers.SERVERS`` the schedule may kill (files: none)."""
    outageSeconds: ClassVar[float] = 0.0
    """How long an outage keeps the query down; 0: the schedule has no outages."""
    kafkaTimeoutSeconds: ClassVar[float] = 0.0
    """The transaction timeout of its Kafka writes; 0: none, no ``past timeout`` fault."""
    completesBatches: ClassVar[bool] = False
    """Whether its sink completes each batch in one step after the handles' commits (a table
    format's log commit): its schedule covers ``schedule.COMPLETION_POINTS`` too."""
    minRowsPerBatch: ClassVar[int] = 0
    """The fewest rows a micro-batch of this pipeline gets, whatever the run asks for: a sink
    whose write path changes with a task's size has its crash windows covered on that path."""
    columns: ClassVar[tuple[str, ...]] = ("id", "payload")
    """The identity of a record, as ``twophase verify`` counts them."""

    def prepare(self, spec: PipelineSpec, services: Services) -> None:
        """Parent, before the first start: the sink's table or topic, its place in ``spec``."""

    def source(self, spark: SparkSession, spec: PipelineSpec) -> DataFrame:
        """Child: the streaming input; by default the replayable ``twophase.sequence``."""
        return (
            spark.readStream.format("twophase.sequence")
            .option("totalRows", spec.rows)
            .option("rowsPerBatch", spec.rowsPerBatch)
            .option("numPartitions", spec.partitions)
            .load()
        )

    def sink(self, stream: DataFrame, spec: PipelineSpec) -> DataStreamWriter:
        """Child: ``stream`` written to the sink (the runner adds the checkpoint, the trigger
        and ``spec.sinkOptions``)."""
        raise NotImplementedError

    def expected(self, spec: PipelineSpec) -> Any:
        """Parent: what the source offered; by default the sequence's ids ``[0, rows)``."""
        from twophase import verify

        return verify.expectedFromSequence(0, spec.rows)

    def actual(self, spec: PipelineSpec) -> Any:
        """Parent: what the sink holds, as committed-data readers see it."""
        raise NotImplementedError

    def doctorOptions(self, spec: PipelineSpec) -> dict[str, str]:
        """Parent: the options ``twophase doctor`` needs beside ``sink.json`` (its secrets)."""
        return dict(spec.sinkOptions)

    def liveTopic(self, spec: PipelineSpec) -> str | None:
        """Parent: the Kafka topic a ``read_committed`` reader follows while the chaos runs
        (``reader.LiveReader``), or None when the pipeline writes no Kafka topic."""
        return None

    def liveExpected(self, spec: PipelineSpec) -> Any:
        """Parent: what that reader must see, once each (key and value columns)."""
        return self.expected(spec)

    def liveSeen(self, spec: PipelineSpec, seen: Any) -> Any:
        """Parent: what that reader saw, in the form ``liveExpected`` has (as it is here)."""
        return seen

    def verify(self, spec: PipelineSpec) -> Any:
        """Parent, once drained: ``twophase verify``'s report of the sink against the source."""
        from twophase import verify

        return verify.compare(self.expected(spec), self.actual(spec), self.columns)
