"""``make bench-latency``'s targets: Spark's own sink, twophase's options and a reader of what is
committed, for Kafka, files and PostgreSQL.

Each reader records when it first sees each row (its id and creation time) and counts rows it
sees again: a ``read_committed`` consumer, a poller of the files a reader may see, a poller of
PostgreSQL's committed rows. A reader runs in a process of its own (``ReaderProcess``): at tens
of thousands of rows a second its Python work would otherwise take the driver's interpreter
from ``twophase.foreachBatch``, whose coordinator runs there.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
from psycopg import sql

from bench import kafka as kb
from bench import postgres as pb


@dataclass
class Arrivals:
    """What a reader saw: each row's creation time and when it saw it, by id; ids seen again."""

    rows: dict[int, tuple[float, float]] = field(default_factory=dict)
    repeated: int = 0

    def add(self, rowId: int, created: int, now: float) -> None:
        if rowId in self.rows:
            self.repeated += 1
        else:
            self.rows[rowId] = (created / 1e6, now)


Poll = Callable[[threading.Event, Arrivals], None]


class ReaderProcess:
    """A reader's ``poll`` in a forked process; ``finish()`` stops it and returns what it saw."""

    def __init__(self, poll: Poll) -> None:
        context = multiprocessing.get_context("fork")
        self.stop = context.Event()
        self.received, sending = context.Pipe(duplex=False)
        self.process = context.Process(target=_read, args=(poll, self.stop, sending))
        self.process.daemon = True

    def start(self) -> None:
        self.process.start()

    def finish(self) -> Arrivals:
        self.stop.set()
        ids, created, now, repeated = self.received.recv()
        self.process.join()
        seen = Arrivals(repeated=repeated)
        columns = [array(code, data) for code, data in (("q", ids), ("d", created), ("d", now))]
        seen.rows = {i: (c, n) for i, c, n in zip(*columns, strict=True)}
        return seen


def _read(poll: Poll, stop: Any, sending: Any) -> None:
    seen = Arrivals()
    poll(stop, seen)
    rows = seen.rows
    sending.send((
        array("q", rows).tobytes(),
        array("d", (c for c, _ in rows.values())).tobytes(),
        array("d", (n for _, n in rows.values())).tobytes(),
        seen.repeated,
    ))  # fmt: skip


class LatencyTarget:
    """One system: Spark's own sink, twophase's options and a reader of what is committed."""

    columns = ("value AS id", "unix_micros(timestamp) AS created")

    def __init__(self, work: Path) -> None:
        self.work = work

    def prepare(self, label: str) -> None:
        """Create the empty place the path ``label`` writes into."""

    def sparkWriter(self, frame: Any, label: str) -> Any:
        raise NotImplementedError

    def twophaseOptions(self, label: str) -> dict[str, str]:
        raise NotImplementedError

    def reader(self, label: str, own: bool) -> Poll:
        """A loop that records each committed row's arrival until its event is set."""
        raise NotImplementedError

    def cleanup(self) -> None:
        """Remove what ``prepare`` made."""


class KafkaLatency(LatencyTarget):
    columns = ("CAST(value AS STRING) AS key", "CAST(unix_micros(timestamp) AS STRING) AS value")

    def __init__(self, work: Path, bootstrap: str) -> None:
        super().__init__(work)
        self.bootstrap = bootstrap
        self.topics: dict[str, str] = {}

    def prepare(self, label: str) -> None:
        self.topics[label] = kb.createTopic(self.bootstrap, 8, f"latency-{label}")

    def sparkWriter(self, frame: Any, label: str) -> Any:
        return (
            frame.writeStream.format("kafka")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("topic", self.topics[label])
        )

    def twophaseOptions(self, label: str) -> dict[str, str]:
        return {"kafka.bootstrap.servers": self.bootstrap, "topic": self.topics[label]}

    def reader(self, label: str, own: bool) -> Poll:
        topic = self.topics[label]

        def poll(stop: threading.Event, seen: Arrivals) -> None:
            consumer = kb.committedReader(self.bootstrap, topic, range(8), fetch_wait_max_ms=10)
            try:
                while not stop.is_set():
                    for message in consumer.consume(10000, 0.02):
                        if message.error() is None:
                            now = time.time()
                            seen.add(int(message.key() or b"-1"), int(message.value() or 0), now)
            finally:
                consumer.close()

        return poll

    def cleanup(self) -> None:
        if self.topics:
            kb.deleteTopics(self.bootstrap, list(self.topics.values()))


class FilesLatency(LatencyTarget):
    """Parquet files: twophase's files are visible once in place; Spark's once its
    ``_spark_metadata`` log lists them (what Spark's own readers of the directory trust)."""

    def directory(self, label: str) -> Path:
        return self.work / f"files-{label}"

    def sparkWriter(self, frame: Any, label: str) -> Any:
        return frame.writeStream.format("parquet").option("path", str(self.directory(label)))

    def twophaseOptions(self, label: str) -> dict[str, str]:
        return {"path": str(self.directory(label))}

    def reader(self, label: str, own: bool) -> Poll:
        out = self.directory(label)

        def visible() -> Iterator[Path]:
            if not own:
                yield from sorted(out.glob("part-*.parquet"))
                return
            log = out / "_spark_metadata"
            if not log.is_dir():
                return
            for entry in sorted(log.iterdir()):
                if entry.name.startswith(".") or entry.name.endswith(".tmp"):
                    continue
                for line in entry.read_text().splitlines()[1:]:
                    path = json.loads(line)["path"]
                    yield Path(path.removeprefix("file:"))

        def poll(stop: threading.Event, seen: Arrivals) -> None:
            done: set[Path] = set()
            while not stop.is_set():
                for path in visible():
                    if path in done:
                        continue
                    now = time.time()
                    done.add(path)
                    table = pq.read_table(path, columns=["id", "created"])
                    for rowId, created in zip(
                        table.column("id").to_pylist(),
                        table.column("created").to_pylist(),
                        strict=True,
                    ):
                        seen.add(rowId, created, now)
                stop.wait(0.02)

        return poll


class PostgresLatency(LatencyTarget):
    """A table of (id, created); the reader polls committed rows above the lowest id it has not
    seen yet (the rate source's ids have no gaps, so that id only moves forward)."""

    def __init__(self, work: Path, url: str) -> None:
        super().__init__(work)
        self.url = url
        self.tables: dict[str, str] = {}

    def prepare(self, label: str) -> None:
        table = f"bench_latency_{label}".lower()
        self.tables[label] = table
        pb.dropTables(self.url, [table])
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, created bigint)").format(
                    sql.Identifier(table)
                )
            )

    def sparkWriter(self, frame: Any, label: str) -> Any:
        jdbc, props = pb.jdbcTarget(self.url)
        table = self.tables[label]

        def writeBatch(df: Any, batchId: int) -> None:
            df.write.jdbc(jdbc, table, mode="append", properties=props)

        return frame.writeStream.foreachBatch(writeBatch)

    def twophaseOptions(self, label: str) -> dict[str, str]:
        return {"url": self.url, "table": self.tables[label]}

    def reader(self, label: str, own: bool) -> Poll:
        query = sql.SQL("SELECT id, created FROM {} WHERE id >= %s").format(
            sql.Identifier(self.tables[label])
        )

        def poll(stop: threading.Event, seen: Arrivals) -> None:
            low = 0
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not stop.is_set():
                    rows = conn.execute(query, (low,)).fetchall()
                    now = time.time()
                    for rowId, created in rows:
                        if rowId not in seen.rows:
                            seen.add(rowId, created, now)
                    while low in seen.rows:
                        low += 1
                    stop.wait(0.02)

        return poll

    def cleanup(self) -> None:
        if self.tables:
            pb.dropTables(self.url, list(self.tables.values()))
