"""A row's bytes for the files sink's fingerprint: each row's own, whatever its types."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa

from twophase.protocol.fingerprint import Fingerprint, differenceOf
from twophase.sinks.files.multipart import recordFingerprint
from twophase.sinks.files.rowbytes import SCHEME, rowBytes


def test_a_separator_inside_a_value_is_not_a_field_boundary() -> None:
    one = pa.record_batch({"a": ["x\x1f1:y"], "b": ["z"]})
    other = pa.record_batch({"a": ["x"], "b": ["y\x1f1:z"]})
    assert rowBytes(one).to_pylist() != rowBytes(other).to_pylist()


def test_null_empty_and_the_null_marker_differ() -> None:
    rows = rowBytes(pa.record_batch({"s": ["~", "", None], "b": [b"~", b"", None]}))
    assert len(set(rows.to_pylist())) == 3
    assert rows.null_count == 0


def test_every_spark_type_gives_bytes_that_tell_rows_apart() -> None:
    utc = dt.UTC
    columns = {
        "i": pa.array([1, 2, None], pa.int64()),
        "f": pa.array([1.5, float("nan"), -0.0], pa.float64()),
        "flag": pa.array([True, False, None]),
        "d": pa.array([dt.date(2024, 1, 1), None, dt.date(1970, 1, 1)]),
        "ts": pa.array(
            [dt.datetime(2024, 1, 1, tzinfo=utc), None, dt.datetime(1, 1, 1)],
            pa.timestamp("us", "UTC"),
        ),
        "ntz": pa.array([dt.datetime(2024, 1, 1), None, None], pa.timestamp("us")),
        "dec": pa.array(
            [decimal.Decimal("1.10"), None, decimal.Decimal("-3.00")], pa.decimal128(10, 2)
        ),
        "bin": pa.array([b"\xff\x00", None, b""]),
        "arr": pa.array([[1, 2], None, []], pa.list_(pa.int32())),
        "st": pa.array([{"x": "a"}, None, {"x": None}], pa.struct([("x", pa.string())])),
        "m": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int32())),
    }
    batch = pa.record_batch(columns)
    rows = rowBytes(batch).to_pylist()
    assert len(set(rows)) == 3
    assert rowBytes(batch) == rowBytes(batch)  # the same rows give the same bytes
    for name in columns:  # a change in any one field changes the row's bytes
        changed = batch.set_column(
            batch.schema.get_field_index(name), name, columns[name].take([1, 2, 0])
        )
        assert rowBytes(changed).to_pylist() != rows, name


def test_a_swap_between_rows_changes_the_fingerprint() -> None:
    """Per-column sums would match: the fingerprint must bind a row's fields together."""
    one, swapped = Fingerprint(), Fingerprint()
    recordFingerprint(one, pa.record_batch({"id": [1, 2], "s": ["a", "b"]}))
    recordFingerprint(swapped, pa.record_batch({"id": [1, 2], "s": ["b", "a"]}))
    assert one.scheme == SCHEME
    assert differenceOf(one.toText(), swapped.toText()) is not None


def test_a_decided_fingerprint_of_the_json_scheme_is_named_not_compared() -> None:
    """Handles logged before the rows scheme carry ``n:crc:adler``: they still read, and a
    rewrite against them says why it cannot compare."""
    replay = Fingerprint()
    recordFingerprint(replay, pa.record_batch({"id": [1, 2, 3]}))
    old = "3:0000000000001234:0000000000005678"
    assert Fingerprint.fromText(old).records == 3
    assert Fingerprint.fromText(replay.toText()) == replay
    said = differenceOf(old, replay.toText())
    assert said is not None and "another twophase version" in said and SCHEME in said
