"""``twophase verify``: did a pipeline deliver what its source offered exactly once?

Reads what a source offered (a ``twophase.sequence`` range, or the committed records of Kafka
topics in an offset range) and what a sink holds (a ``twophase.files`` directory, a PostgreSQL
table, Kafka topics read ``read_committed``), and compares the two as **multisets** of identity
tuples (by default ``id, payload`` for a sequence source and ``key, value`` for Kafka):

- *missing*: copies an identity was offered more often than the sink holds it (lost records);
- *duplicated*: extra copies of an offered identity (delivered more than once);
- *unexpected*: records whose identity was never offered (wrong or foreign rows).

Counting per identity on both sides means a source that legitimately holds equal records (a
Kafka topic with two identical messages) must find both in the sink, and no more. A record with
a wrong payload counts as one missing and one unexpected record.

The comparison is vectorised with Arrow: both sides become one table, one ``group_by`` counts
each identity's copies per side, and numpy masks pick the violations (about 2 s for 5 million
rows a side). Reading is Arrow too (datasets, pyarrow's CSV reader for PostgreSQL's ``COPY``),
except where a client hands over one record per call: Kafka's consumer, psycopg's ``COPY``
stream, and base64 binary columns of JSON files.

Readers see committed data only: pyarrow datasets skip ``_``/``.``-prefixed paths (the files
sink's ``_twophase/staging``), a SQL session sees committed rows, and Kafka is read
``read_committed``.

Library code never prints; :meth:`VerifyReport.describe` renders the report as text for the
``twophase verify`` command (``twophase.cli``).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.json as pajson

from twophase.settings import TwoPhaseConfigError, intOption, optionOf

if TYPE_CHECKING:
    from psycopg import sql

    from twophase.sinks.files import FilesSettings
    from twophase.sources.kafka import KafkaSourceSettings, KafkaStreamReader

log = logging.getLogger(__name__)

SEQUENCE_COLUMNS = ("id", "payload")
"""Default identity of a ``twophase.sequence`` source: its two columns."""

KAFKA_COLUMNS = ("key", "value")
"""Default identity of Kafka records (and of sequence rows mapped by :func:`asKafkaRecords`)."""

EXAMPLES = 5
"""How many examples of each kind of violation a report keeps by default."""

SOURCES = ("sequence", "kafka")
SINKS = ("files", "postgres", "kafka")

_SEQUENCE_CHUNK_ROWS = 1 << 20
_KAFKA_READERS = 4
_SIDE = "__twophase_verify_side"


class VerifyInputError(ValueError):
    """Verification cannot start: a missing path, table or topic, an unreachable server, a bad
    option. The message names the problem and the fix; ``twophase verify`` exits with 2."""


@contextmanager
def _inputErrors(what: str, *errors: type[Exception], fix: str = "") -> Iterator[None]:
    """Re-raise ``errors`` from the block as :class:`VerifyInputError`: ``<what>: <error><fix>``.

    The libraries' own messages already name the option or server at fault; this adds which
    side of the comparison it is, and drops the traceback the command must not show.
    """
    try:
        yield
    except VerifyInputError:
        raise
    except errors as exc:
        raise VerifyInputError(f"{what}: {exc}{fix}" if what else f"{exc}{fix}") from None


# -- the report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One identity whose counts differ: its column values, copies offered and copies held."""

    values: dict[str, Any]
    expected: int
    actual: int

    def toJson(self) -> dict[str, Any]:
        return {
            "values": {k: _jsonValue(v) for k, v in self.values.items()},
            "expected": self.expected,
            "actual": self.actual,
        }

    def describe(self) -> str:
        shown = ", ".join(
            f"{k}={json.dumps(_jsonValue(v), ensure_ascii=False)}" for k, v in self.values.items()
        )
        return f"{shown}: offered {self.expected}, found {self.actual}"


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of one comparison; ``ok`` is true exactly when delivery was exactly-once.

    Counts are in records: ``missing`` copies the sink lacks, ``duplicated`` extra copies of
    offered identities, ``unexpected`` records whose identity was never offered. Examples are
    the first identities of each kind in source order (sink order for ``unexpected``).
    """

    columns: tuple[str, ...]
    expectedRows: int
    actualRows: int
    missing: int
    duplicated: int
    unexpected: int
    missingExamples: tuple[Example, ...] = ()
    duplicatedExamples: tuple[Example, ...] = ()
    unexpectedExamples: tuple[Example, ...] = ()
    source: str = ""
    sink: str = ""
    seconds: float | None = field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.duplicated == 0 and self.unexpected == 0

    def toJson(self) -> dict[str, Any]:
        """The report as JSON-ready data (bytes become text, or ``0x``-hex when not UTF-8)."""
        return {
            "ok": self.ok,
            "source": self.source,
            "sink": self.sink,
            "columns": list(self.columns),
            "expectedRows": self.expectedRows,
            "actualRows": self.actualRows,
            "missing": self.missing,
            "duplicated": self.duplicated,
            "unexpected": self.unexpected,
            "examples": {
                "missing": [e.toJson() for e in self.missingExamples],
                "duplicated": [e.toJson() for e in self.duplicatedExamples],
                "unexpected": [e.toJson() for e in self.unexpectedExamples],
            },
            "seconds": self.seconds,
        }

    def describe(self) -> str:
        """A short human-readable report: the verdict, the counts, then the first examples."""
        verdict = "OK: exactly once" if self.ok else "VIOLATED: not exactly once"
        lines = [f"{verdict}"]
        if self.source:
            lines.append(f"  source      {self.source}")
        if self.sink:
            lines.append(f"  sink        {self.sink}")
        lines += [
            f"  identity    {', '.join(self.columns)}",
            f"  offered     {self.expectedRows} records",
            f"  found       {self.actualRows} records",
            f"  missing     {self.missing}",
            f"  duplicated  {self.duplicated} (extra copies)",
            f"  unexpected  {self.unexpected}",
        ]
        if self.seconds is not None:
            lines.append(f"  time        {self.seconds:.2f} s")
        for kind, examples in (
            ("missing", self.missingExamples),
            ("duplicated", self.duplicatedExamples),
            ("unexpected", self.unexpectedExamples),
        ):
            if examples:
                lines.append(f"first {kind}:")
                lines += [f"  {e.describe()}" for e in examples]
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.describe()


def _jsonValue(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return "0x" + bytes(value).hex()
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | dt.timedelta):
        return str(value)
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [_jsonValue(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonValue(v) for k, v in value.items()}
    return value


# -- comparing --------------------------------------------------------------------------------


def defaultColumns(table: pa.Table) -> tuple[str, ...]:
    """``id, payload`` for sequence rows, ``key, value`` for Kafka records."""
    for columns in (SEQUENCE_COLUMNS, KAFKA_COLUMNS):
        if all(c in table.column_names for c in columns):
            return columns
    raise VerifyInputError(
        f"no default identity columns for a source with columns {', '.join(table.column_names)}"
        "; name them (--columns a,b)"
    )


def compare(
    expected: pa.Table,
    actual: pa.Table,
    columns: Sequence[str] | None = None,
    *,
    actualColumns: Sequence[str] | None = None,
    examples: int = EXAMPLES,
) -> VerifyReport:
    """Compare what a source offered with what a sink holds, as multisets of identities.

    ``columns`` are the identity columns of ``expected`` (default: :func:`defaultColumns`);
    ``actualColumns`` the same columns' names in ``actual`` (default: the same names). Where
    the two sides store a column with different types (an ``int`` id in an ``int4`` column,
    Kafka's binary value in a ``text`` column) they are brought to one type first. Raises
    :class:`VerifyInputError` when a column is missing or the types cannot be compared.
    """
    names = tuple(columns) if columns else defaultColumns(expected)
    sinkNames = tuple(actualColumns) if actualColumns else names
    if len(sinkNames) != len(names):
        raise VerifyInputError(
            f"{len(names)} identity columns ({', '.join(names)}) but {len(sinkNames)} sink "
            f"columns ({', '.join(sinkNames)}); name one sink column per identity column"
        )
    _requireColumns(expected, names, "the source")
    if actual.num_rows:
        _requireColumns(actual, sinkNames, "the sink")
    keys = [f"k{i}" for i in range(len(names))]
    offered: list[pa.ChunkedArray] = []
    held: list[pa.ChunkedArray] = []
    for name, sinkName in zip(names, sinkNames, strict=True):
        want = expected.column(name)
        have = (
            actual.column(sinkName)
            if sinkName in actual.column_names
            else pa.chunked_array([], want.type)
        )
        want, have = _aligned(want, have, name, sinkName)
        offered.append(want)
        held.append(have)
    both = pa.concat_tables(
        [
            pa.table([*offered, _constant(0, expected.num_rows)], names=[*keys, _SIDE]),
            pa.table([*held, _constant(1, actual.num_rows)], names=[*keys, _SIDE]),
        ]
    )
    # Without threads, group_by keeps groups in order of first appearance: source order.
    counts = both.group_by(keys, use_threads=False).aggregate([(_SIDE, "sum"), ([], "count_all")])
    found = _numpy(counts.column(f"{_SIDE}_sum"))
    offeredCounts = _numpy(counts.column("count_all")) - found
    missingMask = offeredCounts > found
    duplicatedMask = (offeredCounts > 0) & (found > offeredCounts)
    unexpectedMask = offeredCounts == 0

    def pick(mask: np.ndarray[Any, Any]) -> tuple[Example, ...]:
        where = np.flatnonzero(mask)[: max(0, examples)]
        if not len(where):
            return ()
        rows = counts.select(keys).take(pa.array(where)).to_pylist()
        return tuple(
            Example(
                values={n: row[k] for n, k in zip(names, keys, strict=True)},
                expected=int(offeredCounts[i]),
                actual=int(found[i]),
            )
            for row, i in zip(rows, where, strict=True)
        )

    return VerifyReport(
        columns=names,
        expectedRows=expected.num_rows,
        actualRows=actual.num_rows,
        missing=int((offeredCounts - found)[missingMask].sum()),
        duplicated=int((found - offeredCounts)[duplicatedMask].sum()),
        unexpected=int(found[unexpectedMask].sum()),
        missingExamples=pick(missingMask),
        duplicatedExamples=pick(duplicatedMask),
        unexpectedExamples=pick(unexpectedMask),
    )


def _numpy(column: pa.ChunkedArray) -> np.ndarray[Any, Any]:
    if column.num_chunks == 0:
        return np.zeros(0, dtype=np.int64)
    return np.asarray(column.to_numpy(), dtype=np.int64)


def _constant(value: int, rows: int) -> pa.Array:
    return pa.array(np.full(rows, value, dtype=np.int8))


def _requireColumns(table: pa.Table, names: Iterable[str], side: str) -> None:
    absent = [n for n in names if n not in table.column_names]
    if absent:
        raise VerifyInputError(
            f"{side} has no column {', '.join(absent)} (it has "
            f"{', '.join(table.column_names) or 'none'}); name the identity columns with "
            "--columns (source) and --sink-columns (sink)"
        )


_TEXT_TYPES = frozenset([pa.string(), pa.large_string(), pa.string_view()])
_BYTES_TYPES = frozenset([pa.binary(), pa.large_binary(), pa.binary_view()])


def _isText(t: pa.DataType) -> bool:
    return t in _TEXT_TYPES


def _isBytes(t: pa.DataType) -> bool:
    return t in _BYTES_TYPES or pa.types.is_fixed_size_binary(t)


def _commonType(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type both sides are compared in, when one is obvious."""
    if pa.types.is_null(b):
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return pa.int64()
    numeric = (pa.types.is_integer, pa.types.is_floating)
    if any(f(a) for f in numeric) and any(f(b) for f in numeric):
        return pa.float64()
    if _isText(a) and _isText(b):
        return pa.large_string()
    if (_isText(a) or _isBytes(a)) and (_isText(b) or _isBytes(b)):
        return pa.large_binary()  # Kafka bytes against text: the same bytes
    return None


def _aligned(
    want: pa.ChunkedArray, have: pa.ChunkedArray, name: str, sinkName: str
) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """Both columns in one type, so equal values group together."""
    if pa.types.is_dictionary(want.type):
        want = want.cast(want.type.value_type)
    if pa.types.is_dictionary(have.type):
        have = have.cast(have.type.value_type)
    if want.type == have.type:
        return want, have
    common = _commonType(want.type, have.type)
    attempts = [common] if common is not None else [want.type, pa.large_string()]
    for target in attempts:
        try:
            return want.cast(target), have.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    raise VerifyInputError(
        f"column {name} of the source ({want.type}) and column {sinkName} of the sink "
        f"({have.type}) cannot be compared; choose comparable identity columns "
        "(--columns, --sink-columns)"
    )


# -- what the source offered ------------------------------------------------------------------


def expectedFromSequence(start: int, end: int) -> pa.Table:
    """The rows ``twophase.sequence`` offers for offsets ``[start, end)``: ``id``, ``payload``."""
    from twophase.sources.sequence import ARROW_SCHEMA, sequenceRows

    if start < 0 or end < start:
        raise VerifyInputError(
            f"sequence range [{start}, {end}) is empty or negative; give 0 <= start <= end"
        )
    batches = [
        sequenceRows(first, min(first + _SEQUENCE_CHUNK_ROWS, end))
        for first in range(start, end, _SEQUENCE_CHUNK_ROWS)
    ]
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)


def asKafkaRecords(table: pa.Table, key: str = "id", value: str = "payload") -> pa.Table:
    """Rows as a Kafka sink writes them from ``CAST(<key> AS STRING) AS key, <value> AS value``.

    For a pipeline ``twophase.sequence -> twophase.kafka``: ``key`` and ``value`` become the
    binary columns a ``read_committed`` reader of the output topic sees.
    """
    _requireColumns(table, (key, value), "the source")

    def asBytes(column: pa.ChunkedArray) -> pa.ChunkedArray:
        if not (_isText(column.type) or _isBytes(column.type)):
            column = column.cast(pa.string())
        return column.cast(pa.binary())

    return pa.table({"key": asBytes(table.column(key)), "value": asBytes(table.column(value))})


def expectedFromKafka(options: Mapping[str, str]) -> pa.Table:
    """The committed records of Kafka topics in an offset range, as Spark's Kafka source reads.

    ``options`` are those of the ``twophase.kafka`` source (``kafka.bootstrap.servers``,
    ``subscribe``/``subscribePattern``/``assign``, ``kafka.*``) plus ``endingOffsets``;
    ``startingOffsets`` defaults to ``earliest`` and ``endingOffsets`` to ``latest`` (the last
    stable offset), as in Spark's batch Kafka reader.
    """
    return _readKafka(options, "source")[0]


def actualFromKafka(options: Mapping[str, str]) -> pa.Table:
    """What a ``read_committed`` reader sees in the sink's topics: the whole topics by default.

    Takes the Kafka sink's options: ``topic`` stands for ``subscribe`` when no ``subscribe``,
    ``subscribePattern`` or ``assign`` is given; offsets as :func:`expectedFromKafka`.
    """
    return _readKafka(options, "sink")[0]


def _readKafka(options: Mapping[str, str], side: str) -> tuple[pa.Table, str]:
    from twophase.sources.kafka import (
        KafkaRange,
        KafkaSourceError,
        KafkaSourceSettings,
        KafkaStreamReader,
        _BatchBuilder,
        _offsets,
        _rows,
        readRange,
    )

    opts = {str(k): str(v) for k, v in options.items()}
    chosen = [n for n in ("subscribe", "subscribePattern", "assign") if optionOf(opts, n)]
    topic = optionOf(opts, "topic")
    if not chosen and topic:
        opts["subscribe"] = topic
    if optionOf(opts, "startingOffsets") is None:
        opts["startingOffsets"] = "earliest"
    if optionOf(opts, "requestTimeoutSeconds") is None:
        opts["requestTimeoutSeconds"] = "15"
    with _inputErrors(f"kafka {side}", TwoPhaseConfigError):
        settings = KafkaSourceSettings.fromOptions(opts)
    if side == "sink" and not settings.readCommitted:
        raise VerifyInputError(
            "kafka sink: records must be read with kafka.isolation.level=read_committed, the "
            "way users see them; remove the option"
        )
    bootstrap = settings.consumerConfig["bootstrap.servers"]
    where = f"kafka {settings.describeSubscription()} at {bootstrap}"
    reader = KafkaStreamReader(settings)
    try:
        with (
            _inputErrors(f"kafka {side}", TwoPhaseConfigError),
            _inputErrors(
                "", KafkaSourceError, fix="; check that the broker runs and kafka.bootstrap.servers"
            ),
        ):
            partitions = reader._partitions()
            _requireTopics(settings, partitions, where)
            start = _rows(reader.initialOffset())
            ending = optionOf(opts, "endingOffsets") or "latest"
            end = _endingOffsets(reader, partitions, ending)
            if settings.readCommitted and ending.strip().lower() == "latest":
                _warnOpenTransactions(settings, partitions, end, where)
    finally:
        reader.stop()
    ranges = [
        KafkaRange(t, p, start[(t, p)], end[(t, p)])
        for t, p in partitions
        if end[(t, p)] > start[(t, p)]
    ]
    description = (
        f"{where} from {json.dumps(_offsets(start))} to {json.dumps(_offsets(end))}"
        f"{' (read_uncommitted)' if not settings.readCommitted else ''}"
    )
    log.info("reading %s: %d offset ranges", description, len(ranges))
    started = time.monotonic()

    def read(r: KafkaRange) -> list[pa.RecordBatch]:
        return list(readRange(settings, r))

    empty = _BatchBuilder("", 0, settings.includeHeaders).build()
    with (
        _inputErrors("", KafkaSourceError, fix="; check the broker and the offsets"),
        ThreadPoolExecutor(max(1, min(_KAFKA_READERS, len(ranges)))) as pool,
    ):
        batches = [b for part in pool.map(read, ranges) for b in part]
    table = pa.Table.from_batches(batches, schema=empty.schema)
    log.info("%d records from %s in %.2f s", table.num_rows, where, time.monotonic() - started)
    return table, description


def _warnOpenTransactions(
    settings: KafkaSourceSettings,
    partitions: Sequence[tuple[str, int]],
    end: Mapping[tuple[str, int], int],
    where: str,
) -> None:
    """Warn when open transactions hold the last stable offset below the written end.

    Records after an open transaction (a twophase batch prepared but not yet committed, or a
    stuck producer) are not visible yet, so the comparison stops before them.
    """
    from twophase.sources.kafka import KafkaStreamReader

    uncommitted = {**settings.consumerConfig, "isolation.level": "read_uncommitted"}
    reader = KafkaStreamReader(replace(settings, consumerConfig=uncommitted))
    try:
        written = reader._listOffsets(partitions, "latest")
    finally:
        reader.stop()
    held = [
        f"{t}-{p} ({end[(t, p)]} < {written[(t, p)]})"
        for t, p in partitions
        if written[(t, p)] > end[(t, p)]
    ]
    if held:
        log.warning(
            "%s: open transactions hold back the last stable offset of %s; records after them "
            "are not counted until those transactions end",
            where,
            ", ".join(held),
        )


def _requireTopics(
    settings: KafkaSourceSettings, partitions: Sequence[tuple[str, int]], where: str
) -> None:
    found = {t for t, _ in partitions}
    absent = [t for t in settings.subscribe if t not in found]
    absent += [f"{t}-{p}" for t, p in settings.assign if (t, p) not in set(partitions)]
    if absent:
        raise VerifyInputError(
            f"{where}: no such topic or partition {', '.join(absent)}; check the topic name "
            "(subscribe, assign or topic option) and kafka.bootstrap.servers"
        )
    if not partitions:
        raise VerifyInputError(
            f"{where}: no topic matches; check subscribePattern and kafka.bootstrap.servers"
        )


def _endingOffsets(
    reader: KafkaStreamReader, partitions: Sequence[tuple[str, int]], text: str
) -> dict[tuple[str, int], int]:
    """``endingOffsets`` (``latest`` or Spark's JSON, -1 latest) resolved to numbers."""
    from twophase.sources.kafka import LATEST, _parseOffsetsJson, _rows

    latest = reader._listOffsets(partitions, "latest")
    if text.strip().lower() == "latest":
        return dict(latest)
    wanted = _rows(_parseOffsetsJson(text.strip(), "endingOffsets"))
    problems = [f"{t}-{p}" for t, p in sorted(set(partitions) ^ set(wanted))]
    if problems:
        raise VerifyInputError(
            "option endingOffsets must give an offset for exactly the partitions read; "
            f"mismatched: {', '.join(problems)}"
        )
    if any(o < LATEST for o in wanted.values()):
        raise VerifyInputError("option endingOffsets: -2 (earliest) cannot end a range")
    return {tp: latest[tp] if o == LATEST else o for tp, o in wanted.items()}


# -- what the sink holds ----------------------------------------------------------------------


def actualFromFiles(
    path: str,
    format: str = "parquet",
    *,
    columns: Sequence[str] | None = None,
    schema: pa.Schema | None = None,
    options: Mapping[str, str] | None = None,
) -> pa.Table:
    """The committed rows of a ``twophase.files`` output directory (any fsspec URL).

    Staging files (``_twophase/``) and other ``_``/``.``-prefixed paths are skipped, as every
    reader of the sink's output skips them. ``options`` are the sink's own (``partitionBy``,
    ``header``, ``fs.*``...): Hive ``col=value`` directories come back as columns.
    ``columns`` limits what is read; ``schema`` gives the types to read JSON and CSV columns
    with (so ``"007"`` stays a string), e.g. the source's types of the identity columns.
    """
    return _readFiles(path, format, columns, schema, options or {})[0]


def _readFiles(
    path: str,
    format: str,
    columns: Sequence[str] | None,
    schema: pa.Schema | None,
    options: Mapping[str, str],
) -> tuple[pa.Table, str]:
    from twophase.sinks.files import FilesSettings

    with _inputErrors("files sink", ValueError):
        settings = FilesSettings.fromOptions({**options, "path": path, "format": format})
    where = f"files {settings.path} ({settings.format})"
    with _inputErrors(f"{where}: cannot open the path", OSError, ValueError):
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
            f"{where}: cannot read the files as {settings.format}: {exc}; check the format "
            "option (the sink's format)"
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
            pa.field(n, pa.string() if _isBytes(t) else t)  # binary is written as base64
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
        if not (pa.types.is_integer(t) or _isText(t) or pa.types.is_boolean(t)):
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
        if _isBytes(t) and name in table.column_names and _isText(table.column(name).type):
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
    return _readPostgres(url, table, columns, options or {})[0]


def _readPostgres(
    url: str, table: str, columns: Sequence[str] | None, options: Mapping[str, str]
) -> tuple[pa.Table, str]:
    import psycopg
    from psycopg import sql

    from twophase.sinks.postgres import PostgresSettings, PostgresSinkError, _scrub, connect

    with _inputErrors("postgres sink", TwoPhaseConfigError):
        settings = PostgresSettings.fromOptions({**options, "url": url, "table": table})
    where = f"postgres table {settings.qualifiedName} at {settings.target.describe()}"
    with _inputErrors("", PostgresSinkError, fix="; check the url, the credentials and the server"):
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
            query = sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT (FORMAT csv)").format(
                sql.SQL(", ").join(_pgSelect(c, types[c]) for c in wanted),
                settings.tableIdentifier,
            )
            started = time.monotonic()
            data = bytearray()
            with conn.cursor() as cursor, cursor.copy(query) as copy:
                while chunk := copy.read():
                    data += chunk
    except psycopg.Error as exc:
        raise VerifyInputError(f"{where}: {' '.join(_scrub(str(exc)).split())}") from None
    finally:
        conn.close()
    result = _parsePostgresCsv(data, wanted, [types[c] for c in wanted], where)
    log.info("%d rows of %s in %.2f s", result.num_rows, where, time.monotonic() - started)
    return result, where


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
            raise VerifyInputError(f"{where}: cannot convert the rows: {exc}") from None
    for i, typname in enumerate(typnames):
        column = table.column(i)
        if typname == "bytea":
            table = table.set_column(i, names[i], _decodeHex(column))
        elif typname == "timestamptz":
            table = table.set_column(i, names[i], column.cast(pa.timestamp("us", tz="UTC")))
    return table


_HEX_DIGITS = np.zeros(256, dtype=np.uint8)
_HEX_DIGITS[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10, dtype=np.uint8)
_HEX_DIGITS[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16, dtype=np.uint8)
_HEX_DIGITS[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint8)


def _decodeHex(column: pa.ChunkedArray) -> pa.ChunkedArray:
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


# -- one call ---------------------------------------------------------------------------------


def verify(
    source: str,
    sourceOptions: Mapping[str, str],
    sink: str,
    sinkOptions: Mapping[str, str],
    *,
    columns: Sequence[str] | None = None,
    sinkColumns: Sequence[str] | None = None,
    examples: int = EXAMPLES,
) -> VerifyReport:
    """Read both sides and compare them: what ``twophase verify`` runs.

    ``source``: ``sequence`` (options ``start`` and ``end``, or the source's ``startOffset``
    and ``totalRows``) or ``kafka`` (the Kafka source's options, see
    :func:`expectedFromKafka`). ``sink``: ``files`` (the sink's options: ``path``, ``format``,
    ``partitionBy``...), ``postgres`` (``url``, ``table``...) or ``kafka`` (``topic`` or
    ``subscribe``, ``kafka.*``...). For a sequence source and a Kafka sink the rows are
    compared as the records ``CAST(id AS STRING) AS key, payload AS value``
    (:func:`asKafkaRecords`).
    """
    started = time.monotonic()
    if source not in SOURCES:
        raise VerifyInputError(f"unknown source {source!r}; use one of {', '.join(SOURCES)}")
    if sink not in SINKS:
        raise VerifyInputError(f"unknown sink {sink!r}; use one of {', '.join(SINKS)}")
    if source == "sequence":
        start, end = _sequenceRange(sourceOptions)
        expected = expectedFromSequence(start, end)
        sourceText = f"sequence ids [{start}, {end})"
        if sink == "kafka":
            expected = asKafkaRecords(expected)
            sourceText += " as key = CAST(id AS STRING), value = payload"
    else:
        expected, sourceText = _readKafka(sourceOptions, "source")
    names = tuple(columns) if columns else defaultColumns(expected)
    sinkNames = tuple(sinkColumns) if sinkColumns else names
    _requireColumns(expected, names, "the source")
    if len(sinkNames) != len(names):
        raise VerifyInputError("give one --sink-columns name per --columns name")
    hints = pa.schema(
        [pa.field(s, expected.schema.field(n).type) for n, s in zip(names, sinkNames, strict=True)]
    )
    if sink == "files":
        path = optionOf(sinkOptions, "path") or ""
        fmt = optionOf(sinkOptions, "format") or "parquet"
        actual, sinkText = _readFiles(path, fmt, sinkNames, hints, sinkOptions)
    elif sink == "postgres":
        url = optionOf(sinkOptions, "url") or ""
        table = optionOf(sinkOptions, "table") or optionOf(sinkOptions, "dbtable") or ""
        actual, sinkText = _readPostgres(url, table, sinkNames, sinkOptions)
    else:
        actual, sinkText = _readKafka(sinkOptions, "sink")
    report = compare(expected, actual, names, actualColumns=sinkNames, examples=examples)
    return replace(
        report,
        source=sourceText,
        sink=sinkText,
        seconds=round(time.monotonic() - started, 3),
    )


def _sequenceRange(options: Mapping[str, str]) -> tuple[int, int]:
    with _inputErrors("sequence source", TwoPhaseConfigError):
        first = intOption(options, "startOffset", 0, minimum=0)
        start = intOption(options, "start", first, minimum=0)
        if optionOf(options, "end") is not None:
            end = intOption(options, "end", 0, minimum=0)
        elif optionOf(options, "totalRows") is not None:
            end = start + intOption(options, "totalRows", 0, minimum=0)
        else:
            raise VerifyInputError(
                "the sequence source needs the end of the range: --end N (one past the last "
                "id offered), or the source's totalRows option"
            )
    if end < start:
        raise VerifyInputError(f"sequence source: end {end} is before start {start}")
    return start, end


__all__ = [
    "EXAMPLES",
    "KAFKA_COLUMNS",
    "SEQUENCE_COLUMNS",
    "SINKS",
    "SOURCES",
    "Example",
    "VerifyInputError",
    "VerifyReport",
    "actualFromFiles",
    "actualFromKafka",
    "actualFromPostgres",
    "asKafkaRecords",
    "compare",
    "defaultColumns",
    "expectedFromKafka",
    "expectedFromSequence",
    "verify",
]
