"""What ``twophase.spark.versions`` does without a running Spark: the Arrow types, schemas and
record batches PySpark's tasks see, and what this PySpark is said to support.

These run under whatever PySpark the venv has (``make test-compat`` builds one venv per
version); no JVM is started.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DateType,
    DecimalType,
    LongType,
    MapType,
    Row,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    YearMonthIntervalType,
)

from twophase.settings import TwoPhaseConfigError
from twophase.spark import versions
from twophase.spark.schema import arrowSchemaOf

SCHEMA = StructType(
    [
        StructField("id", LongType(), nullable=False),
        StructField("name", StringType()),
        StructField("at", TimestampType()),
        StructField("local", TimestampNTZType()),
        StructField("day", DateType()),
        StructField("amount", DecimalType(10, 2)),
        StructField("raw", BinaryType()),
        StructField("tags", ArrayType(StringType())),
        StructField("attrs", MapType(StringType(), LongType())),
        StructField(
            "inner", StructType([StructField("a", LongType()), StructField("b", StringType())])
        ),
    ]
)


def test_timestamps_are_utc_whatever_to_arrow_type_takes() -> None:
    assert versions.arrowTypeOf(TimestampType()) == pa.timestamp("us", tz="UTC")
    assert versions.arrowTypeOf(TimestampNTZType()) == pa.timestamp("us")


def test_a_type_without_an_arrow_form_is_named_with_its_column() -> None:
    assert versions.arrowTypeOf(YearMonthIntervalType()) is None
    schema = StructType(
        [StructField("id", LongType()), StructField("span", YearMonthIntervalType())]
    )
    with pytest.raises(TwoPhaseConfigError, match=r"column 'span' has type interval year to month"):
        arrowSchemaOf(schema, "twophase.files")


def test_rows_become_the_record_batch_arrow_would_have_handed_the_task() -> None:
    """PySpark 4.0's stream writer hands rows: every kind of column comes out as the Arrow type
    ``arrowSchemaOf`` says, a timestamp as the same instant in UTC."""
    os.environ["TZ"] = "America/New_York"  # rows carry naive local time: make local not UTC
    time.tzset()
    try:
        arrowSchema = arrowSchemaOf(SCHEMA)
        instant = datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)
        rows = [
            Row(
                1,
                "a",
                instant.astimezone().replace(tzinfo=None),  # as PySpark gives a timestamp
                datetime(2026, 1, 2, 3, 4, 5),
                date(2026, 1, 2),
                Decimal("12.34"),
                bytearray(b"\x00\x01"),
                ["x", "y"],
                {"k": 7},
                Row(a=2, b="c"),
            ),
            Row(2, None, None, None, None, None, None, None, None, None),
        ]
        batch = versions.rowsToArrow(rows, arrowSchema)
    finally:
        del os.environ["TZ"]
        time.tzset()
    assert batch.schema == arrowSchema
    first, second = batch.to_pylist()
    assert first["at"] == instant
    assert first["local"] == datetime(2026, 1, 2, 3, 4, 5)
    assert first["raw"] == b"\x00\x01"
    assert first["attrs"] == [("k", 7)]
    assert first["inner"] == {"a": 2, "b": "c"}
    assert second == {"id": 2, **{name: None for name in SCHEMA.fieldNames()[1:]}}


def test_task_input_is_cut_into_record_batches() -> None:
    schema = pa.schema([pa.field("id", pa.int64())])
    if versions.ARROW_STREAM_WRITER:
        given = [pa.record_batch([pa.array([1, 2])], schema=schema)]
        assert list(versions.taskBatches(given, lambda: schema)) == given
    else:
        rows = [Row(i) for i in range(versions.ROWS_PER_BATCH + 1)]
        batches = list(versions.taskBatches(rows, lambda: schema))
        assert [b.num_rows for b in batches] == [versions.ROWS_PER_BATCH, 1]


def test_what_this_pyspark_runs_is_said_in_one_line_naming_the_way_out() -> None:
    if versions.DATA_SOURCES:
        versions.requireDataSources()
    else:
        with pytest.raises(versions.SparkVersionError, match=r"twophase\.foreachBatch"):
            versions.requireDataSources()
    gap = versions.streamingSourceGap()
    if versions.STREAMING_READ_LIMITS:
        assert gap is None
        versions.requireStreamingSources("twophase.sequence")
    else:
        assert gap is not None and versions.PYSPARK_VERSION in gap
        with pytest.raises(versions.SparkVersionError, match=r"twophase\.sequence.*4\.2"):
            versions.requireStreamingSources("twophase.sequence")


def test_the_installed_pyspark_is_one_the_compatibility_suite_runs() -> None:
    assert ".".join(versions.PYSPARK_VERSION.split(".")[:2]) in versions.TESTED
