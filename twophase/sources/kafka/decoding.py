"""The Kafka source's values (and keys) in Avro, Protobuf or JSON Schema: the reader schema
chosen on the driver, and each task's records decoded from the registry's wire format into a
column.

The driver takes the reader schema once, at the query's start: the one ``value.schema`` gives,
or the latest version of the subject (``value.subject``, default ``<topic>-value``; the key's
likewise). A record written with another schema is decoded into the reader schema when the user
gave one (Avro's schema resolution; Protobuf's field numbers; JSON's field names), and is
otherwise a clear error naming the subject and both schema ids: a query's columns do not change
while it runs.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from twophase.schemaregistry import avro, jsonschemas
from twophase.schemaregistry.client import byId, latest, registryClient, registryConfig
from twophase.settings import TwoPhaseConfigError, optionOf
from twophase.sources.kafka.errors import KafkaSourceError

FORMATS = {"avro": avro.KIND, "protobuf": "PROTOBUF", "jsonschema": jsonschemas.KIND}
"""The value formats the source decodes, with the registry's schema type of each."""


@dataclass(frozen=True)
class RegistryValues:
    """How a task decodes values: the format, the reader schema, its id (``None`` when given by
    the user) and the registry to fetch other writers' schemas from."""

    side: str
    """``value`` or ``key``: the column decoded."""
    format: str
    recordName: str | None
    """Protobuf: the message of the file to read (``None``: its first)."""
    subject: str
    readerText: str
    readerId: int | None
    readerVersion: int | None
    given: bool
    registry: Mapping[str, str] = field(repr=False, hash=False)  # may hold secrets

    @classmethod
    def fromOptions(
        cls, options: Mapping[str, str], topics: tuple[str, ...], side: str = "value"
    ) -> RegistryValues | None:
        """Driver: ``None`` for ``<side>.format=bytes``; else the reader schema, resolved."""
        fmt = (optionOf(options, f"{side}.format") or "bytes").strip().lower()
        if fmt == "bytes":
            return None
        if fmt not in FORMATS:
            raise TwoPhaseConfigError(
                f"the kafka source's option {side}.format={fmt!r} must be bytes, avro, "
                "protobuf or jsonschema"
            )
        registry = registryConfig(options)
        if registry is None:
            raise TwoPhaseConfigError(
                f"the kafka source's option {side}.format={fmt} needs option schema.registry.url"
            )
        subject = (optionOf(options, f"{side}.subject") or "").strip()
        if not subject:
            if len(topics) != 1:
                raise TwoPhaseConfigError(
                    f"the kafka source's option {side}.format={fmt} reads the subject "
                    f"<topic>-{side} of one subscribed topic; with several topics or a pattern "
                    f"set option {side}.subject"
                )
            subject = f"{topics[0]}-{side}"
        name = (optionOf(options, f"{side}.record.name") or "").strip() or None
        given = (optionOf(options, f"{side}.schema") or "").strip()
        if given:
            values = cls(side, fmt, name, subject, given, None, None, True, registry)
        else:
            found = latest(registryClient(registry), subject)
            if found.kind.upper() != FORMATS[fmt]:
                raise TwoPhaseConfigError(
                    f"the kafka source's option {side}.format={fmt}, but subject {subject!r} "
                    f"holds a {found.kind} schema: set {side}.format to match"
                )
            values = cls(side, fmt, name, subject, found.text, found.schemaId, found.version, False,
                         registry)  # fmt: skip
        values.arrowType()  # a schema that cannot be read fails here, on the driver
        return values

    def arrowType(self) -> pa.DataType:
        """The decoded column's type: every field nullable, as Spark's DDL makes it."""
        if self.format == "protobuf":
            from twophase.schemaregistry import protobufs

            return _nullable(protobufs.arrowTypeOf(self.message()[0].DESCRIPTOR))
        if self.format == "jsonschema":
            return _nullable(jsonschemas.arrowTypeOf(json.loads(self.readerText)))
        return _nullable(avro.arrowTypeOf(json.loads(self.readerText))[0])

    def message(self) -> tuple[Any, int]:
        """Protobuf: the reader's message class and its index in the file."""
        from twophase.schemaregistry import protobufs

        where = f"subject {self.subject!r}"
        return protobufs.messageOf(protobufs.fileFromText(self.readerText, where), self.recordName)

    def toText(self) -> str:
        """For the tasks, in an option: everything but the registry settings."""
        fields = ("side", "format", "recordName", "subject", "readerText", "readerId",
                  "readerVersion", "given")  # fmt: skip
        return json.dumps({name: getattr(self, name) for name in fields}, sort_keys=True)

    @classmethod
    def fromText(cls, text: str, options: Mapping[str, str]) -> RegistryValues:
        registry = registryConfig(options)
        assert registry is not None
        return cls(**json.loads(text), registry=registry)


class RegistryDecoder:
    """Executor: a batch's ``value`` (or ``key``) column decoded (writers' schemas fetched by
    id, cached)."""

    def __init__(self, values: RegistryValues) -> None:
        self.values = values
        self.writers: dict[int, Any] = {}
        """Schema id -> how its records are read (a parsed Avro schema; Protobuf: the reader's
        message, once the writer's schema is known to be the reader's or the user gave one)."""
        if values.format == "protobuf":
            from twophase.schemaregistry import protobufs

            self.message, self.index = values.message()  # built once: the type comes from it
            self.kind = _nullable(protobufs.arrowTypeOf(self.message.DESCRIPTOR))
            self.reader: Any = protobufs.pythonOf(self.message.DESCRIPTOR)
        elif values.format == "jsonschema":
            self.kind = values.arrowType()
            self.reader = jsonschemas.pythonOf(self.kind)
        else:
            from fastavro import parse_schema

            self.kind = values.arrowType()
            self.reader = parse_schema(json.loads(values.readerText))
        if values.readerId is not None:
            self.writers[values.readerId] = self.reader

    def decode(self, batch: pa.RecordBatch, where: str) -> pa.RecordBatch:
        side = self.values.side
        index = batch.schema.get_field_index(side)
        offsets = batch.column("offset").to_pylist()
        records: list[Any] = []
        for raw, offset in zip(batch.column(index).to_pylist(), offsets, strict=True):
            if raw is None:
                records.append(None)
                continue
            if len(raw) < 5 or raw[0] != 0:
                raise KafkaSourceError(
                    f"kafka source: the {side} of the record at {where} offset {offset} is not "
                    "in the schema registry's wire format (no magic byte 0 and schema id): read "
                    f"it with {side}.format=bytes"
                )
            writer = self._writer(int.from_bytes(raw[1:5], "big"), where, offset)
            records.append(self._one(raw, writer, where, offset))
        try:
            decoded = pa.array(records, self.kind)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise KafkaSourceError(
                f"kafka source: a record at {where} offsets {offsets[0]}-{offsets[-1]} does not "
                f"fit the {side}'s columns of subject {self.values.subject!r} ({exc}): read the "
                "value as bytes to see it"
            ) from None
        return batch.set_column(index, pa.field(side, self.kind), decoded)

    def _one(self, raw: bytes, writer: Any, where: str, offset: int) -> Any:
        if self.values.format == "avro":
            from fastavro import schemaless_reader

            stream = io.BytesIO(raw)
            stream.seek(5)
            return schemaless_reader(
                stream, writer, self.reader if writer is not self.reader else None
            )
        if self.values.format == "jsonschema":
            try:
                return self.reader(json.loads(raw[5:]))
            except (ValueError, TypeError, AttributeError) as exc:
                raise KafkaSourceError(
                    f"kafka source: the record at {where} offset {offset} is not JSON of the "
                    f"schema of subject {self.values.subject!r} ({type(exc).__name__}: {exc})"
                ) from None
        from google.protobuf.message import DecodeError

        from twophase.schemaregistry import protobufs

        try:
            indexes, start = protobufs.readIndexes(raw, 5)
            if indexes != [self.index]:
                raise ValueError(f"message indexes {indexes}, not [{self.index}]")
            return self.reader(self.message.FromString(raw[start:]))
        except (ValueError, DecodeError) as exc:
            raise KafkaSourceError(
                f"kafka source: the record at {where} offset {offset} is not a "
                f"{self.message.DESCRIPTOR.full_name} of subject {self.values.subject!r} ({exc})"
            ) from None

    def _writer(self, schemaId: int, where: str, offset: int) -> Any:
        found = self.writers.get(schemaId)
        if found is not None:
            return found
        v = self.values
        writer = byId(registryClient(v.registry), schemaId, v.subject)
        same = _sameSchema(v.format, writer.text, v.readerText)
        if not v.given and not same:
            raise KafkaSourceError(
                f"kafka source: the record at {where} offset {offset} was written with schema "
                f"id {schemaId}, but the query reads subject {v.subject!r} with its version "
                f"{v.readerVersion} (id {v.readerId}), taken when it started. Restart the query "
                "to read with the new schema (its columns change), or give the schema to read "
                f"every version into with option {v.side}.schema"
            )
        if same or v.format != "avro":
            self.writers[schemaId] = self.reader
        else:
            from fastavro import parse_schema

            self.writers[schemaId] = parse_schema(json.loads(writer.text))
        return self.writers[schemaId]


def _sameSchema(fmt: str, one: str, other: str) -> bool:
    if fmt == "protobuf":
        from twophase.schemaregistry import protobufs

        try:
            return protobufs.fileFromText(one, "") == protobufs.fileFromText(other, "")
        except TwoPhaseConfigError:
            return False
    return bool(json.loads(one) == json.loads(other))


def _nullable(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_list(kind):
        return pa.list_(pa.field(kind.value_field.name, _nullable(kind.value_type)))
    if pa.types.is_map(kind):
        return pa.map_(kind.key_type, pa.field(kind.item_field.name, _nullable(kind.item_type)))
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _nullable(f.type)) for f in kind])
    return kind
