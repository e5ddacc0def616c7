"""What a sink holds: the committed rows of a files directory, a PostgreSQL table, Kafka topics.

Readers see committed data only: pyarrow datasets skip ``_``/``.``-prefixed paths (the files
sink's staging path beside the output), a SQL session sees committed rows, and Kafka is read
``read_committed``. Reading is Arrow (datasets, pyarrow's CSV reader for PostgreSQL's
``COPY``), except where a client hands over one record per call: psycopg's ``COPY`` stream and
base64 binary columns of JSON files. :func:`readSink` reads one sink by its kind, as ``twophase
verify`` names it (a SQL table through :mod:`~twophase.verify.sql`).
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.json as pajson

from twophase.redaction import getLogger, redact
from twophase.settings import TwoPhaseConfigError, optionOf
from twophase.sinks.files import FilesSettings
from twophase.sinks.registry import readableKinds, specOf
from twophase.verify.compare import isBytes, isText
from twophase.verify.errors import VerifyInputError, inputErrors

if TYPE_CHECKING:
    from psycopg import sql

    from twophase.sinks.postgres import PostgresSettings

log = getLogger(__name__)


def actualFromFiles(
    path: str,
    format: str = "parquet",
    *,
    columns: Sequence[str] | None = None,
    schema: pa.Schema | None = None,
    options: Mapping[str, str] | None = None,
) -> pa.Table:
    """The committed rows of a ``twophase.files`` output directory (any fsspec URL).

    ``_``/``.``-prefixed paths are skipped, as Spark and pyarrow skip them (the sink stages its
    files outside the output path, so no reader meets them there). ``options`` are the sink's
    own (``partitionBy``, ``header``, ``fs.*``...): Hive ``col=value`` directories come back as
    columns.
    ``columns`` limits what is read; ``schema`` gives the types to read JSON and CSV columns
    with (so ``"007"`` stays a string), e.g. the source's types of the identity columns.
    """
    return readFiles(path, format, columns, schema, options or {})[0]


def readFiles(
    path: str,
    format: str,
    columns: Sequence[str] | None,
    schema: pa.Schema | None,
    options: Mapping[str, str],
) -> tuple[pa.Table, str]:
    """:func:`actualFromFiles` and a description of what was read, for the report."""
    with inputErrors("files sink", ValueError):
        settings = FilesSettings.fromOptions({**options, "path": path, "format": format})
    where = redact(f"files {settings.path} ({settings.format})")
    with inputErrors(f"{where}: cannot open the path", OSError, ValueError):
        fs, root = fsspec.core.url_to_fs(settings.path, **settings.storageOptions)
        exists = fs.isdir(root)
    if not exists:
        raise VerifyInputError(
            f"{where}: no such directory; give the sink's output path (its path option)"
        )
    hints = {f.name: f.type for f in schema} if schema is not None else {}
    try:
        dataset = ds.dataset(
            root,
            filesystem=fs,
            format=_fileFormat(settings, hints),
            partitioning=_partitioning(settings.partitionBy, hints),
            ignore_prefixes=[".", "_"],
        )
        wanted = list(columns) if columns is not None else dataset.schema.names
        if not dataset.files:
            log.info("%s holds no committed files", where)
            empty = {n: pa.array([], hints.get(n, pa.null())) for n in wanted}
            return pa.table(empty) if empty else pa.table({}), where
        absent = [c for c in wanted if c not in dataset.schema.names]
        if absent:
            raise VerifyInputError(
                f"{where}: no column {', '.join(absent)} (its files have "
                f"{', '.join(dataset.schema.names)}); name the sink's columns with --sink-columns"
            )
        started = time.monotonic()
        table = dataset.to_table(columns=wanted)
    except (pa.ArrowInvalid, OSError) as exc:
        raise VerifyInputError(
            f"{where}: cannot read the files as {settings.format}: {redact(str(exc))}; check "
            "the format option (the sink's format)"
        ) from None
    table = _decodeJsonBinary(table, settings.format, hints)
    log.info(
        "%d rows in %d files of %s in %.2f s",
        table.num_rows,
        len(dataset.files),
        where,
        time.monotonic() - started,
    )
    return table, where


def _fileFormat(settings: FilesSettings, hints: Mapping[str, pa.DataType]) -> ds.FileFormat:
    if settings.format == "csv":
        types = {n: t for n, t in hints.items() if not pa.types.is_nested(t)}
        return ds.CsvFileFormat(
            read_options=pacsv.ReadOptions(autogenerate_column_names=not settings.header),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            # The sink writes null as an empty field and "" as a quoted empty string.
            convert_options=pacsv.ConvertOptions(
                column_types=types,
                null_values=[""],
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
            ),
        )
    if settings.format == "json":
        fields = [
            pa.field(n, pa.string() if isBytes(t) else t)  # binary is written as base64
            for n, t in hints.items()
            if n not in settings.partitionBy
        ]
        return ds.JsonFileFormat(
            parse_options=pajson.ParseOptions(
                explicit_schema=pa.schema(fields), unexpected_field_behavior="infer"
            )
        )
    return ds.ParquetFileFormat()


def _partitioning(
    partitionBy: Sequence[str], hints: Mapping[str, pa.DataType]
) -> str | ds.Partitioning:
    """Hive partitioning; typed by the hints when the sink's ``partitionBy`` is known."""
    if not partitionBy:
        return "hive"
    fields = []
    for name in partitionBy:
        t = hints.get(name, pa.string())
        if not (pa.types.is_integer(t) or isText(t) or pa.types.is_boolean(t)):
            t = pa.string()  # compared after a cast
        fields.append(pa.field(name, t))
    return ds.HivePartitioning(pa.schema(fields))


def _decodeJsonBinary(table: pa.Table, format: str, hints: Mapping[str, pa.DataType]) -> pa.Table:
    """JSON files hold binary columns as base64 text (as Spark writes them): decode those.

    Per value in Python, as the sink encodes them; only binary identity columns take this path.
    """
    if format != "json":
        return table
    for name, t in hints.items():
        if isBytes(t) and name in table.column_names and isText(table.column(name).type):
            try:
                values = [
                    None if v is None else base64.b64decode(v, validate=True)
                    for v in table.column(name).to_pylist()
                ]
            except (binascii.Error, ValueError):
                continue  # not base64: compare as text
            index = table.column_names.index(name)
            table = table.set_column(index, name, pa.array(values, pa.binary()))
    return table


_PG_TYPES: dict[str, pa.DataType] = {
    "int2": pa.int16(),
    "int4": pa.int32(),
    "int8": pa.int64(),
    "float4": pa.float32(),
    "float8": pa.float64(),
    "bool": pa.bool_(),
    "text": pa.string(),
    "varchar": pa.string(),
    "bpchar": pa.string(),
    "name": pa.string(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us"),
}
"""PostgreSQL types read as themselves; ``bytea`` and ``timestamptz`` are converted, every
other type is read as its text form and compared after a cast."""


def actualFromPostgres(
    url: str,
    table: str,
    *,
    columns: Sequence[str] | None = None,
    options: Mapping[str, str] | None = None,
) -> pa.Table:
    """The committed rows of a PostgreSQL table, read with one ``COPY ... TO STDOUT``.

    ``url`` and ``options`` as for the ``twophase.postgres`` sink (``user``, ``password``,
    ``sslmode``, ``pg.*``...; the password may come from ``PGPASSWORD`` or ``~/.pgpass``);
    ``table`` is ``schema.table``. ``columns`` limits what is read (default: all). Passwords
    never reach a log line or an error message.
    """
    return readPostgres(url, table, columns, options or {})[0]


def readPostgres(
    url: str, table: str, columns: Sequence[str] | None, options: Mapping[str, str]
) -> tuple[pa.Table, str]:
    """:func:`actualFromPostgres` and a description of what was read, for the report."""
    import psycopg
    from psycopg import sql

    from twophase.clients.postgres import PostgresSinkError, connect, errorText
    from twophase.sinks.postgres import PostgresSettings

    with inputErrors("postgres sink", TwoPhaseConfigError):
        settings = PostgresSettings.fromOptions({**options, "url": url, "table": table})
    where = f"postgres table {settings.qualifiedName} at {settings.target.describe()}"
    with inputErrors("", PostgresSinkError, fix="; check the url, the credentials and the server"):
        conn = connect(
            settings.target, settings.secrets, autocommit=True, retrySeconds=0, what="verify"
        )
    try:
        with conn:
            catalog = conn.execute(
                "SELECT a.attname, t.typname FROM pg_attribute a"
                " JOIN pg_class c ON c.oid = a.attrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " JOIN pg_type t ON t.oid = a.atttypid"
                " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0"
                " AND NOT a.attisdropped ORDER BY a.attnum",
                (settings.schema, settings.table),
            ).fetchall()
            if not catalog:
                raise VerifyInputError(
                    f"{where}: no such table; check the table option (schema.table) and the "
                    "database in the url"
                )
            types = {str(name): str(typname) for name, typname in catalog}
            wanted = list(columns) if columns is not None else list(types)
            absent = [c for c in wanted if c not in types]
            if absent:
                raise VerifyInputError(
                    f"{where}: no column {', '.join(absent)} (it has {', '.join(types)}); name "
                    "the sink's columns with --sink-columns"
                )
            source: sql.Composable = settings.tableIdentifier
            if settings.badRecords is not None:  # rows the sink set aside count as held
                source = _withSetAside(settings, wanted, types)
                where += f" and the rows set aside in {settings.badRecords}"
            query = sql.SQL("COPY (SELECT {} FROM {} AS held) TO STDOUT (FORMAT csv)").format(
                sql.SQL(", ").join(_pgSelect(c, types[c]) for c in wanted), source
            )
            started = time.monotonic()
            data = bytearray()
            with conn.cursor() as cursor, cursor.copy(query) as copy:
                while chunk := copy.read():
                    data += chunk
    except psycopg.Error as exc:
        raise VerifyInputError(f"{where}: {errorText(exc)}") from None
    finally:
        conn.close()
    result = _parsePostgresCsv(data, wanted, [types[c] for c in wanted], where)
    log.info("%d rows of %s in %.2f s", result.num_rows, where, time.monotonic() - started)
    return result, where


def _withSetAside(
    settings: PostgresSettings, wanted: Sequence[str], types: Mapping[str, str]
) -> sql.Composable:
    """The target's rows and those its sink set aside in the ``badRecords`` table (read
    back from their JSON, bytes from hex), as one derived table."""
    from psycopg import sql

    assert settings.badRecords is not None

    def fromJson(column: str) -> sql.Composable:
        value = sql.SQL("(record ->> {})").format(sql.Literal(column))
        if types[column] == "bytea":
            return sql.SQL("decode({}, 'hex') AS {}").format(value, sql.Identifier(column))
        return sql.SQL("{}::{} AS {}").format(
            value, sql.Identifier(types[column]), sql.Identifier(column)
        )

    return sql.SQL("(SELECT {} FROM {} UNION ALL SELECT {} FROM {})").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in wanted),
        settings.tableIdentifier,
        sql.SQL(", ").join(fromJson(c) for c in wanted),
        sql.Identifier(settings.schema, settings.badRecords),
    )


def _pgSelect(column: str, typname: str) -> sql.Composable:
    from psycopg import sql

    ident = sql.Identifier(column)
    if typname == "bytea":
        return sql.SQL("encode({}, 'hex')").format(ident)
    if typname == "timestamptz":
        return sql.SQL("({} AT TIME ZONE 'UTC')").format(ident)
    if typname in _PG_TYPES:
        return ident
    return sql.SQL("{}::text").format(ident)


def _parsePostgresCsv(
    data: bytearray, names: Sequence[str], typnames: Sequence[str], where: str
) -> pa.Table:
    readTypes = [
        _PG_TYPES.get(t, pa.timestamp("us") if t == "timestamptz" else pa.string())
        for t in typnames
    ]
    if not data:
        table = pa.table([pa.array([], t) for t in readTypes], names=list(names))
    else:
        try:
            table = pacsv.read_csv(
                pa.py_buffer(bytes(data)),
                read_options=pacsv.ReadOptions(column_names=list(names)),
                parse_options=pacsv.ParseOptions(newlines_in_values=True),
                # COPY's csv: NULL is an empty field, "" a quoted empty string.
                convert_options=pacsv.ConvertOptions(
                    column_types=dict(zip(names, readTypes, strict=True)),
                    null_values=[""],
                    strings_can_be_null=True,
                    quoted_strings_can_be_null=False,
                    true_values=["t"],
                    false_values=["f"],
                ),
            )
        except pa.ArrowInvalid as exc:
            raise VerifyInputError(
                f"{where}: cannot convert the rows: {redact(str(exc))}"
            ) from None
    for i, typname in enumerate(typnames):
        column = table.column(i)
        if typname == "bytea":
            table = table.set_column(i, names[i], decodeHex(column))
        elif typname == "timestamptz":
            table = table.set_column(i, names[i], column.cast(pa.timestamp("us", tz="UTC")))
    return table


_HEX_DIGITS = np.zeros(256, dtype=np.uint8)
_HEX_DIGITS[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10, dtype=np.uint8)
_HEX_DIGITS[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16, dtype=np.uint8)
_HEX_DIGITS[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint8)


def decodeHex(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Hex text (``encode(bytea, 'hex')``) to binary, vectorised with numpy."""
    chunks = []
    for chunk in column.chunks:
        text = chunk.cast(pa.large_binary())
        if len(text) == 0:
            chunks.append(pa.array([], pa.binary()))
            continue
        _, offsetsBuffer, dataBuffer = text.buffers()
        offsets = np.frombuffer(offsetsBuffer, np.int64)[text.offset : text.offset + len(text) + 1]
        digits = (
            np.frombuffer(dataBuffer, np.uint8)[offsets[0] : offsets[-1]]
            if dataBuffer is not None
            else np.zeros(0, np.uint8)
        )
        nibbles = _HEX_DIGITS[digits]
        decoded = (nibbles[0::2] << 4) | nibbles[1::2]
        newOffsets = ((offsets - offsets[0]) // 2).astype(np.int64)
        values = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), len(text), [None, pa.py_buffer(newOffsets), pa.py_buffer(decoded)]
        )
        if text.null_count:
            values = pc.if_else(text.is_null(), pa.scalar(None, pa.large_binary()), values)
        chunks.append(values.cast(pa.binary()))
    return pa.chunked_array(chunks, pa.binary())


def readFilesSink(
    options: Mapping[str, str], columns: Sequence[str] | None, hints: pa.Schema | None
) -> tuple[pa.Table, str]:
    """The files sink's reader for verify: its ``path`` and ``format`` from its options."""
    path = optionOf(options, "path") or ""
    fmt = optionOf(options, "format") or "parquet"
    return readFiles(path, fmt, columns, hints, options)


def readPostgresSink(
    options: Mapping[str, str], columns: Sequence[str] | None, hints: pa.Schema | None
) -> tuple[pa.Table, str]:
    """The postgres sink's reader for verify: its ``url`` and ``table`` from its options."""
    url = optionOf(options, "url") or ""
    table = optionOf(options, "table") or optionOf(options, "dbtable") or ""
    return readPostgres(url, table, columns, options)


def readSink(
    sink: str, options: Mapping[str, str], columns: Sequence[str], hints: pa.Schema
) -> tuple[pa.Table, str]:
    """What one sink of kind ``sink`` holds, and a description for the report, read with the
    reader its registry entry names (``twophase.sinks.registry``).

    ``columns`` are the identity columns to read, ``hints`` their types on the source's side
    (to read JSON and CSV files with). A kind the registry does not know, or one verify cannot
    read, is a ``VerifyInputError`` naming the kinds it reads.
    """
    try:
        spec = specOf(sink)
    except TwoPhaseConfigError:
        spec = None
    if spec is None or spec.reader is None:
        raise VerifyInputError(
            f"twophase verify cannot read a sink of kind {sink!r} here; it reads "
            f"{', '.join(k for k in readableKinds() if k != 'multi')} (and multi through its "
            "targets). A sink of your own: read what it holds with your own reader"
        )
    return spec.readerFunction()(options, columns, hints)


def actualFromKafka(options: Mapping[str, str]) -> pa.Table:
    """What a ``read_committed`` reader sees in the sink's topics: the whole topics by default.

    Takes the Kafka sink's options: ``topic`` stands for ``subscribe`` when no ``subscribe``,
    ``subscribePattern`` or ``assign`` is given; offsets as ``expectedFromKafka``.
    """
    from twophase.verify.kafka import readKafka

    return readKafka(options, "sink")[0]


__all__ = [
    "actualFromFiles",
    "actualFromKafka",
    "actualFromPostgres",
    "decodeHex",
    "readFiles",
    "readFilesSink",
    "readPostgres",
    "readPostgresSink",
    "readSink",
]
