"""Protobuf schemas for Spark's rows: a proto3 message derived from an Arrow type, the message
class of a registered schema, the wire format's message indexes, and message bytes back to Arrow
values (rows to message bytes: ``protobufrows``).

The registry keeps a Protobuf schema as the base64 of its ``FileDescriptorProto``, the way
confluent-kafka's ``ProtobufSerializer`` registers it; well-known types it imports
(``google.protobuf.Timestamp``) are not registered, as that serializer skips them too. A schema
kept as ``.proto`` text cannot be read here: Python has no ``.proto`` parser without protoc.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from twophase.settings import TwoPhaseConfigError

KIND = "PROTOBUF"
TIMESTAMP = "google.protobuf.Timestamp"
_TIMESTAMP_FILE = "google/protobuf/timestamp.proto"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
F = descriptor_pb2.FieldDescriptorProto


# Derived schemas ---------------------------------------------------------------------------


def fileOf(kind: pa.DataType, recordName: str) -> descriptor_pb2.FileDescriptorProto:
    """A proto3 file with one message for values of ``kind`` (a struct's fields in order, or
    one field ``value``), named ``recordName`` (``package.Message``). Nullable columns are
    ``optional`` fields, so a null stays distinct from zero; timestamps are
    ``google.protobuf.Timestamp``, dates ``int32`` days since 1970-01-01, decimals ``string``."""
    package, _, name = recordName.rpartition(".")
    for part in recordName.split("."):
        if not _NAME.fullmatch(part):
            raise TwoPhaseConfigError(
                f"{recordName!r} is not a Protobuf message name (letters, digits and _, dots "
                "between the package's parts): set option value.record.name (key.record.name)"
            )
    file = descriptor_pb2.FileDescriptorProto(
        name=f"{recordName.replace('.', '/')}.proto", package=package, syntax="proto3"
    )
    fields = list(kind) if pa.types.is_struct(kind) else [pa.field("value", kind)]
    path = f".{package}.{name}" if package else f".{name}"
    _message(file.message_type.add(name=name), path, fields, file)
    return file


def _message(
    message: descriptor_pb2.DescriptorProto,
    path: str,
    fields: list[pa.Field],
    file: descriptor_pb2.FileDescriptorProto,
) -> None:
    for number, f in enumerate(fields, start=1):
        if not _NAME.fullmatch(f.name):
            raise TwoPhaseConfigError(
                f"column {f.name!r} is not a Protobuf field name (letters, digits and _): "
                "rename it in the query (alias)"
            )
        field = message.field.add(name=f.name, number=number, label=F.LABEL_OPTIONAL)
        kind = f.type
        if pa.types.is_map(kind):
            entry = message.nested_type.add(name=_typeName(message, f.name, "Entry"))
            entry.options.map_entry = True
            entryPath = f"{path}.{entry.name}"
            key, value = pa.field("key", kind.key_type), pa.field("value", kind.item_type)
            _message(entry, entryPath, [key, value], file)
            for part in entry.field:
                part.ClearField("proto3_optional")
                part.ClearField("oneof_index")
            del entry.oneof_decl[:]
            field.label, field.type, field.type_name = F.LABEL_REPEATED, F.TYPE_MESSAGE, entryPath
            continue
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            if _isList(kind.value_type) or pa.types.is_map(kind.value_type):
                raise TwoPhaseConfigError(
                    f"column {f.name!r}: an array of arrays or maps has no Protobuf type; wrap "
                    "the inner value in a struct"
                )
            field.label, kind = F.LABEL_REPEATED, kind.value_type
        if pa.types.is_struct(kind):
            nested = message.nested_type.add(name=_typeName(message, f.name))
            field.type, field.type_name = F.TYPE_MESSAGE, f"{path}.{nested.name}"
            _message(nested, field.type_name, list(kind), file)
        elif pa.types.is_timestamp(kind):
            field.type, field.type_name = F.TYPE_MESSAGE, f".{TIMESTAMP}"
            if _TIMESTAMP_FILE not in file.dependency:
                file.dependency.append(_TIMESTAMP_FILE)
        else:
            field.type = _scalar(kind, f.name)
            if field.label != F.LABEL_REPEATED and f.nullable:
                field.proto3_optional = True
                field.oneof_index = len(message.oneof_decl)
                message.oneof_decl.add(name=f"_{f.name}")


def _scalar(kind: pa.DataType, name: str) -> int:
    t = pa.types
    if t.is_boolean(kind):
        return F.TYPE_BOOL
    if t.is_integer(kind):
        if kind.bit_width < 32 or kind == pa.int32():
            return F.TYPE_INT32
        return F.TYPE_UINT64 if kind == pa.uint64() else F.TYPE_INT64
    if t.is_floating(kind):
        return F.TYPE_DOUBLE if kind == pa.float64() else F.TYPE_FLOAT
    if t.is_string(kind) or t.is_large_string(kind) or t.is_decimal(kind):
        return F.TYPE_STRING
    if t.is_binary(kind) or t.is_large_binary(kind) or t.is_fixed_size_binary(kind):
        return F.TYPE_BYTES
    if t.is_date32(kind):
        return F.TYPE_INT32
    raise TwoPhaseConfigError(
        f"column {name!r} of type {kind} has no Protobuf type here: cast it (to a string, a "
        "number or a struct) in the query"
    )


def _typeName(message: descriptor_pb2.DescriptorProto, field: str, suffix: str = "") -> str:
    """A nested type's name for ``field`` (``line_items`` -> ``LineItems``), unique in
    ``message``."""
    base = "".join(part[:1].upper() + part[1:] for part in field.split("_") if part) or "Value"
    taken = {t.name for t in message.nested_type}
    name, n = base + suffix, 2
    while name in taken:
        name, n = f"{base}{n}{suffix}", n + 1
    return name


def _isList(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def schemaText(file: descriptor_pb2.FileDescriptorProto) -> str:
    """The schema as the registry keeps it: the base64 of the serialized file."""
    return base64.b64encode(file.SerializeToString(deterministic=True)).decode()


def fileFromText(text: str, where: str) -> descriptor_pb2.FileDescriptorProto:
    """The file a registered (or given) schema text holds; ``where`` names it in errors."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        file = descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        file = None
    if file is None or not file.message_type:
        raise TwoPhaseConfigError(
            f"the Protobuf schema of {where} is not a base64 FileDescriptorProto with a message "
            "(.proto text cannot be read without protoc): register it from Python "
            "(confluent-kafka's ProtobufSerializer) or give "
            "base64(MyMessage.DESCRIPTOR.file.serialized_pb)"
        )
    return file


def messageOf(file: descriptor_pb2.FileDescriptorProto, name: str | None) -> tuple[Any, int]:
    """The message class named ``name`` (full name; ``None``: the file's only message) and its
    index among the file's top-level messages, as the wire format's message indexes count."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    try:
        pool.Add(file)
    except (TypeError, ValueError) as exc:  # what protoc would refuse: clashing names, ...
        raise TwoPhaseConfigError(
            f"the Protobuf schema of message(s) {', '.join(m.name for m in file.message_type)} "
            f"is not valid: {exc}. Rename the columns (or fix the given schema)"
        ) from None
    prefix = f"{file.package}." if file.package else ""
    names = [prefix + m.name for m in file.message_type]
    if name is None and len(names) > 1:
        raise TwoPhaseConfigError(
            f"the Protobuf schema has several messages ({', '.join(names)}): choose the one "
            "the records hold with option value.record.name (key.record.name)"
        )
    chosen = names[0] if name is None else name
    if chosen not in names:
        raise TwoPhaseConfigError(
            f"the Protobuf schema has no top-level message {chosen!r} (it has "
            f"{', '.join(names)}): set option value.record.name (key.record.name) to one of them"
        )
    found = pool.FindMessageTypeByName(chosen)
    return message_factory.GetMessageClass(found), names.index(chosen)


def indexBytes(index: int) -> bytes:
    """The wire format's message indexes for top-level message ``index`` (zigzag varints; the
    first message is the single byte 0)."""
    if index == 0:
        return b"\x00"
    return _varint(2) + _varint(index << 1)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def readIndexes(raw: bytes, at: int) -> tuple[list[int], int]:
    """The message indexes at ``raw[at:]`` and where the message starts."""
    count, at = _readZigzag(raw, at)
    if count == 0:
        return [0], at
    indexes = []
    for _ in range(count):
        value, at = _readZigzag(raw, at)
        indexes.append(value)
    return indexes, at


def _readZigzag(raw: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(raw) or shift > 63:
            raise ValueError("truncated message indexes")
        byte = raw[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), at
        shift += 7


def misfit(message: Descriptor, kind: pa.DataType) -> str | None:
    """Why values of Arrow type ``kind`` cannot be written as ``message``, or ``None``: each
    column needs a field of its name and of a type that holds it (names and types, not values)."""
    columns = list(kind) if pa.types.is_struct(kind) else [pa.field("value", kind)]
    for column in columns:
        f = message.fields_by_name.get(column.name)
        if f is None:
            return f"message {message.full_name} has no field {column.name!r}"
        why = _fieldMisfit(f, column.type)
        if why is not None:
            return f"field {message.full_name}.{column.name}: {why}"
    return None


def _fieldMisfit(f: FieldDescriptor, kind: pa.DataType) -> str | None:
    t = pa.types
    if _isMap(f) != t.is_map(kind) or (_repeated(f) and not _isMap(f)) != _isList(kind):
        return f"{_protoName(f)} cannot hold {kind}"
    if t.is_map(kind):
        entry = f.message_type.fields_by_name
        return _fieldMisfit(entry["key"], kind.key_type) or _fieldMisfit(
            entry["value"], kind.item_type
        )
    single = kind.value_type if _isList(kind) else kind
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        if f.message_type.full_name == TIMESTAMP:
            return None if t.is_timestamp(single) else f"Timestamp cannot hold {single}"
        return misfit(f.message_type, single) if t.is_struct(single) else (
            f"message {f.message_type.full_name} cannot hold {single}")  # fmt: skip
    wanted = _SCALARS.get(f.type)
    ok = (
        {
            pa.bool_(): t.is_boolean(single),
            pa.int32(): (t.is_integer(single) and single.bit_width <= 32) or t.is_date32(single),
            pa.int64(): t.is_integer(single) or t.is_date32(single),
            pa.float32(): t.is_floating(single) or t.is_integer(single),
            pa.float64(): t.is_floating(single) or t.is_integer(single),
            pa.string(): t.is_string(single) or t.is_large_string(single) or t.is_decimal(single),
            pa.binary(): t.is_binary(single) or t.is_large_binary(single),
        }.get(wanted, False)
        if f.type != FieldDescriptor.TYPE_ENUM
        else t.is_string(single)
    )
    return None if ok else f"{_protoName(f)} cannot hold {single}"


def _protoName(f: FieldDescriptor) -> str:
    if f.message_type is not None:
        return f.message_type.full_name
    names = {v: k for k, v in vars(FieldDescriptor).items() if k.startswith("TYPE_")}
    return names.get(f.type, str(f.type)).removeprefix("TYPE_").lower()


# Messages to Arrow --------------------------------------------------------------------------


def arrowTypeOf(message: Descriptor) -> pa.DataType:
    """The Arrow type of a message's values: a struct of its fields (enums as their names,
    ``google.protobuf.Timestamp`` as a UTC timestamp, maps as maps, repeated as lists)."""
    return pa.struct([pa.field(f.name, _fieldType(f)) for f in message.fields])


def _fieldType(f: FieldDescriptor) -> pa.DataType:
    if _isMap(f):
        entry = f.message_type
        return pa.map_(_singleType(entry.fields_by_name["key"]),
                       _singleType(entry.fields_by_name["value"]))  # fmt: skip
    single = _singleType(f)
    return pa.list_(single) if _repeated(f) else single


def _repeated(f: FieldDescriptor) -> bool:
    if hasattr(f, "is_repeated"):  # protobuf 6+; ``label`` is gone in 7
        return bool(f.is_repeated)
    return bool(f.label == FieldDescriptor.LABEL_REPEATED)


def _isMap(f: FieldDescriptor) -> bool:
    return bool(
        _repeated(f) and f.message_type is not None and f.message_type.GetOptions().map_entry
    )


_SCALARS = {
    FieldDescriptor.TYPE_BOOL: pa.bool_(),
    FieldDescriptor.TYPE_INT32: pa.int32(),
    FieldDescriptor.TYPE_SINT32: pa.int32(),
    FieldDescriptor.TYPE_SFIXED32: pa.int32(),
    FieldDescriptor.TYPE_UINT32: pa.int64(),
    FieldDescriptor.TYPE_FIXED32: pa.int64(),
    FieldDescriptor.TYPE_INT64: pa.int64(),
    FieldDescriptor.TYPE_SINT64: pa.int64(),
    FieldDescriptor.TYPE_SFIXED64: pa.int64(),
    FieldDescriptor.TYPE_UINT64: pa.int64(),  # as Spark's from_protobuf reads them
    FieldDescriptor.TYPE_FIXED64: pa.int64(),
    FieldDescriptor.TYPE_FLOAT: pa.float32(),
    FieldDescriptor.TYPE_DOUBLE: pa.float64(),
    FieldDescriptor.TYPE_STRING: pa.string(),
    FieldDescriptor.TYPE_BYTES: pa.binary(),
    FieldDescriptor.TYPE_ENUM: pa.string(),
}


def _singleType(f: FieldDescriptor) -> pa.DataType:
    if f.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
        if f.message_type.full_name == TIMESTAMP:
            return pa.timestamp("us", "UTC")
        return arrowTypeOf(f.message_type)
    return _SCALARS[f.type]


def pythonOf(message: Descriptor) -> Callable[[Message], dict[str, Any]]:
    """A parsed message to the Python value of ``arrowTypeOf(message)``: a field with presence
    (``optional``, a message) that is not set is null, others read as proto3 defines them."""
    readers = [(f.name, _reader(f)) for f in message.fields]

    def read(parsed: Message) -> dict[str, Any]:
        return {name: reader(parsed) for name, reader in readers}

    return read


def _reader(f: FieldDescriptor) -> Callable[[Message], Any]:
    name = f.name
    if _isMap(f):
        value = _converter(f.message_type.fields_by_name["value"])
        return lambda m: [(k, value(v)) for k, v in getattr(m, name).items()]
    single = _converter(f)
    if _repeated(f):
        return lambda m: [single(v) for v in getattr(m, name)]
    if f.has_presence:
        return lambda m: single(getattr(m, name)) if m.HasField(name) else None
    return lambda m: single(getattr(m, name))


def _converter(f: FieldDescriptor) -> Callable[[Any], Any]:
    if f.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
        if f.message_type.full_name == TIMESTAMP:
            return lambda v: v.ToDatetime(tzinfo=dt.UTC)
        return pythonOf(f.message_type)
    if f.type == FieldDescriptor.TYPE_ENUM:
        enum = f.enum_type
        return lambda v: enum.values_by_number[v].name if v in enum.values_by_number else str(v)
    return lambda v: v
