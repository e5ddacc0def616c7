"""The bare clients: a target's rows written by the Python client twophase uses, without twophase.

Each function here is a ``mapInArrow`` task that writes its rows as directly as the client
allows (Kafka: ``produce_batch`` and ``flush``, no delivery callback; PostgreSQL: one ``COPY``;
MariaDB: one ``LOAD DATA LOCAL``; S3: one ``PUT`` of a Parquet file) and commits at once. Run
in the floor's shape, it is the least a Python task pays to put the rows into that system with
that client: between the floor (rows dropped) and twophase's sink, it separates what the client
and the server cost from what twophase's protocol adds. None of it is exactly once.

Like ``bench.drop``, the module imports little and each client only inside its task, so a
worker pays only for the client it uses; a worker keeps its producer or connection for its
next tasks, as twophase's pools do.
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator
from functools import cache
from typing import Any

import pyarrow as pa

from twophase.spark.worker import freezeWorkerHeap


@cache
def _producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})


@cache
def _postgres(url: str) -> Any:
    import psycopg

    return psycopg.connect(url)


@cache
def _mariadb(url: str) -> Any:
    import pymysql
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return pymysql.connect(
        host=u.host,
        port=u.port or 3306,
        user=u.username,
        password=u.password or "",
        database=u.database,
        local_infile=True,
    )


def _done(rows: int) -> Iterator[pa.RecordBatch]:
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


def _table(batches: Iterator[pa.RecordBatch]) -> pa.Table | None:
    collected = list(batches)
    return pa.Table.from_batches(collected) if collected else None


def kafkaRows(batches: Iterator[pa.RecordBatch], bootstrap: str, topic: str) -> Any:
    """``key`` and ``value`` columns produced with ``produce_batch``, then one ``flush``; the
    producer idempotent with ``acks=all`` (as a transactional one is), no delivery callback."""
    freezeWorkerHeap()
    producer = _producer(bootstrap)
    rows = 0
    for batch in batches:
        values = batch.column("value").cast(pa.binary()).to_pylist()
        keys = batch.column("key").cast(pa.binary()).to_pylist()
        messages = [{"value": v, "key": k} for v, k in zip(values, keys, strict=True)]
        for start in range(0, len(messages), 10_000):
            while len(producer) > 50_000:
                producer.poll(0.005)
            producer.produce_batch(topic, messages[start : start + 10_000])
        rows += batch.num_rows
    left = producer.flush(60)
    if left:
        raise RuntimeError(f"bare kafka: {left} records not acknowledged")
    return _done(rows)


def _csv(table: pa.Table) -> bytes:
    """The rows as CSV by Arrow's writer, instants as their UTC wall clock (the session's zone
    is UTC), as twophase's PostgreSQL sink writes them."""
    import pyarrow.csv as pacsv

    from twophase.sinks.postgres.encoding import utcWallClock

    columns = [utcWallClock(c.combine_chunks()) for c in table.columns]
    out = pa.BufferOutputStream()
    ready = pa.Table.from_arrays(columns, names=table.column_names)
    pacsv.write_csv(ready, out, pacsv.WriteOptions(include_header=False))
    return out.getvalue().to_pybytes()


def postgresRows(batches: Iterator[pa.RecordBatch], url: str, table: str) -> Any:
    """The rows as CSV by Arrow's writer, one ``COPY`` into ``table``, one commit (psycopg)."""
    from psycopg import sql

    freezeWorkerHeap()
    data = _table(batches)
    if data is None:
        return _done(0)
    body = _csv(data)
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, data.column_names))
    )
    conn = _postgres(url)
    with conn.transaction(), conn.cursor() as cur, cur.copy(statement) as copy:
        copy.write(body)
    return _done(data.num_rows)


def mariadbRows(batches: Iterator[pa.RecordBatch], url: str, table: str) -> Any:
    """The rows as CSV by Arrow's writer, one ``LOAD DATA LOCAL INFILE`` into ``table`` from
    an in-memory file, one commit (PyMySQL)."""
    freezeWorkerHeap()
    data = _table(batches)
    if data is None:
        return _done(0)
    body = _csv(data)
    fd = os.memfd_create("bare-load")
    try:
        os.write(fd, body)
        conn = _mariadb(url)
        columns = ", ".join(f"`{c}`" for c in data.column_names)
        with conn.cursor() as cur:
            cur.execute(
                f"LOAD DATA LOCAL INFILE '/proc/self/fd/{fd}' INTO TABLE `{table}` "
                "FIELDS TERMINATED BY ',' OPTIONALLY ENCLOSED BY '\"' "
                f"LINES TERMINATED BY '\\n' ({columns})"
            )
            if cur.rowcount != data.num_rows:
                raise RuntimeError(f"bare mariadb: {cur.rowcount} of {data.num_rows} rows")
        conn.commit()
    finally:
        os.close(fd)
    return _done(data.num_rows)


def s3Rows(batches: Iterator[pa.RecordBatch], root: str, options: dict[str, Any]) -> Any:
    """The rows as one Parquet file (Arrow's writer, in memory), one ``PUT`` under ``root``
    (s3fs, as twophase's files sink on S3 uses botocore through it)."""
    import fsspec
    import pyarrow.parquet as pq

    freezeWorkerHeap()
    data = _table(batches)
    if data is None:
        return _done(0)
    buffer = io.BytesIO()
    pq.write_table(data, buffer)
    fs = fsspec.filesystem("s3", **options)
    fs.pipe_file(f"{root}/part-{uuid.uuid4().hex}.parquet", buffer.getvalue())
    return _done(data.num_rows)
