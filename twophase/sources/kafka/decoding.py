"""The Kafka source's Avro values: the reader schema chosen on the driver, and each task's
records decoded from the registry's wire format into a ``value`` struct column.

The driver takes the reader schema once, at the query's start: the one ``value.schema`` gives,
or the latest version of the subject (``value.subject``, default ``<topic>-value``). A record
written with another schema is decoded into the reader schema when the user gave one (Avro's
schema resolution), and is otherwise a clear error naming the subject and both schema ids:
a query's columns do not change while it runs.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from twophase.schemaregistry import avro
from twophase.schemaregistry.client import byId, latest, registryClient, registryConfig
from twophase.settings import TwoPhaseConfigError, optionOf
from twophase.sources.kafka.errors import KafkaSourceError


@dataclass(frozen=True)
class AvroValues:
    """How a task decodes values: the reader schema, its id (``None`` when given by the user)
    and the registry to fetch other writers' schemas from."""

    subject: str
    readerText: str
    readerId: int | None
    readerVersion: int | None
    given: bool
    registry: Mapping[str, str] = field(repr=False, hash=False)  # may hold secrets

    @classmethod
    def fromOptions(cls, options: Mapping[str, str], topics: tuple[str, ...]) -> AvroValues | None:
        """Driver: ``None`` unless ``value.format=avro``; else the reader schema, resolved."""
        fmt = (optionOf(options, "value.format") or "bytes").strip().lower()
        if fmt == "bytes":
            return None
        if fmt != "avro":
            raise TwoPhaseConfigError(
                f"the kafka source's option value.format={fmt!r} must be bytes or avro "
                "(jsonschema and protobuf are not decoded by the source yet: read the value as "
                "bytes and use from_json)"
            )
        registry = registryConfig(options)
        if registry is None:
            raise TwoPhaseConfigError(
                "the kafka source's option value.format=avro needs option schema.registry.url"
            )
        subject = (optionOf(options, "value.subject") or "").strip()
        if not subject:
            if len(topics) != 1:
                raise TwoPhaseConfigError(
                    "the kafka source's option value.format=avro reads the subject "
                    "<topic>-value of one subscribed topic; with several topics or a pattern "
                    "set option value.subject"
                )
            subject = f"{topics[0]}-value"
        given = (optionOf(options, "value.schema") or "").strip()
        if given:
            return cls(subject, given, None, None, True, registry)
        found = latest(registryClient(registry), subject)
        return cls(subject, found.text, found.schemaId, found.version, False, registry)

    def arrowType(self) -> pa.DataType:
        """The ``value`` column's type: every field nullable, as Spark's DDL makes it."""
        return _nullable(avro.arrowTypeOf(json.loads(self.readerText))[0])

    def toText(self) -> str:
        """For the tasks, in an option: everything but the registry settings."""
        fields = ("subject", "readerText", "readerId", "readerVersion", "given")
        return json.dumps({name: getattr(self, name) for name in fields}, sort_keys=True)

    @classmethod
    def fromText(cls, text: str, options: Mapping[str, str]) -> AvroValues:
        registry = registryConfig(options)
        assert registry is not None
        return cls(**json.loads(text), registry=registry)


class AvroDecoder:
    """Executor: a batch's ``value`` column decoded (writers' schemas fetched by id, cached)."""

    def __init__(self, values: AvroValues) -> None:
        from fastavro import parse_schema

        self.values = values
        self.reader = parse_schema(json.loads(values.readerText))
        self.kind = values.arrowType()
        self.writers: dict[int, Any] = {}

    def decode(self, batch: pa.RecordBatch, where: str) -> pa.RecordBatch:
        from fastavro import schemaless_reader

        index = batch.schema.get_field_index("value")
        offsets = batch.column("offset").to_pylist()
        records: list[Any] = []
        for raw, offset in zip(batch.column(index).to_pylist(), offsets, strict=True):
            if raw is None:
                records.append(None)
                continue
            if len(raw) < 5 or raw[0] != 0:
                raise KafkaSourceError(
                    f"kafka source: the record at {where} offset {offset} is not in the schema "
                    "registry's wire format (no magic byte 0 and schema id): read it with "
                    "value.format=bytes"
                )
            writer = self._writer(int.from_bytes(raw[1:5], "big"), where, offset)
            stream = io.BytesIO(raw)
            stream.seek(5)
            reader = self.reader if writer is not self.reader else None
            records.append(schemaless_reader(stream, writer, reader))
        decoded = pa.array(records, self.kind)
        return batch.set_column(index, pa.field("value", self.kind), decoded)

    def _writer(self, schemaId: int, where: str, offset: int) -> Any:
        if schemaId == self.values.readerId:
            return self.reader
        found = self.writers.get(schemaId)
        if found is not None:
            return found
        from fastavro import parse_schema

        v = self.values
        writer = byId(registryClient(v.registry), schemaId, v.subject)
        if not v.given and json.loads(writer.text) != json.loads(v.readerText):
            raise KafkaSourceError(
                f"kafka source: the record at {where} offset {offset} was written with schema "
                f"id {schemaId}, but the query reads subject {v.subject!r} with its version "
                f"{v.readerVersion} (id {v.readerId}), taken when it started. Restart the query "
                "to read with the new schema (its columns change), or give the schema to read "
                "every version into with option value.schema"
            )
        parsed = self.reader if json.loads(writer.text) == json.loads(v.readerText) else None
        self.writers[schemaId] = parsed or parse_schema(json.loads(writer.text))
        return self.writers[schemaId]


def _nullable(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_list(kind):
        return pa.list_(pa.field(kind.value_field.name, _nullable(kind.value_type)))
    if pa.types.is_map(kind):
        return pa.map_(kind.key_type, pa.field(kind.item_field.name, _nullable(kind.item_type)))
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _nullable(f.type)) for f in kind])
    return kind
