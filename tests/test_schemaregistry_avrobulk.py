"""The bulk Avro writer gives, byte for byte, what fastavro writes record by record."""

from __future__ import annotations

import datetime as dt
import io
import random
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from twophase.schemaregistry import avro, avrobulk

HEADER = b"\x00\x00\x00\x01\x00"


def columns(rows: int) -> dict[str, pa.Array]:
    rnd = random.Random(7)

    def integer(bits: int) -> int:
        edges = [0, -1, 1, 63, 64, -64, -65, 2 ** (bits - 1) - 1, -(2 ** (bits - 1))]
        return rnd.choice([*edges, rnd.randint(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)])

    def some(values: list[Any]) -> Any:
        return rnd.choice(values)

    stamps = [dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC), None,
              dt.datetime(2024, 1, 1, tzinfo=dt.UTC)]  # fmt: skip
    return {
        "flag": pa.array([some([True, False, None]) for _ in range(rows)]),
        "tiny": pa.array([integer(8) for _ in range(rows)], pa.int8()),
        "int": pa.array([some([integer(32), None]) for _ in range(rows)], pa.int32()),
        "long": pa.array([integer(64) for _ in range(rows)], pa.int64()),
        "float": pa.array([rnd.uniform(-1e6, 1e6) for _ in range(rows)], pa.float32()),
        "double": pa.array(
            [some([0.0, -0.0, float("inf"), 1.5, rnd.random(), None]) for _ in range(rows)]
        ),  # fmt: skip
        "text": pa.array(
            [some(["", "é€😀", "x" * rnd.randint(0, 300), None]) for _ in range(rows)]
        ),
        "bin": pa.array(
            [some([b"", b"\x00\xff", bytes(rnd.randint(0, 200)), None]) for _ in range(rows)]
        ),  # fmt: skip
        "day": pa.array([some([dt.date(1, 1, 1), dt.date(1970, 1, 1), None]) for _ in range(rows)]),
        "at": pa.array([some(stamps) for _ in range(rows)], pa.timestamp("us", "UTC")),
        "local": pa.array([dt.datetime(2024, 1, 1, 1, 2, 3, 4000)] * rows, pa.timestamp("ms")),
    }


def byFastavro(column: pa.Array, schema: Any) -> list[bytes | None]:
    parsed = fastavro.parse_schema(schema)
    out: list[bytes | None] = []
    for value in avro.pythonValues(column):
        if value is None:
            out.append(None)
            continue
        buffer = io.BytesIO()
        buffer.write(HEADER)
        fastavro.schemaless_writer(buffer, parsed, value)
        out.append(buffer.getvalue())
    return out


def test_records_of_every_flat_type_match_fastavro() -> None:
    cols = columns(2000)
    fields = [pa.field(name, c.type, nullable=name != "long") for name, c in cols.items()]
    valid = pa.array([i % 17 != 0 for i in range(2000)])
    records = pa.StructArray.from_arrays(list(cols.values()), fields=fields, mask=pc.invert(valid))
    schema = avro.schemaOf(records.type, "it.Flat")
    assert avrobulk.supports(records.type, schema)
    encoded = avrobulk.encode(records, HEADER)
    assert encoded is not None and encoded.to_pylist() == byFastavro(records, schema)


@pytest.mark.parametrize("name", sorted(columns(1)))
def test_single_values_match_fastavro(name: str) -> None:
    column = columns(500)[name]
    schema = avro.schemaOf(column.type)
    encoded = avrobulk.encode(column, HEADER)
    assert encoded is not None and encoded.to_pylist() == byFastavro(column, schema)


def test_what_it_does_not_write_goes_to_fastavro() -> None:
    nested = pa.struct([("a", pa.list_(pa.int64()))])
    assert not avrobulk.supports(nested, avro.schemaOf(nested))
    flat = pa.struct([("a", pa.int64())])
    reordered = {"type": "record", "name": "topLevelRecord",
                 "fields": [{"name": "a", "type": ["long", "null"]}]}  # fmt: skip
    assert not avrobulk.supports(flat, reordered)
    strict = pa.StructArray.from_arrays(
        [pa.array([1, None], pa.int64())], fields=[pa.field("a", pa.int64(), nullable=False)]
    )
    assert avrobulk.encode(strict, HEADER) is None  # a null the schema refuses: fastavro names it
