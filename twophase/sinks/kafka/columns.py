"""The input columns of Spark's Kafka sink (``value``; optional key, topic, partition, headers),
checked on the driver before tasks run and located in each task's Arrow batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from twophase.schemaregistry.formats import REGISTRY_FORMATS
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.kafka.errors import KafkaWriteError

_SQL_NAMES = {
    pa.int8(): "tinyint",
    pa.int16(): "smallint",
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.bool_(): "boolean",
    pa.string(): "string",
    pa.large_string(): "string",
    pa.binary(): "binary",
    pa.large_binary(): "binary",
    pa.date32(): "date",
    pa.null(): "void",
}

_HEADER_FIELDS = ({"key": "string", "value": "binary"}, {"key": "string", "value": "string"})


SINK_COLUMNS = frozenset({"value", "key", "topic", "partition", "headers"})
"""The input columns the Kafka sink reads (any case); others are ignored, as Spark does, or
make the value's record when the value has a registry format and no ``value`` column."""


def checkColumns(
    schema: pa.Schema,
    defaultTopic: str | None,
    valueFormat: str = "bytes",
    keyFormat: str = "bytes",
) -> None:
    """Driver: check the input's columns as Spark's Kafka sink does; errors name the column.

    ``schema`` is the Arrow schema the tasks will get (other columns are ignored, as Spark
    does); ``defaultTopic`` is the ``topic`` option, which makes a ``topic`` column optional.
    With a registry format (``avro``, ``jsonschema``, ``protobuf``) the ``value`` (or ``key``)
    column may be of any type, and without a ``value`` column the row's other columns are the
    value.
    """
    fields = {f.name.lower(): f.type for f in schema}
    registryValue = valueFormat in REGISTRY_FORMATS

    def check(name: str, accepted: tuple[str, ...], what: str) -> None:
        kind = fields.get(name)
        if kind is not None and _arrowKind(kind) not in accepted:
            raise TwoPhaseConfigError(
                f"kafka sink: column {name!r} has type {_sqlName(kind)}; it must be {what}"
            )

    if "value" not in fields and not registryValue:
        raise TwoPhaseConfigError(
            "kafka sink: the input needs a 'value' column (string or binary); it has "
            f"{', '.join(schema.names) or 'no columns'}"
        )
    if registryValue and "value" not in fields and not set(fields) - SINK_COLUMNS:
        raise TwoPhaseConfigError(
            f"kafka sink: value.format={valueFormat} needs a 'value' column, or other columns "
            "than key, topic, partition and headers to make the value's record of"
        )
    if valueFormat == "bytes":
        check("value", ("string", "binary"), "string or binary (or set value.format)")
    if keyFormat == "bytes":
        check("key", ("string", "binary"), "string or binary (or set key.format)")
    check("topic", ("string",), "string")
    check("partition", ("integer",), "int")
    if "topic" not in fields and not defaultTopic:
        raise TwoPhaseConfigError(
            "kafka sink: no topic: add a 'topic' column or set .option('topic', <name>)"
        )
    headers = fields.get("headers")
    if headers is not None:
        valid = (
            (pa.types.is_list(headers) or pa.types.is_large_list(headers))
            and pa.types.is_struct(headers.value_type)
            and {f.name: _arrowKind(f.type) for f in headers.value_type} in _HEADER_FIELDS
        )
        if not valid:
            raise TwoPhaseConfigError(
                f"kafka sink: column 'headers' has type {_sqlName(headers)}; it must be "
                "array<struct<key:string,value:binary>>"
            )


@dataclass(frozen=True)
class ColumnLayout:
    """Where Spark's Kafka columns are: ``value``; optional key, topic, partition, headers."""

    value: int | None
    """``None``: the value is the record of the ``rest`` columns (a registry format)."""
    key: int | None
    topic: int | None
    partition: int | None
    headers: int | None
    rest: tuple[int, ...] = ()
    """The columns other than the sink's own, in order: the value when there is no ``value``."""

    @classmethod
    def of(
        cls,
        schema: pa.Schema,
        defaultTopic: str | None,
        valueFormat: str = "bytes",
        keyFormat: str = "bytes",
    ) -> ColumnLayout:
        """Executor: check a task's Arrow schema as Spark's Kafka sink checks its DataFrame."""
        names = {name.lower(): i for i, name in enumerate(schema.names)}
        anyValue = valueFormat != "bytes"

        def column(name: str, accepted: tuple[str, ...] | None) -> int | None:
            index = names.get(name)
            if index is None:
                return None
            kind = schema.field(index).type
            if accepted is not None and _arrowKind(kind) not in accepted:
                raise KafkaWriteError(
                    f"kafka sink: column {name!r} has type {kind}; it must be "
                    f"{' or '.join(accepted)}"
                )
            return index

        value = column("value", None if anyValue else ("string", "binary", "null"))
        rest = tuple(i for i, n in enumerate(schema.names) if n.lower() not in SINK_COLUMNS)
        if value is None and not (valueFormat in REGISTRY_FORMATS and rest):
            raise KafkaWriteError(
                "kafka sink: the input has no 'value' column (string or binary); columns: "
                f"{', '.join(schema.names)}"
            )
        topic = column("topic", ("string", "null"))
        if topic is None and not defaultTopic:
            raise KafkaWriteError(
                "kafka sink: no topic: add a 'topic' column or set .option('topic', <name>)"
            )
        return cls(
            value=value,
            key=column("key", None if keyFormat != "bytes" else ("string", "binary", "null")),
            topic=None if defaultTopic else topic,
            partition=column("partition", ("integer", "null")),
            headers=column("headers", ("headers", "null")),
            rest=rest if value is None else (),
        )


def _arrowKind(kind: pa.DataType) -> str:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "string"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return "binary"
    if pa.types.is_integer(kind):
        return "integer"
    if pa.types.is_null(kind):
        return "null"
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_struct(
        kind.value_type
    ):
        fields = {f.name: _arrowKind(f.type) for f in kind.value_type}
        if fields.get("key") == "string" and fields.get("value") in ("binary", "string", "null"):
            return "headers"
    return str(kind)


def _sqlName(kind: pa.DataType) -> str:
    """Spark SQL's name of the type Spark handed over as ``kind`` (``bigint``, ``array<int>``)."""
    if kind in _SQL_NAMES:
        return _SQL_NAMES[kind]
    if pa.types.is_timestamp(kind):
        return "timestamp" if kind.tz else "timestamp_ntz"
    if pa.types.is_decimal(kind):
        return f"decimal({kind.precision},{kind.scale})"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"array<{_sqlName(kind.value_type)}>"
    if pa.types.is_struct(kind):
        return "struct<" + ",".join(f"{f.name}:{_sqlName(f.type)}" for f in kind) + ">"
    if pa.types.is_map(kind):
        return f"map<{_sqlName(kind.key_type)},{_sqlName(kind.item_type)}>"
    return str(kind)
