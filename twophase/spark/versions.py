"""What differs between the PySpark versions twophase runs beside (3.5 to 4.3), in one place.

Other modules of the binding import the names that depend on the version from here:

- PySpark 3.5 has no Python data sources (``pyspark.sql.datasource``): only
  ``twophase.foreachBatch`` runs there. The data source base classes below are then plain
  classes (``DataSource`` holds the options, as foreachBatch needs), and ``register`` refuses.
- PySpark 4.0's stream writer hands each task Spark rows; 4.1 added
  ``DataSourceStreamArrowWriter``, which hands Arrow record batches. ``StreamWriterBase`` is
  whichever this PySpark has, and ``taskBatches`` gives the tasks Arrow record batches on both.
- Python streaming sources with read limits and ``Trigger.AvailableNow``
  (``pyspark.sql.streaming.datasource``) are 4.2+: before, the twophase sources are skipped.
- ``to_arrow_type`` takes the time zone of timestamps (``timezone=``) from 4.2 on; before, it
  always gave UTC timestamps. ``arrowTypeOf`` calls it either way, and tells a type without an
  Arrow form (PySpark's error class, ``getCondition`` from 4.0 on) from any other error.

Features are found by what the installed PySpark has, not by its version number; the version
only names them in messages.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyspark
from pyspark.sql.types import DataType, Row

TESTED = ("3.5", "4.0", "4.1", "4.2", "4.3")
"""The PySpark minor versions twophase's compatibility suite runs on."""


PYSPARK_VERSION = pyspark.__version__


def _hasModule(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


DATA_SOURCES = _hasModule("pyspark.sql.datasource")
"""Python data sources (``spark.dataSource.register``, ``format(...)``): PySpark 4.0+."""

STREAMING_READ_LIMITS = _hasModule("pyspark.sql.streaming.datasource")
"""Python streaming sources with read limits and ``Trigger.AvailableNow``: PySpark 4.2+."""

if TYPE_CHECKING or DATA_SOURCES:
    from pyspark.sql import datasource as _datasource
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )

    ARROW_STREAM_WRITER = hasattr(_datasource, "DataSourceStreamArrowWriter")
    """A stream writer whose tasks get Arrow record batches: PySpark 4.1+."""
else:

    class DataSource:
        """PySpark 3.5 has no Python data sources: what ``twophase.foreachBatch`` needs of one
        (the options it was built with, and its name)."""

        def __init__(self, options: dict[str, str]) -> None:
            self.options = options

        @classmethod
        def name(cls) -> str:
            return cls.__name__

    class DataSourceReader:
        """Absent in PySpark 3.5 (a base class only; ``register`` refuses there)."""

    class DataSourceStreamReader:
        """Absent in PySpark 3.5 (a base class only; ``register`` refuses there)."""

    class InputPartition:
        """Absent in PySpark 3.5 (a base class only; ``register`` refuses there)."""

        def __init__(self, value: Any) -> None:
            self.value = value

    class WriterCommitMessage:
        """Absent in PySpark 3.5 (a base class only; ``register`` refuses there)."""

    ARROW_STREAM_WRITER = False

if TYPE_CHECKING or ARROW_STREAM_WRITER:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as StreamWriterBase
elif DATA_SOURCES:
    from pyspark.sql.datasource import DataSourceStreamWriter as StreamWriterBase
else:

    class StreamWriterBase:
        """Absent in PySpark 3.5 (a base class only; ``register`` refuses there)."""


if TYPE_CHECKING or STREAMING_READ_LIMITS:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
else:

    class ReadLimit:
        """Absent before PySpark 4.2 (a base class only; the sources refuse there)."""

    class ReadAllAvailable(ReadLimit):
        """Absent before PySpark 4.2 (a base class only; the sources refuse there)."""

    class ReadMaxRows(ReadLimit):
        """Absent before PySpark 4.2 (a base class only; the sources refuse there)."""

        def __init__(self, max_rows: int) -> None:
            self.max_rows = max_rows

    class SupportsTriggerAvailableNow:
        """Absent before PySpark 4.2 (a base class only; the sources refuse there)."""


class SparkVersionError(RuntimeError):
    """The installed PySpark lacks what was asked of it; the message says what to use instead."""

    errorCode = "TWOPHASE_SPARK_VERSION"


def requireDataSources() -> None:
    """Raise, in one line naming ``twophase.foreachBatch``, when PySpark has no data sources."""
    if not DATA_SOURCES:
        raise SparkVersionError(
            f"PySpark {PYSPARK_VERSION} has no Python data sources, so "
            'writeStream.format("twophase.*") cannot run on it: write with '
            '.foreachBatch(twophase.foreachBatch("twophase.files", options)) instead, or use '
            "PySpark 4.0 or later"
        )


def streamingSourceGap() -> str | None:
    """Why this PySpark cannot run the twophase streaming sources, or ``None`` when it can."""
    if STREAMING_READ_LIMITS:
        return None
    return (
        f"PySpark {PYSPARK_VERSION}'s Python streaming reader has no read limits or "
        "Trigger.AvailableNow (pyspark.sql.streaming.datasource, PySpark 4.2+)"
    )


def requireStreamingSources(name: str) -> None:
    """Raise, naming the source, when this PySpark cannot run the twophase sources."""
    gap = streamingSourceGap()
    if gap is not None:
        raise SparkVersionError(
            f"spark.readStream.format({name!r}) needs PySpark 4.2 or later: {gap}"
        )


@functools.cache
def _toArrowType() -> Callable[[DataType], pa.DataType]:
    """PySpark's ``to_arrow_type`` with UTC timestamps, its signature read once (imported on
    first use: it imports pandas)."""
    from pyspark.sql.pandas.types import to_arrow_type

    if "timezone" in inspect.signature(to_arrow_type).parameters:
        return functools.partial(to_arrow_type, timezone="UTC")
    return to_arrow_type


_UNSUPPORTED_FOR_ARROW = "UNSUPPORTED_DATA_TYPE_FOR_ARROW_CONVERSION"
"""PySpark's error class for a type that has no Arrow form."""


def arrowTypeOf(dataType: DataType) -> pa.DataType | None:
    """The Arrow type PySpark hands the tasks for ``dataType`` (timestamps in UTC), or ``None``
    when PySpark has no Arrow form for it. Any other error of PySpark's propagates as it is."""
    from pyspark.errors import PySparkTypeError

    try:
        return _toArrowType()(dataType)
    except PySparkTypeError as exc:
        if errorConditionOf(exc) == _UNSUPPORTED_FOR_ARROW:
            return None
        raise


def errorConditionOf(exc: Exception) -> str | None:
    """The error class of a PySpark error: ``getCondition()`` from 4.0 on (where
    ``getErrorClass()`` warns that it is deprecated), ``getErrorClass()`` in 3.5."""
    condition = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    return condition() if condition is not None else None


def taskBatches(
    items: Iterable[Any], arrowSchemaOfInput: Callable[[], pa.Schema]
) -> Iterator[pa.RecordBatch]:
    """A stream writer task's input as Arrow record batches, whatever this PySpark handed it.

    4.1+ hands record batches already; 4.0 hands ``Row`` objects, converted here in batches of
    ``ROWS_PER_BATCH`` to the input's Arrow schema (``arrowSchemaOfInput()``, asked only then).
    """
    if ARROW_STREAM_WRITER:
        yield from items
        return
    arrowSchema = arrowSchemaOfInput()
    chunk: list[Row] = []
    for row in items:
        chunk.append(row)
        if len(chunk) >= ROWS_PER_BATCH:
            yield rowsToArrow(chunk, arrowSchema)
            chunk = []
    if chunk:
        yield rowsToArrow(chunk, arrowSchema)


ROWS_PER_BATCH = 10_000
"""Rows of PySpark 4.0's stream writer per Arrow record batch handed to a sink's writer."""


def rowsToArrow(rows: list[Row], arrowSchema: pa.Schema) -> pa.RecordBatch:
    """Spark ``Row`` objects as one Arrow record batch of ``arrowSchema``.

    PySpark gives a timestamp as a naive ``datetime`` in the local time zone of the Python
    process; it is made aware here, so Arrow stores the same instant in UTC.
    """
    columns = []
    for i in range(len(arrowSchema)):
        target = arrowSchema.field(i).type
        values = [_pyValue(row[i], target) for row in rows]
        columns.append(pa.array(values, type=target))
    return pa.RecordBatch.from_arrays(columns, schema=arrowSchema)


def _pyValue(value: Any, target: pa.DataType) -> Any:
    """One value of a ``Row`` in the form ``pa.array`` reads as ``target``."""
    if value is None:
        return None
    if pa.types.is_timestamp(target) and target.tz is not None and isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo is None else value
    if pa.types.is_struct(target):
        fields = [target.field(j) for j in range(target.num_fields)]
        items = value.asDict() if isinstance(value, Row) else dict(value)
        return {f.name: _pyValue(items.get(f.name), f.type) for f in fields}
    if pa.types.is_map(target):
        return [
            (_pyValue(k, target.key_type), _pyValue(v, target.item_type)) for k, v in value.items()
        ]
    if pa.types.is_list(target) or pa.types.is_large_list(target):
        return [_pyValue(v, target.value_type) for v in value]
    if isinstance(value, bytearray):
        return bytes(value)
    return value


__all__ = [
    "ARROW_STREAM_WRITER",
    "DATA_SOURCES",
    "PYSPARK_VERSION",
    "STREAMING_READ_LIMITS",
    "TESTED",
    "DataSource",
    "DataSourceReader",
    "DataSourceStreamReader",
    "InputPartition",
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxRows",
    "SparkVersionError",
    "StreamWriterBase",
    "SupportsTriggerAvailableNow",
    "WriterCommitMessage",
    "arrowTypeOf",
    "errorConditionOf",
    "requireDataSources",
    "requireStreamingSources",
    "rowsToArrow",
    "streamingSourceGap",
    "taskBatches",
]
