"""``twophase.kafka`` as a Spark data source: the Kafka sink's writer and committer, bound, and
the Kafka source's stream reader.

PySpark keeps one data source per name, and Spark's own ``kafka`` format both reads and writes,
so :class:`KafkaSink` serves both directions. Everything the sink and the source do lives in
:mod:`twophase.sinks.kafka` and :mod:`twophase.sources.kafka`; this module only builds them
from options and adapts the source's planner to PySpark's stream reader.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import ClassVar

import pyarrow as pa
from pyspark.sql.types import NullType, StructField, StructType

from twophase.clients.kafka import ensureTopic
from twophase.schemaregistry.avro import sparkDdlOf
from twophase.schemaregistry.formats import resolve, resolvedOption
from twophase.settings import TwoPhaseConfigError, defaultSinkId, optionOf
from twophase.sinks.kafka import (
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    RESOLVED_TIMEOUT_OPTION,
    SAFE_OPTIONS,
    KafkaCommitter,
    KafkaSettings,
    KafkaWriter,
    brokerTransactionMaxTimeoutMs,
    checkColumns,
)
from twophase.sinks.kafka.access import ACCESS_CHECK_SECONDS, checkAccess
from twophase.sinks.kafka.columns import SINK_COLUMNS, ColumnLayout
from twophase.sinks.kafka.encoding import RecordEncoding
from twophase.sources.kafka import (
    KafkaPlanner,
    KafkaRange,
    KafkaSourceSettings,
    Offsets,
    readRanges,
)
from twophase.sources.kafka.decoding import RegistryDecoder, RegistryValues
from twophase.spark.coded import codedErrors
from twophase.spark.datasource import TwoPhaseDataSource
from twophase.spark.schema import arrowSchemaOf
from twophase.spark.versions import (
    DataSourceStreamReader,
    InputPartition,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
    requireStreamingSources,
)
from twophase.spark.worker import freezeWorkerHeap

_READER_OPTION = "twophase.kafka.source.{side}Reader"
"""Where the driver leaves the source's resolved reader schema of a side for the tasks."""
_SIDES = ("value", "key")


def _emptyBatch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


class KafkaSink(TwoPhaseDataSource):
    """``twophase.kafka``: exactly-once into Kafka, and ``read_committed`` out of it.

    ``df.writeStream.format("twophase.kafka").option("kafka.bootstrap.servers", ...)
    .option("topic", ...).option("checkpointLocation", ...).start()`` after
    ``twophase.register(spark)``; input columns as Spark's Kafka sink (``value``, optional
    ``key``, ``topic``, ``partition``, ``headers``); options as
    :class:`twophase.sinks.kafka.KafkaSettings`. ``sink.json`` keeps the cluster, the
    non-secret ``kafka.*`` settings and the transactional id prefix (``SAFE_OPTIONS``);
    passwords, JAAS lines, OAUTHBEARER settings and PEM keys never go there, so ``twophase
    recover`` takes them from ``TWOPHASE_KAFKA_OPTIONS``.

    Like Spark's ``kafka`` format, the one name reads as well: ``spark.readStream
    .format("twophase.kafka")`` with the options of Spark's Kafka source
    (:class:`twophase.sources.kafka.KafkaSourceSettings`).
    """

    safeOptions: ClassVar[frozenset[str]] = SAFE_OPTIONS

    @classmethod
    def name(cls) -> str:
        return "twophase.kafka"

    def settings(self) -> KafkaSettings:
        """The sink's parsed options; ``TwoPhaseConfigError`` names a bad option."""
        return KafkaSettings.fromOptions(self.options)

    def createWriter(self) -> KafkaWriter:
        return KafkaWriter(self.settings())

    def createCommitter(self) -> KafkaCommitter:
        return KafkaCommitter(self.settings())

    def validate(self, schema: StructType) -> None:
        """Driver: check options and columns, reach the cluster, fix the transaction timeout,
        create the dead-letter topic of ``badRecords`` when it is missing.

        The timeout read from the brokers is left in the options, so executors use the same
        value without asking the brokers again.
        """
        settings = self.settings()
        valueFormat, keyFormat = settings.valueFormat, settings.keyFormat
        # Columns the sink ignores keep their names (for the messages) but not their types:
        # a type Arrow cannot hold must not fail a query that never writes it. A value in a
        # registry format without a `value` column is made of them: then they keep theirs.
        ownValue = any(f.name.lower() == "value" for f in schema.fields)
        keepAll = valueFormat.usesRegistry and not ownValue
        columns = StructType(
            [
                f if keepAll or f.name.lower() in SINK_COLUMNS else StructField(f.name, NullType())
                for f in schema.fields
            ]
        )
        arrow = arrowSchemaOf(columns, self.name())
        checkColumns(arrow, settings.topic, valueFormat.format, keyFormat.format)
        checkAccess(
            settings.producerConfig,
            settings.topic,
            self._transactionalIdPrefix(settings),
            min(settings.requestTimeoutSeconds, ACCESS_CHECK_SECONDS),
        )
        self._registerSchemas(settings, arrow)
        if settings.badRecords is not None:
            ensureTopic(
                settings.producerConfig,
                settings.badRecords,
                "badRecords",
                settings.requestTimeoutSeconds,
            )
        brokerMax = brokerTransactionMaxTimeoutMs(
            settings.producerConfig, settings.requestTimeoutSeconds
        )
        chosen = settings.transactionTimeoutMs
        if chosen is not None and optionOf(self.options, RESOLVED_TIMEOUT_OPTION) is None:
            if chosen > brokerMax:
                raise TwoPhaseConfigError(
                    f"option kafka.transaction.timeout.ms={chosen} is larger than the brokers' "
                    f"transaction.max.timeout.ms={brokerMax}: lower it, or raise the broker "
                    "setting"
                )
            return
        self.options[RESOLVED_TIMEOUT_OPTION] = str(
            chosen if chosen is not None else min(DEFAULT_TRANSACTION_TIMEOUT_MS, brokerMax)
        )

    def _transactionalIdPrefix(self, settings: KafkaSettings) -> str | None:
        """The sink's transactional id prefix (``None`` when the options do not tell it)."""
        if settings.transactionalIdPrefix:
            return settings.transactionalIdPrefix
        checkpoint = optionOf(self.options, "checkpointLocation")
        sinkId = optionOf(self.options, "sinkId") or (
            defaultSinkId(checkpoint, self.name()) if checkpoint else None
        )
        return settings.prefixFor(sinkId) if sinkId else None

    def _registerSchemas(self, settings: KafkaSettings, arrow: pa.Schema) -> None:
        """Driver, before any task writes: register (or look up) the schema of each side in a
        registry format, and leave its id and text in the options for the tasks."""
        layout = ColumnLayout.of(
            arrow, settings.topic, settings.valueFormat.format, settings.keyFormat.format
        )
        for spec in (settings.valueFormat, settings.keyFormat):
            if not spec.usesRegistry:
                continue
            column = RecordEncoding.plain().column(_emptyBatch(arrow), layout, spec.side)
            if column is None:
                raise TwoPhaseConfigError(
                    f"kafka sink: {spec.side}.format={spec.format} but the input has no "
                    f"{spec.side!r} column"
                )
            found = resolve(spec, self.options, settings.topic, column.type)
            name, value = resolvedOption(spec, found)
            self.options[name] = value

    @codedErrors()
    def schema(self) -> str:
        """The source's columns (``key``, ``value``, ``topic``, ... as Spark's Kafka source);
        with ``value.format`` (``key.format``) ``avro``, ``protobuf`` or ``jsonschema`` the value
        (key) is decoded with the reader schema, resolved here once and kept in the options for
        the tasks."""
        freezeWorkerHeap()
        settings = KafkaSourceSettings.fromOptions(self.options)
        types = {side: sparkDdlOf(v.arrowType()) for side, v in self._registryValues(settings)}
        return settings.schema(types.get("value"), types.get("key"))

    def _registryValues(self, settings: KafkaSourceSettings) -> list[tuple[str, RegistryValues]]:
        found = []
        for side in _SIDES:
            option = _READER_OPTION.format(side=side)
            resolved = optionOf(self.options, option)
            if resolved is not None:
                values: RegistryValues | None = RegistryValues.fromText(resolved, self.options)
            else:
                values = RegistryValues.fromOptions(self.options, settings.subscribe, side)
                if values is not None:
                    self.options[option] = values.toText()
            if values is not None:
                found.append((side, values))
        return found

    @codedErrors()
    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        """The source: ``spark.readStream.format("twophase.kafka")`` (PySpark 4.2+)."""
        freezeWorkerHeap()
        requireStreamingSources(self.name())
        settings = KafkaSourceSettings.fromOptions(self.options)
        return KafkaStreamReader(settings, [v for _, v in self._registryValues(settings)])


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """PySpark's stream reader over ``KafkaPlanner`` (driver) and ``readRanges`` (executors).

    Offsets live in Spark's checkpoint; the source joins no consumer group and commits nothing.
    """

    def __init__(
        self, settings: KafkaSourceSettings, values: Sequence[RegistryValues] = ()
    ) -> None:
        self.settings = settings
        self.planner = KafkaPlanner(settings)
        self.values = tuple(values)
        """How tasks decode the value and the key (none: both stay bytes)."""

    @codedErrors()
    def initialOffset(self) -> Offsets:
        return self.planner.initialOffset()

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.settings.maxOffsetsPerTrigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.prepareForTriggerAvailableNow()

    @codedErrors()
    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        maxOffsets = int(limit.max_rows) if isinstance(limit, ReadMaxRows) else None
        return self.planner.latestOffset(start, maxOffsets)

    def reportLatestOffset(self) -> Offsets | None:
        return self.planner.reportLatestOffset()

    @codedErrors()
    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        """One input partition per group of ranges the planner chose; its ``value`` is the
        tuple of ranges."""
        return [InputPartition(group) for group in self.planner.groups(start, end)]

    def commit(self, end: Offsets) -> None:
        """Nothing to release: offsets live in Spark's checkpoint, never in a consumer group."""

    def stop(self) -> None:
        self.planner.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor: the records of one group of ranges, as Arrow batches."""
        freezeWorkerHeap()
        group = partition.value
        assert isinstance(group, tuple) and all(isinstance(r, KafkaRange) for r in group)
        with codedErrors():
            decoders = [RegistryDecoder(v) for v in self.values]
            for r, batch in readRanges(self.settings, group):
                for decoder in decoders:
                    batch = decoder.decode(batch, f"{r.topic}-{r.partition}")
                yield batch


__all__ = ["KafkaSink", "KafkaStreamReader"]
