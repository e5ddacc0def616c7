"""A Kafka record's key or value in the schema registry's wire format: the options that choose
it, the schema registered on the driver, and the rows serialized on the executors.

The wire format is a zero byte, the schema id as four big-endian bytes, then the Avro binary, the
JSON text or (after the message's indexes) the Protobuf message of the row. The driver registers
(or looks up) each schema once per query, before any task writes, and hands its id and text to
the tasks in the options (``RESOLVED``): a task never writes to the registry, and a replay of a
batch serializes the same rows to the same bytes.
"""

from __future__ import annotations

import importlib.util
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from twophase.schemaregistry import avro, avrobulk, jsonschemas
from twophase.schemaregistry.client import (
    Registered,
    latest,
    lookup,
    register,
    registryClient,
    registryConfig,
)
from twophase.settings import TwoPhaseConfigError, boolOption, optionOf

BYTES, STRING, AVRO, JSONSCHEMA, PROTOBUF = "bytes", "string", "avro", "jsonschema", "protobuf"
FORMATS = (BYTES, STRING, AVRO, JSONSCHEMA, PROTOBUF)
REGISTRY_FORMATS = (AVRO, JSONSCHEMA, PROTOBUF)
PACKAGES = {AVRO: "fastavro", JSONSCHEMA: "jsonschema", PROTOBUF: "google.protobuf"}
"""The module each format needs, from the extra ``twophase[schema-registry]``."""
KINDS = {AVRO: avro.KIND, JSONSCHEMA: jsonschemas.KIND, PROTOBUF: "PROTOBUF"}
"""The registry's schema type of each format."""

STRATEGIES = {
    "topicnamestrategy": "topic",
    "recordnamestrategy": "record",
    "topicrecordnamestrategy": "topic-record",
}
"""Subject name strategies by Confluent's class names (lower-cased, package dropped)."""

RESOLVED = "twophase.kafka.{side}.registered"
"""The option where the driver leaves a side's registered schema for the tasks (JSON)."""


@dataclass(frozen=True)
class FormatSpec:
    """One side (``key`` or ``value``) of the records, as the options choose it."""

    side: str
    format: str = BYTES
    schema: str | None = None
    """The schema the user gave (``<side>.schema``); ``None``: derived from the rows."""
    strategy: str = "topic"
    recordName: str | None = None
    autoRegister: bool = True
    useLatest: bool = False

    @property
    def usesRegistry(self) -> bool:
        return self.format in REGISTRY_FORMATS

    @classmethod
    def fromOptions(cls, options: Mapping[str, str], side: str) -> FormatSpec:
        name = (optionOf(options, f"{side}.format") or BYTES).strip().lower()
        if name not in FORMATS:
            raise TwoPhaseConfigError(
                f"option {side}.format={name!r} must be one of {', '.join(FORMATS)}"
            )
        raw = (optionOf(options, f"{side}.subject.name.strategy") or "TopicNameStrategy").strip()
        strategy = STRATEGIES.get(raw.rsplit(".", 1)[-1].lower())
        if strategy is None:
            raise TwoPhaseConfigError(
                f"option {side}.subject.name.strategy={raw!r} must be TopicNameStrategy, "
                "RecordNameStrategy or TopicRecordNameStrategy"
            )
        spec = cls(
            side=side,
            format=name,
            schema=(optionOf(options, f"{side}.schema") or "").strip() or None,
            strategy=strategy,
            recordName=(optionOf(options, f"{side}.record.name") or "").strip() or None,
            autoRegister=boolOption(options, "auto.register.schemas", True),
            useLatest=boolOption(options, "use.latest.version", False),
        )
        if spec.usesRegistry and not _installed(PACKAGES[name]):
            raise TwoPhaseConfigError(
                f"option {side}.format={name} needs the Python package {PACKAGES[name]}, which "
                "is not installed: pip install 'twophase[schema-registry]'"
            )
        if spec.usesRegistry and registryConfig(options) is None:
            raise TwoPhaseConfigError(
                f"option {side}.format={name} needs option schema.registry.url (the registry's "
                "base URL, e.g. http://registry:8081)"
            )
        if not spec.usesRegistry and spec.schema is not None:
            raise TwoPhaseConfigError(
                f"option {side}.schema is set but {side}.format={name} has no schema: set "
                f"{side}.format to avro, jsonschema or protobuf"
            )
        return spec


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def resolve(
    spec: FormatSpec, options: Mapping[str, str], topic: str | None, kind: pa.DataType
) -> Registered:
    """Driver: the schema the side's rows are written with, registered or looked up under its
    subject. ``kind`` is the Arrow type of what is serialized; a given schema it does not fit
    is an error here, before any row is written."""
    config = registryConfig(options)
    assert config is not None
    client = registryClient(config)
    text, recordName = _schemaFor(spec, kind)
    subject = subjectOf(spec, topic, recordName)
    if spec.useLatest:
        found = latest(client, subject)
        _checkFits(spec, found.text, kind, subject)
        return found
    _checkFits(spec, text, kind, subject)
    if spec.autoRegister:
        return register(client, subject, text, KINDS[spec.format])
    return lookup(client, subject, text, KINDS[spec.format])


def _schemaFor(spec: FormatSpec, kind: pa.DataType) -> tuple[str, str | None]:
    """The schema text, given or derived, and its record name (``None``: not a record)."""
    if spec.format == PROTOBUF:
        from twophase.schemaregistry import protobufs

        if spec.schema is not None:
            file = protobufs.fileFromText(spec.schema, f"option {spec.side}.schema")
            message, _ = protobufs.messageOf(file, spec.recordName)
            return spec.schema, message.DESCRIPTOR.full_name
        recordName = spec.recordName or avro.DEFAULT_RECORD_NAME
        return protobufs.schemaText(protobufs.fileOf(kind, recordName)), recordName
    if spec.schema is not None:
        try:
            parsed = json.loads(spec.schema)
        except ValueError as exc:
            raise TwoPhaseConfigError(
                f"option {spec.side}.schema is not JSON ({exc}); give the schema's JSON text"
            ) from None
        if not isinstance(parsed, dict):  # a primitive ("long") or a union: no record name
            return spec.schema, None
        name = parsed.get("name") if spec.format == AVRO else parsed.get("title")
        if spec.format == AVRO and isinstance(name, str) and parsed.get("namespace"):
            name = f"{parsed['namespace']}.{name}"
        return spec.schema, name if isinstance(name, str) else None
    recordName = spec.recordName or avro.DEFAULT_RECORD_NAME
    if spec.format == AVRO:
        derived = avro.schemaOf(kind, recordName)
        isRecord = isinstance(derived, dict) and derived.get("type") == "record"
        name = recordName if isRecord else None
        return avro.schemaText(derived), name
    return jsonschemas.schemaText(jsonschemas.schemaOf(kind, recordName)), recordName


def subjectOf(spec: FormatSpec, topic: str | None, recordName: str | None) -> str:
    """The subject the side's schema lives under, by the strategy of the options."""
    if spec.strategy == "topic":
        if not topic:
            raise TwoPhaseConfigError(
                f"{spec.side}.subject.name.strategy TopicNameStrategy needs the topic: set option "
                "topic (rows whose topic column varies need RecordNameStrategy)"
            )
        return f"{topic}-{spec.side}"
    if recordName is None:
        raise TwoPhaseConfigError(
            f"{spec.side}.subject.name.strategy {spec.strategy} needs a named record: the "
            f"{spec.side} must be a struct (or give a schema with a name)"
        )
    if spec.strategy == "record":
        return recordName
    if not topic:
        raise TwoPhaseConfigError(
            f"{spec.side}.subject.name.strategy TopicRecordNameStrategy needs option topic"
        )
    return f"{topic}-{recordName}"


def _checkFits(spec: FormatSpec, text: str, kind: pa.DataType, subject: str) -> None:
    if spec.format == AVRO:
        import fastavro

        try:
            parsed = json.loads(text)
            fastavro.parse_schema(parsed)
        except Exception as exc:  # fastavro raises several kinds for a bad schema
            raise TwoPhaseConfigError(
                f"the Avro schema of {spec.side} (subject {subject!r}) is not valid: {exc}"
            ) from None
        why = avro.misfit(parsed, kind)
    elif spec.format == PROTOBUF:
        from twophase.schemaregistry import protobufs

        file = protobufs.fileFromText(text, f"the {spec.side} (subject {subject!r})")
        message, _ = protobufs.messageOf(file, spec.recordName)
        why = protobufs.misfit(message.DESCRIPTOR, kind)
    else:
        why = None  # JSON Schema is checked row by row when given
    if why is not None:
        raise TwoPhaseConfigError(
            f"the rows do not fit the {spec.format} schema of the {spec.side} (subject "
            f"{subject!r}): {why}. Change the query's columns or the schema"
        )


def resolvedOption(spec: FormatSpec, found: Registered) -> tuple[str, str]:
    """The option (name, value) that hands ``found`` to the tasks."""
    value = {"id": found.schemaId, "version": found.version, "text": found.text}
    return RESOLVED.format(side=spec.side), json.dumps(value, sort_keys=True)


class Encoder:
    """Executor: one side's values serialized with the schema the driver registered."""

    def __init__(self, spec: FormatSpec, options: Mapping[str, str]) -> None:
        self.spec = spec
        raw = optionOf(options, RESOLVED.format(side=spec.side))
        if raw is None:
            raise TwoPhaseConfigError(
                f"kafka sink: no registered schema for the {spec.side} in the task's options "
                "(the driver registers it before the tasks run)"
            )
        found = json.loads(raw)
        self.schemaId = int(found["id"])
        self.header = b"\x00" + self.schemaId.to_bytes(4, "big")
        self.schema: Any = None if spec.format == PROTOBUF else json.loads(found["text"])
        self._parsed: Any = None
        self._validator: Any = None
        self._bulk: bool | None = None
        """Whether ``avrobulk`` writes this schema (decided at the first column)."""
        self._message: Any = None
        if spec.format == PROTOBUF:
            from twophase.schemaregistry import protobufs

            file = protobufs.fileFromText(found["text"], f"the {spec.side}")
            self._message, index = protobufs.messageOf(file, spec.recordName)
            self.header += protobufs.indexBytes(index)

    def encode(self, column: pa.Array) -> tuple[pa.Array, dict[int, str]]:
        """The column's values in the wire format (a binary array, null for null), and the
        rows that could not be serialized (null in the array), by position, with why."""
        if self.spec.format == AVRO:
            if self._bulk is None:
                self._bulk = avrobulk.supports(column.type, self.schema)
            if self._bulk:
                encoded = avrobulk.encode(column, self.header)
                if encoded is not None:
                    return encoded, {}
            values, failed = self._avro(column)
        elif self.spec.format == PROTOBUF:
            values, failed = self._protobuf(column)
        else:
            values, failed = self._json(column)
        return pa.array(values, pa.binary()), failed

    def _avro(self, column: pa.Array) -> tuple[list[bytes | None], dict[int, str]]:
        """Record by record with fastavro: any schema, and why each refused row fails."""
        from fastavro import parse_schema, schemaless_writer

        if self._parsed is None:
            self._parsed = parse_schema(self.schema)
        parsed, header = self._parsed, self.header
        out: list[bytes | None] = []
        failed: dict[int, str] = {}
        buffer = io.BytesIO()
        for i, value in enumerate(avro.pythonValues(column)):
            if value is None:
                out.append(None)
                continue
            buffer.seek(0)
            buffer.truncate()
            buffer.write(header)
            try:
                schemaless_writer(buffer, parsed, value)
            except (ValueError, TypeError, AttributeError, KeyError, OverflowError) as exc:
                failed[i] = f"{type(exc).__name__}: {exc}"
                out.append(None)
                continue
            out.append(buffer.getvalue())
        return out, failed

    def _protobuf(self, column: pa.Array) -> tuple[list[bytes | None], dict[int, str]]:
        from twophase.schemaregistry import protobufrows

        rows = protobufrows.pythonRows(column)
        serialize, header = protobufrows.serializer(self._message, column.type), self.header
        out: list[bytes | None] = []
        failed: dict[int, str] = {}
        for i, row in enumerate(rows):
            if row is None:
                out.append(None)
                continue
            try:
                out.append(header + serialize(row))
            except (TypeError, ValueError) as exc:
                failed[i] = protobufrows.whyRefused(self._message, row, column.type, exc)
                out.append(None)
        return out, failed

    def _json(self, column: pa.Array) -> tuple[list[bytes | None], dict[int, str]]:
        texts = jsonschemas.rowTexts(column).to_pylist()
        header = self.header
        failed: dict[int, str] = {}
        if self.spec.schema is not None:  # a given schema: each row checked against it
            if self._validator is None:
                from jsonschema import validators

                self._validator = validators.validator_for(self.schema)(self.schema)
            for i, text in enumerate(texts):
                if text is not None:
                    error = next(iter(self._validator.iter_errors(json.loads(text))), None)
                    if error is not None:
                        where = "/".join(str(p) for p in error.absolute_path) or "the value"
                        failed[i] = f"{where}: {error.message}"
        out = [
            None if text is None or i in failed else header + text.encode()
            for i, text in enumerate(texts)
        ]
        return out, failed
