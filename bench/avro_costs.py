"""Per-row costs of serializing the bench's event rows outside Spark, for ``make
bench-kafka-avro``: the pandas UDF's way (``to_dict`` and confluent-kafka's ``AvroSerializer``),
fastavro per row and per field, and twophase's encoders (Avro a column at once, JSON Schema,
Protobuf); the three Avro ways are checked to write the same bytes.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from functools import partial
from typing import Any

from bench._common import markdownTable
from bench.kafka_avro import COLUMNS, HAND_SCHEMA, RECORD_NAME, Bench, serializerFor


def bestOf(way: Any, rows: int, tries: int = 3) -> tuple[float, Any]:
    """The fewest µs per row of ``tries`` calls of ``way()``, and its result."""
    best, out = float("inf"), None
    for _ in range(tries):
        started = time.perf_counter()
        out = way()
        best = min(best, time.perf_counter() - started)
    return best / rows * 1e6, out


def serializerCosts(bench: Bench, shape: Any, rows: int) -> float:
    """µs per row of each way to serialize the same rows, outside Spark, and fastavro's per
    field; returns what (b) pays per row before Spark's sink (the UDF's dicts and serializer)."""
    import fastavro
    import pyarrow as pa
    from confluent_kafka.serialization import MessageField, SerializationContext

    from twophase.schemaregistry import avro, avrobulk, protobufs
    from twophase.schemaregistry.formats import RESOLVED, Encoder, FormatSpec
    from twophase.spark.versions import arrowTypeOf

    kind = arrowTypeOf(bench.frame(shape).drop("key").schema)  # the stream's nullability
    derived = avro.schemaText(avro.schemaOf(kind, RECORD_NAME))
    if derived != avro.schemaText(HAND_SCHEMA) or not avrobulk.supports(kind, HAND_SCHEMA):
        raise SystemExit(f"(b)'s schema is not the one (a) derives and writes in bulk: {derived}")
    batch = bench.spark.range(rows).selectExpr(
        "id", f"rpad(concat('row-', id), {bench.args.detail_bytes}, '.') AS payload"
    )
    table = batch.selectExpr(*COLUMNS).drop("key").toArrow().cast(pa.schema(list(kind)))
    column = pa.StructArray.from_arrays([c.combine_chunks() for c in table.columns], fields=kind)
    topic = f"bench-kafka-avro-micro-{uuid.uuid4().hex[:8]}"
    bench.topics.append(topic)  # for its subject: cleanup deletes both (no such topic is fine)
    records = table.to_pandas().to_dict("records")
    serialize = serializerFor(bench.registry, bench.schema)
    ctx = SerializationContext(topic, MessageField.VALUE)
    header = serialize(records[0], ctx)[:5]  # registers the subject, outside the timing
    fields: list[Any] = HAND_SCHEMA["fields"]  # type: ignore[assignment]

    def fastavroRows(fields: Any, batch: list[dict[str, Any]], prefix: bytes = b"") -> list[bytes]:
        """Each record as fastavro writes it with the given fields of HAND_SCHEMA."""
        parsed = fastavro.parse_schema({**HAND_SCHEMA, "fields": fields})
        out, buffer = [], io.BytesIO()
        for record in batch:
            buffer.seek(0)
            buffer.truncate()
            buffer.write(prefix)
            fastavro.schemaless_writer(buffer, parsed, record)
            out.append(buffer.getvalue())
        return out

    ways = {
        "pandas to_dict('records') (the UDF's rows)": lambda: table.to_pandas().to_dict("records"),
        "AvroSerializer per row (confluent-kafka)": lambda: [serialize(r, ctx) for r in records],
        "fastavro schemaless_writer per row": partial(fastavroRows, fields, records, header),
        "avrobulk.encode, column at once (twophase)": lambda: avrobulk.encode(column, header),
    }
    cost, out = {}, {}
    for name, way in ways.items():
        cost[name], out[name] = bestOf(way, rows)
    confluent, written, bulk = list(out.values())[1:]
    bulk = [v.as_py() for v in bulk]
    same = confluent == written == bulk
    print(
        f"\nserializing outside Spark, {rows:,} event rows of ~{len(bulk[0])} bytes of Avro "
        f"(best of 3); the same bytes from the three serializers: {same}"
    )
    base = list(cost.values())[-1]
    cells = [[name, f"{us:.2f}", f"{us / base:.1f}x"] for name, us in cost.items()]
    print("\n" + markdownTable(["way", "µs/row", "over avrobulk"], cells))
    cells = [["(empty record)", f"{bestOf(partial(fastavroRows, [], [{}] * rows), rows)[0]:.2f}"]]
    for f in fields:
        alone = partial(fastavroRows, [f], [{f["name"]: r[f["name"]]} for r in records])
        cells.append([f"{f['name']}: {json.dumps(f['type'])}", f"{bestOf(alone, rows)[0]:.2f}"])
    print(
        "\nfastavro per row, a record of each field alone (the UDF's values; the empty "
        "record's cost is in each):\n\n" + markdownTable(["field", "µs/row"], cells)
    )
    cells = []  # twophase's other registry formats, the same column
    for fmt, text in (
        ("jsonschema", "{}"),
        ("protobuf", protobufs.schemaText(protobufs.fileOf(kind, RECORD_NAME))),
    ):
        registered = json.dumps({"id": 1, "version": 1, "text": text})
        encoder = Encoder(FormatSpec("value", fmt), {RESOLVED.format(side="value"): registered})
        cells.append([f"twophase {fmt}", f"{bestOf(partial(encoder.encode, column), rows)[0]:.2f}"])
    print("\nthe same rows in the other formats:\n\n" + markdownTable(["way", "µs/row"], cells))
    if not same:
        raise SystemExit("the three serializers wrote different bytes")
    toDict, perRow = list(cost.values())[:2]
    return toDict + perRow
