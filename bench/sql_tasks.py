"""``make bench-sql``'s ``--per-task``: where one ``twophase.sql`` task's time goes, outside Spark.

Task attempts run through ``SqlWriter`` in one process, as in a reused PySpark worker (the writer
unpickled for each), with the database drivers' calls timed by phase (TLS context, connect, each
statement, close) and the rest counted as Python; the driver's commits count for no task.
"""

from __future__ import annotations

import pickle
import statistics
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from bench._common import markdownTable


class PhaseTimer:
    """Wall time of the database drivers' calls, by phase; a call inside a timed call counts
    for the outer one (PyMySQL's session set-up runs inside its ``connect``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._active = False

    def wrap(self, owner: Any, name: str, phase: Callable[..., str]) -> Callable[[], None]:
        """Time ``owner.name`` under ``phase(*args)``; returns the undo."""
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._active:
                return original(*args, **kwargs)
            self._active = True
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase(*args, **kwargs)] += time.perf_counter() - started
                self._active = False

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, original)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Calls made meanwhile count for no phase."""
        self._active = True
        try:
            yield
        finally:
            self._active = False


STATEMENTS = ("XA START", "XA BEGIN", "XA END", "XA PREPARE", "PREPARE TRANSACTION", "BEGIN")


def statementPhase(marker: str) -> Callable[..., str]:
    def phase(_self: Any, sql: Any = "", *args: Any, **kwargs: Any) -> str:
        if not isinstance(sql, str | bytes):
            return "other statements"
        text = (sql.decode() if isinstance(sql, bytes) else sql).lstrip().upper()
        if text in ("", ";"):
            return "ping"
        for head in STATEMENTS:
            if text.startswith(head):
                return head
        if text.startswith("INSERT"):
            return "marker INSERT" if marker.upper() in text[:80] else "rows INSERT"
        return "other statements"

    return phase


@contextmanager
def driverTimers(timer: PhaseTimer, marker: str) -> Iterator[None]:
    """Time the drivers' own calls (PyMySQL and psycopg), SQLAlchemy's engine and dialect
    set-up, and the TLS context PyMySQL builds per connection."""
    import ssl

    import psycopg
    import pymysql.connections
    from sqlalchemy.dialects.mysql.base import MySQLDialect
    from sqlalchemy.dialects.postgresql.base import PGDialect

    statement = statementPhase(marker)
    undo = [
        timer.wrap(ssl, "create_default_context", lambda *a, **k: "TLS context"),
        timer.wrap(sa, "create_engine", lambda *a, **k: "engine created"),
        timer.wrap(MySQLDialect, "initialize", lambda *a, **k: "dialect initialised"),
        timer.wrap(PGDialect, "initialize", lambda *a, **k: "dialect initialised"),
        timer.wrap(pymysql.connections.Connection, "connect", lambda *a, **k: "connect"),
        timer.wrap(pymysql.connections.Connection, "query", statement),
        timer.wrap(pymysql.connections.Connection, "close", lambda *a, **k: "close"),
        timer.wrap(psycopg, "connect", lambda *a, **k: "connect"),
        timer.wrap(psycopg.Connection, "close", lambda *a, **k: "close"),
        timer.wrap(psycopg.Cursor, "execute", statement),
        timer.wrap(psycopg.Cursor, "executemany", statement),
    ]
    try:
        yield
    finally:
        for u in reversed(undo):
            u()


def perTaskBreakdown(url: str, tasks: int, rowsPerTask: int) -> str:
    """``tasks`` task attempts through ``SqlWriter`` in this process; a Markdown table of the
    milliseconds per phase: the first task (a new worker) and the median of the others."""
    import pyarrow as pa

    from twophase.protocol import RecoveryScope, TransactionContext
    from twophase.sinks.sql import SqlCommitter, SqlSettings, SqlWriter, validateTarget

    table = f"bench_sql_task_{uuid.uuid4().hex[:8]}"
    sinkId = f"bt{uuid.uuid4().hex[:8]}"
    settings = SqlSettings.fromOptions({"url": url, "dbtable": table, "createTable": "true"})
    schema = pa.schema(
        [("id", pa.int64()), ("payload", pa.string()), ("value", pa.float64()),
         ("ts", pa.timestamp("us", tz="UTC"))]
    )  # fmt: skip
    timer = PhaseTimer()
    phases: list[dict[str, float]] = []
    committer = SqlCommitter(settings)
    commitSeconds: list[float] = []
    pending: list[dict[str, Any]] = []

    def commitPending() -> None:  # PostgreSQL's max_prepared_transactions is a budget
        for handle in pending:
            started = time.perf_counter()
            committer.commit(handle)
            commitSeconds.append(time.perf_counter() - started)
        pending.clear()

    validateTarget(settings, schema, sinkId)  # the driver's check, before any task
    writerBytes = pickle.dumps(SqlWriter(settings))  # as Spark ships the writer to each task
    try:
        with driverTimers(timer, settings.markerTable):
            for task in range(tasks):
                ids = range(task * rowsPerTask, (task + 1) * rowsPerTask)
                batch = pa.record_batch(
                    [pa.array(ids, pa.int64()), pa.array([f"row-{i}" for i in ids]),
                     pa.array([i * 1.5 for i in ids]),
                     pa.array([i * 1_000_000 for i in ids], pa.timestamp("us", tz="UTC"))],
                    schema=schema,
                )  # fmt: skip
                timer.seconds.clear()
                started = time.perf_counter()
                writer = pickle.loads(writerBytes)
                txn = writer.beginTransaction(TransactionContext(sinkId, "q", 1, task, 0))
                writer.write(txn, batch)
                pending.append(writer.preCommit(txn))
                total = time.perf_counter() - started
                phase = dict(timer.seconds)
                phase["Python (the rest)"] = total - sum(phase.values())
                phase["task in all"] = total
                phases.append(phase)
                if len(pending) >= 40:
                    with timer.paused():  # the driver's commits count for no task
                        commitPending()
        commitPending()
    finally:
        committer.recoverAndAbort(RecoveryScope(sinkId))
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        with engine.begin() as conn:
            written = conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar()
            conn.exec_driver_sql(f"DROP TABLE {table}")
        engine.dispose()
    if written != tasks * rowsPerTask:
        raise SystemExit(f"per-task run wrote {written} rows, expected {tasks * rowsPerTask}")
    names = sorted({k for p in phases for k in p}, key=lambda k: (k in LAST, LAST.get(k, 0), k))
    rest = phases[1:] or phases
    rows = [
        [name, f"{phases[0].get(name, 0.0) * 1e3:.2f}",
         f"{statistics.median(p.get(name, 0.0) for p in rest) * 1e3:.2f}",
         f"{statistics.mean(p.get(name, 0.0) for p in rest) * 1e3:.2f}"]
        for name in names
    ]  # fmt: skip
    rows.append(["driver: commit per xid", "", f"{statistics.median(commitSeconds) * 1e3:.2f}",
                 f"{statistics.mean(commitSeconds) * 1e3:.2f}"])  # fmt: skip
    header = ["phase (ms per task)", "first task", f"median, tasks 2-{tasks}", "mean"]
    return markdownTable(header, rows)


LAST = {"Python (the rest)": 1, "task in all": 2}
