"""The sql sink's writer and committer against the real MariaDB and PostgreSQL (no Spark).

Each test drives ``beginTransaction`` -> ``write`` -> ``preCommit`` and the committer's
``commit``/``abort``/``recoverAndAbort`` directly, and reads the table back over an ordinary
connection (a reader that only sees committed rows). Tests named after the crash windows of
docs/protocol.md use real processes killed with SIGKILL. Every test has its own table and sink
id, so it never touches another test's prepared transactions.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy as sa

from integration_tests.conftest import (
    ServiceControl,
    callsDuring,
    callsDuringAFreeze,
    failedWithin,
)
from integration_tests.docs_blocks import oneLine, sectionBlocks
from integration_tests.toxiproxy import Toxiproxy, proxiedUrl
from twophase.protocol import (
    Handle,
    RecoveryScope,
    TransactionContext,
    TransactionLostError,
    TransientCommitError,
)
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.relational.naming import sinkPrefix
from twophase.sinks.sql import (
    RowRejectedError,
    SqlCommitter,
    SqlSettings,
    SqlSinkError,
    SqlUnavailableError,
    SqlWriter,
    XidTooLongError,
    publicOptionValue,
    validateTarget,
)
from twophase.sinks.sql.committer import SESSION_END_WAIT_SECONDS, awaitSessionEnd
from twophase.sinks.sql.dialect import preparedXids, prepareTwoPhase
from twophase.sinks.sql.sessions import serverSession

REPO = Path(__file__).resolve().parents[1]


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def sqlalchemyPgUrl(pgUrl: str) -> str:
    return pgUrl.replace("postgresql://", "postgresql+psycopg://", 1)


@pytest.fixture(params=["mariadb", "postgresql"])
def db(request: pytest.FixtureRequest) -> str:
    """The SQLAlchemy URL of each server the sink is tested on."""
    if request.param == "mariadb":
        return str(request.getfixturevalue("mariadb_url"))
    return sqlalchemyPgUrl(str(request.getfixturevalue("pg_url")))


@pytest.fixture
def mariadb(mariadb_url: str) -> str:
    return mariadb_url


class Target:
    """One test's table and sink id on one server, with a plain reader; cleaned up after."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.table = unique("it_sql")
        self.sinkId = unique("s")
        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self.family = "mysql" if url.startswith("mysql") else "postgresql"

    def options(self, **extra: str) -> dict[str, str]:
        return {"url": self.url, "dbtable": self.table, **extra}

    def settings(self, **extra: str) -> SqlSettings:
        return SqlSettings.fromOptions(self.options(**extra))

    def ctx(self, batch: int, partition: int = 0, attempt: int = 0) -> TransactionContext:
        return TransactionContext(self.sinkId, "q", batch, partition, attempt)

    def execute(self, statement: str) -> None:
        with self.engine.begin() as conn:
            conn.exec_driver_sql(statement)

    def rows(self, order: str = "id") -> list[tuple[object, ...]]:
        with self.engine.connect() as conn:
            return [
                tuple(r)
                for r in conn.exec_driver_sql(f"SELECT * FROM {self.table} ORDER BY {order}")
            ]

    def prepared(self) -> list[str]:
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            return preparedXids(conn, self.family, sinkPrefix(self.sinkId))

    def cleanup(self) -> None:
        committer = SqlCommitter(self.settings())
        committer.recoverAndAbort(RecoveryScope(self.sinkId))
        self.execute(f"DROP TABLE IF EXISTS {self.table}")
        self.engine.dispose()


@pytest.fixture
def target(db: str) -> Iterator[Target]:
    t = Target(db)
    yield t
    t.cleanup()


@pytest.fixture
def mtarget(mariadb: str) -> Iterator[Target]:
    t = Target(mariadb)
    yield t
    t.cleanup()


SIMPLE = pa.schema([("id", pa.int64()), ("v", pa.string())])


def simple(ids: range, tag: str = "x") -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array(list(ids), pa.int64()), pa.array([f"{tag}{i}" for i in ids])], schema=SIMPLE
    )


def prepare(t: Target, batch: int, rows: pa.RecordBatch, partition: int = 0, **opts: str) -> dict:
    writer = SqlWriter(t.settings(**opts))
    txn = writer.beginTransaction(t.ctx(batch, partition))
    writer.write(txn, rows)
    return writer.preCommit(txn)


def createSimple(t: Target, **opts: str) -> None:
    validateTarget(t.settings(createTable="true", **opts), SIMPLE, t.sinkId)


# -- the property the design relies on ---------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    import pyarrow as pa
    import sqlalchemy as sa
    from twophase.protocol import TransactionContext
    from twophase.sinks.sql import SqlSettings, SqlWriter
    url, table, sinkId, mode = sys.argv[1:5]
    if mode == "raw":  # prepare and keep the session open until killed
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        conn = engine.connect()
        xid = "tp1:" + sinkId + ":b1:p0:a0:0000abcd"
        txn = conn.begin_twophase(xid)
        conn.exec_driver_sql("INSERT INTO " + table + " VALUES (%s, %s)", [(1, "a"), (2, "b")])
        txn.prepare()
        print(json.dumps({"xid": xid}), flush=True)
        sys.stdin.read()
    else:  # the sink's writer, then SIGKILL of itself right after preCommit
        writer = SqlWriter(SqlSettings.fromOptions({"url": url, "dbtable": table}))
        txn = writer.beginTransaction(TransactionContext(sinkId, "q", 2, 0, 0))
        writer.write(txn, pa.record_batch([pa.array([3, 4], pa.int64()), pa.array(["c", "d"])],
                                          names=["id", "v"]))
        print(json.dumps(writer.preCommit(txn)), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


def runChild(t: Target, mode: str) -> tuple[subprocess.Popen[str], dict]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, t.url, t.table, t.sinkId, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line, "the child process printed no handle"
    return child, json.loads(line)


def test_xa_prepared_by_a_sigkilled_process_stays_prepared_and_another_connection_commits_it(
    mtarget: Target,
) -> None:
    t = mtarget
    createSimple(t)
    child, raw = runChild(t, "raw")
    assert raw["xid"] in t.prepared()  # listed by XA RECOVER while its session still lives
    os.kill(child.pid, signal.SIGKILL)
    child.wait(10)
    assert raw["xid"] in t.prepared()  # ... and after its process was SIGKILLed
    assert t.rows() == []
    committer = SqlCommitter(t.settings())
    # A raw xid has no marker, so commit it through the dialect the way the committer does.
    with t.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        t.engine.dialect.do_commit_twophase(conn, raw["xid"], is_prepared=True, recover=True)
    assert t.rows() == [(1, "a"), (2, "b")]

    child2, handle = runChild(t, "writer")
    child2.wait(10)
    assert child2.returncode == -signal.SIGKILL
    assert handle["xid"] in t.prepared()
    committer.commit(handle)
    committer.commit(handle)  # again: no longer prepared, marker found: a no-op
    assert t.rows() == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    assert t.prepared() == []


def test_commit_waits_for_a_prepared_xid_still_attached_to_its_session(mtarget: Target) -> None:
    """MariaDB answers XAER_NOTA while the preparing session lives: not a loss, a wait."""
    t = mtarget
    createSimple(t)
    settings = t.settings()
    writer = SqlWriter(settings)
    txn = writer.beginTransaction(t.ctx(1))
    writer.write(txn, simple(range(3)))
    assert txn.conn is not None and txn.begun
    from twophase.sinks.sql.dialect import markerTable

    txn.conn.execute(
        markerTable(settings.markerTable)
        .insert()
        .values(xid=txn.xid, sink_id=t.sinkId, batch_id=1, partition_id=0, row_count=3)
    )
    prepareTwoPhase(txn.conn, "mysql", txn.xid)  # the session lives on, the xid attached
    handle = {
        "kind": "sql",
        "xid": txn.xid,
        "batchId": 1,
        "partitionId": 0,
        "attempt": 0,
        "rows": 3,
        "table": t.table,
        "url": settings.publicUrl,
    }
    timer = threading.Timer(1.0, lambda: (txn.conn.invalidate(), txn.conn.close()))  # type: ignore[union-attr]
    timer.start()
    SqlCommitter(settings).commit(handle)
    timer.join()
    assert [r[0] for r in t.rows()] == [0, 1, 2]


# -- crash windows (docs/protocol.md), participant level ----------------------------------------


def test_crash_after_a_task_began_before_precommit_leaves_nothing(target: Target) -> None:
    t = target
    createSimple(t)
    writer = SqlWriter(t.settings())
    txn = writer.beginTransaction(t.ctx(1))
    writer.write(txn, simple(range(5)))
    # The task dies: its connection drops without a prepare.
    assert txn.conn is not None
    txn.conn.invalidate()
    assert t.prepared() == []
    assert SqlCommitter(t.settings()).recoverAndAbort(RecoveryScope(t.sinkId)) == []
    assert t.rows() == []


def test_recovery_names_what_it_aborted_and_a_later_commit_of_it_is_a_loss(target: Target) -> None:
    """What the contract suite leaves out (it runs on both servers too): the handles recovery
    returns, and a commit of an aborted xid raising instead of passing for done."""
    t = target
    createSimple(t)
    h0 = prepare(t, 1, simple(range(3)), 0)
    h1 = prepare(t, 1, simple(range(3, 6)), 1)
    aborted = SqlCommitter(t.settings()).recoverAndAbort(RecoveryScope(t.sinkId))
    assert sorted(h["xid"] for h in aborted) == sorted([h0["xid"], h1["xid"]])
    assert {h["partitionId"] for h in aborted} == {0, 1}
    with pytest.raises(TransactionLostError, match="neither prepared"):
        SqlCommitter(t.settings()).commit(h0)


def test_recovery_touches_only_this_sinks_prefix(target: Target) -> None:
    t = target
    createSimple(t)
    other = Target(t.url)
    other.table = t.table
    mine = prepare(t, 1, simple(range(2)))
    theirs = prepare(other, 1, simple(range(2, 4)))
    try:
        aborted = SqlCommitter(t.settings()).recoverAndAbort(RecoveryScope(t.sinkId))
        assert [h["xid"] for h in aborted] == [mine["xid"]]
        assert other.prepared() == [theirs["xid"]]
    finally:
        SqlCommitter(other.settings()).abort(theirs)
        other.engine.dispose()


def test_an_empty_task_opens_nothing_and_its_commit_is_a_no_op(target: Target) -> None:
    t = target
    createSimple(t)
    committer = SqlCommitter(t.settings())
    writer = SqlWriter(t.settings())
    txn = writer.beginTransaction(t.ctx(2))
    writer.write(txn, simple(range(0)))
    empty = writer.preCommit(txn)
    assert empty["xid"] is None and empty["rows"] == 0 and txn.conn is None
    committer.commit(empty)
    assert t.prepared() == [] and t.rows() == []


def test_markers_are_pruned_to_the_last_two_batches(target: Target) -> None:
    t = target
    createSimple(t)
    committer = SqlCommitter(t.settings())
    handles = [prepare(t, b, simple(range(b * 10, b * 10 + 1))) for b in range(1, 5)]
    for h in handles:
        committer.commit(h)
    committer.recoverAndAbort(RecoveryScope(t.sinkId, batchId=4))
    with t.engine.connect() as conn:
        kept = (
            conn.exec_driver_sql(
                "SELECT batch_id FROM twophase_sql_commits WHERE sink_id = %s ORDER BY batch_id",
                (t.sinkId,),
            )
            .scalars()
            .all()
        )
    assert kept == [3, 4]
    committer.commit(handles[-1])  # still a no-op: its marker is kept


# -- bulk, modes and types -----------------------------------------------------------------------


def test_bulk_insert_in_batchsize_chunks_invisible_until_commit(target: Target) -> None:
    t = target
    createSimple(t)
    h = prepare(t, 1, simple(range(2500)), batchsize="1000")
    assert h["rows"] == 2500 and t.rows() == []
    password = sa.make_url(t.url).password
    assert password and f":{password}@" not in json.dumps(h)  # the handle has no password
    SqlCommitter(t.settings()).commit(h)
    assert len(t.rows()) == 2500
    # 3,000 rows of 2 kB in one batchsize: more than one statement's byte limit (4 MiB).
    wide = pa.record_batch(
        [pa.array(range(10_000, 13_000), pa.int64()), pa.array(["w" * 2000] * 3000)],
        schema=SIMPLE,
    )
    SqlCommitter(t.settings()).commit(prepare(t, 2, wide, batchsize="3000"))
    assert len(t.rows()) == 2500 + 3000


def test_upsert_updates_existing_keys(target: Target) -> None:
    t = target
    createSimple(t, mode="upsert", keyColumns="id")
    committer = SqlCommitter(t.settings(mode="upsert", keyColumns="id"))
    committer.commit(prepare(t, 1, simple(range(3), "a"), mode="upsert", keyColumns="id"))
    committer.commit(prepare(t, 2, simple(range(1, 5), "b"), mode="upsert", keyColumns="id"))
    assert t.rows() == [(0, "a0"), (1, "b1"), (2, "b2"), (3, "b3"), (4, "b4")]


TYPES = pa.schema(
    [
        ("id", pa.int32()),
        ("small", pa.int16()),
        ("big", pa.int64()),
        ("flag", pa.bool_()),
        ("ratio", pa.float64()),
        ("amount", pa.decimal128(20, 6)),
        ("at", pa.timestamp("us", tz="UTC")),
        ("day", pa.date32()),
        ("text", pa.string()),
        ("blob", pa.binary()),
    ]
)


@pytest.mark.parametrize("binary", [True, False], ids=["with-binary", "as-sql-text"])
def test_types_round_trip_with_nulls(target: Target, binary: bool) -> None:
    """Without a binary column, MariaDB's rows go as SQL text built by Arrow (the bulk path);
    with one, through the driver's ``executemany``: both must give the same values."""
    t = target
    schema = TYPES if binary else TYPES.remove(TYPES.get_field_index("blob"))
    validateTarget(t.settings(createTable="true"), schema, t.sinkId)
    utc = dt.UTC
    values = [
        [1, 2, 3],
        [-32768, 0, None],
        [2**63 - 1, -(2**63), None],
        [True, False, None],
        [1.5, -0.25, None],
        [decimal.Decimal("12345678901234.123456"), decimal.Decimal("-0.000001"), None],
        [
            dt.datetime(2024, 2, 29, 23, 59, 59, 123456, utc),
            dt.datetime(1970, 1, 1, tzinfo=utc),
            None,
        ],
        [dt.date(2024, 2, 29), dt.date(1, 1, 1), None],
        ["héllo 'quoted' \\' \\\\ %s %% \\0 \n😀", "", None],
        [b"\x00\x01\xff'", b"", None],
    ]
    values = values if binary else values[:-1]
    batch = pa.record_batch(
        [pa.array(v, f.type) for v, f in zip(values, schema, strict=True)], schema=schema
    )
    SqlCommitter(t.settings()).commit(prepare(t, 1, batch))
    got = t.rows()
    expected = list(zip(*values, strict=True))
    for row, want in zip(got, expected, strict=True):
        for value, wanted in zip(row, want, strict=True):
            if isinstance(wanted, dt.datetime) and isinstance(value, dt.datetime):
                # MariaDB DATETIME has no zone: the sink stores UTC.
                value = value if value.tzinfo else value.replace(tzinfo=utc)
            if isinstance(wanted, bool) and value is not None:
                value = bool(value)
            if isinstance(wanted, bytes) and value is not None:
                value = bytes(value)
            assert value == wanted, (row, want)


# -- clear, early errors -------------------------------------------------------------------------


def test_a_rejected_row_names_the_batch_and_nothing_is_prepared_or_visible(
    target: Target,
) -> None:
    t = target
    createSimple(t, mode="upsert", keyColumns="id")  # id the primary key
    writer = SqlWriter(t.settings())  # append mode
    txn = writer.beginTransaction(t.ctx(7, 3))
    with pytest.raises(RowRejectedError, match="batch 7, partition 3.*rejected (a )?row") as info:
        writer.write(txn, simple(range(3)))
        writer.write(txn, simple(range(2, 4)))  # id 2 again
    assert "restart the query" in str(info.value) and "deduplicate the key" in str(info.value)
    # MariaDB's row is found by sending the statement again in halves; PostgreSQL aborts
    # the transaction at the error, so the message names the statement's rows.
    place = "row 3 of partition 3" if t.family == "mysql" else "one of its rows 3 to 4"
    assert place in str(info.value)
    writer.abortTransaction(txn)
    assert t.prepared() == [] and t.rows() == []


@pytest.mark.parametrize("path", ["text", "executemany"])
def test_bad_records_go_to_the_dead_letter_table_in_the_task_s_transaction(
    target: Target, path: str, request: pytest.FixtureRequest
) -> None:
    """With badRecords=<table>, the rows the database refuses (a value too long, a duplicate
    key: one in each of two statements of batchsize 4) go to the dead-letter table with their
    position, column, reason and JSON, in the task's own transaction: invisible while it is
    prepared, committed once with it, never when it is aborted. ``executemany`` (a binary
    column) goes through the driver instead of MariaDB's SQL text."""
    t = target
    binary = ", b VARBINARY(8)" if t.family == "mysql" else ", b BYTEA"
    t.execute(f"CREATE TABLE {t.table} (id BIGINT PRIMARY KEY, v VARCHAR(5){binary})")
    dead = unique("rejected")
    request.addfinalizer(lambda: t.execute(f"DROP TABLE IF EXISTS {dead}"))
    opts = {"badRecords": dead, "batchsize": "4"}
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("b", pa.binary())])
    validateTarget(t.settings(**opts), schema if path == "executemany" else SIMPLE, t.sinkId)

    def batch(ids: list[int], values: list[str]) -> pa.RecordBatch:
        columns = [pa.array(ids, pa.int64()), pa.array(values)]
        if path == "executemany":
            return pa.record_batch([*columns, pa.array([b"\x01"] * len(ids))], schema=schema)
        return pa.record_batch(columns, schema=SIMPLE)

    writer = SqlWriter(t.settings(**opts))
    txn = writer.beginTransaction(t.ctx(5, 2))
    writer.write(txn, batch([0, 1, 2, 3, 4], ["a", "b", "c", "much too long", "e"]))
    writer.write(txn, batch([5, 6, 1, 7], ["f", "g", "h", "i"]))  # id 1 again: row 7
    handle = writer.preCommit(txn)

    def deadRows() -> list[tuple[object, ...]]:
        with t.engine.connect() as conn:
            return [
                tuple(r)
                for r in conn.exec_driver_sql(
                    f"SELECT row_position, sink_id, batch_id, partition_id, error_column, error, "
                    f"record FROM {dead} ORDER BY row_position"
                )
            ]

    assert t.rows() == [] and deadRows() == []  # prepared: nothing visible yet
    committer = SqlCommitter(t.settings(**opts))
    committer.commit(handle)
    committer.commit(handle)  # a retry: a no-op
    assert [r[0] for r in t.rows()] == [0, 1, 2, 4, 5, 6, 7]
    rows = deadRows()
    assert [r[:4] for r in rows] == [(3, t.sinkId, 5, 2), (7, t.sinkId, 5, 2)]
    # MariaDB names the column of a value too long; PostgreSQL's error does not.
    assert rows[0][4] == ("v" if t.family == "mysql" else None)
    assert "row 3 of partition 2" in str(rows[0][5]) and "too long" in str(rows[0][5])
    assert "row 7 of partition 2" in str(rows[1][5])
    assert json.loads(str(rows[0][6]))["v"] == "much too long"
    assert json.loads(str(rows[1][6]))["id"] == 1
    if path == "executemany":
        assert json.loads(str(rows[1][6]))["b"] == "01"
    # An aborted task's rejected rows are never seen either.
    writer2 = SqlWriter(t.settings(**opts))
    txn2 = writer2.beginTransaction(t.ctx(6, 0))
    writer2.write(txn2, batch([8, 9], ["j", "far too long"]))
    writer2.preCommit(txn2)
    writer2.abortTransaction(txn2)
    assert len(deadRows()) == 2 and t.prepared() == []


SECRET = "private-value-do-not-show"

# What each kind of bad row meets on MariaDB (strict mode): column v's definition, the bad
# row's v (row 1 of the task's second record batch, so the task's row 3) and id, rows in the
# table before, and what the error must say besides the row's position.
MARIADB_REJECTIONS: dict[str, tuple[str, str | None, int, str | None, list[str]]] = {
    "too-long": (
        "v VARCHAR(10)",
        SECRET,
        3,
        None,
        [
            "column v: Data too long for column 'v' (error 1406",
            f"the value has {len(SECRET)} characters; the column is varchar(10)",
            "widen v",
            "truncate the value upstream",
        ],
    ),
    "not-null": (
        "v VARCHAR(50) NOT NULL",
        None,
        3,
        None,
        ["column v: Column 'v' cannot be null (error 1048)", "df.na.drop(subset=['v'])"],
    ),
    "check": (
        "v VARCHAR(50), CONSTRAINT short_v CHECK (CHAR_LENGTH(v) < 10)",
        SECRET,
        3,
        None,
        ["constraint short_v", "filter the rows that break constraint short_v"],
    ),
    "duplicate-in-batch": (
        "v VARCHAR(50)",
        "dup",
        11,
        None,
        ["Duplicate entry for key 'PRIMARY' (error 1062", "deduplicate the key"],
    ),
    "duplicate-of-a-row": (
        "v VARCHAR(50)",
        "dup",
        424242,
        "INSERT INTO {table} (id, v) VALUES (424242, 'there before')",
        ["Duplicate entry for key 'PRIMARY' (error 1062", "deduplicate the key"],
    ),
}


@pytest.mark.parametrize("path", ["one-insert", "batchsize-2", "executemany"])
@pytest.mark.parametrize("case", list(MARIADB_REJECTIONS))
def test_a_row_mariadb_rejects_is_named_by_position_column_and_fix_and_nothing_is_visible(
    mtarget: Target, case: str, path: str
) -> None:
    """The row's position in the task, whether the server says it (``at row N`` of the
    statement) or not; ``batchsize-2`` puts it in a later statement, ``executemany`` (a binary
    column) goes through the driver instead of SQL text. The value never shows."""
    t = mtarget
    column, value, badId, before, expected = MARIADB_REJECTIONS[case]
    binary = ", b VARBINARY(10)" if path == "executemany" else ""
    t.execute(f"CREATE TABLE {t.table} (id BIGINT PRIMARY KEY, {column}{binary}) ENGINE=InnoDB")
    if before:
        t.execute(before.format(table=t.table))
    existing = t.rows()
    options = {"batchsize": "2"} if path == "batchsize-2" else {}
    writer = SqlWriter(t.settings(**options))

    def rows(ids: list[int], vs: list[str | None]) -> pa.RecordBatch:
        columns = {"id": pa.array(ids, pa.int64()), "v": pa.array(vs, pa.string())}
        if binary:
            columns["b"] = pa.array([b"\x00x"] * len(ids), pa.binary())
        return pa.record_batch(columns)

    txn = writer.beginTransaction(t.ctx(5, 2))
    with pytest.raises(RowRejectedError) as info:
        writer.write(txn, rows([10, 11], ["a", "b"]))
        writer.write(txn, rows([12, badId, 14], ["c", value, "e"]))
        writer.preCommit(txn)
    writer.abortTransaction(txn)
    message = str(info.value)
    assert "batch 5, partition 2" in message and t.table in message
    assert "row 3 of partition 2 (counting from 0)" in message, message
    for fragment in expected:
        assert fragment in message, (fragment, message)
    assert "restart the query: the batch is written again" in message
    assert SECRET not in message and "424242" not in message
    assert SECRET not in str(info.value.__cause__) and "424242" not in str(info.value.__cause__)
    assert t.prepared() == [] and t.rows() == existing

    committer = SqlCommitter(t.settings())
    committer.commit(prepare(t, 6, rows([20, 21], ["f", "g"]), partition=2, **options))
    assert len(t.rows()) == len(existing) + 2


RACE_ROUNDS = 100
"""Prepared transactions raced against their session's end: with ``SESSION_VARIABLES`` to free
(which MariaDB does after it hands the xid to XA, before it detaches the InnoDB transaction),
a raw ``XA COMMIT`` loses one within the first few rounds; without them, about one in thirty
on two busy cores, none in 400 on an idle machine."""

SESSION_VARIABLES = 20000
"""User variables the preparing session sets, so that its end takes long enough to race."""


def preparedWithALongEnd(writer: SqlWriter, t: Target, batch: int) -> Handle:
    """Prepare two rows as a task does, from a session whose end frees many user variables;
    ``preCommit`` ends the session: the race starts as it returns."""
    txn = writer.beginTransaction(t.ctx(batch))
    writer.write(txn, simple(range(batch * 10, batch * 10 + 2)))
    assert txn.conn is not None
    txn.conn.exec_driver_sql("SET " + ",".join(f"@v{i} = 1" for i in range(SESSION_VARIABLES)))
    return writer.preCommit(txn)


def raceCommit(conn: sa.Connection, xid: str) -> None:
    """``XA COMMIT`` on ``conn`` (another, open connection) as often as the server refuses it
    (``XAER_NOTA``: still attached), right from the preparing session's end, until it answers
    OK."""
    while True:
        try:
            conn.exec_driver_sql("XA COMMIT %s", (xid,))
            return
        except sa.exc.OperationalError as exc:
            if exc.orig.args[0] != 1397:
                raise


def race(t: Target) -> tuple[int, Handle] | None:
    """``RACE_ROUNDS`` transactions prepared, each committed from another connection as soon
    as the server takes it: the first round that lost its rows and its handle, or ``None``."""
    createSimple(t)
    writer = SqlWriter(t.settings())
    with t.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as racer:
        for batch in range(RACE_ROUNDS):
            handle = preparedWithALongEnd(writer, t, batch)
            raceCommit(racer, handle["xid"])
            if len(t.rows()) < 2 * (batch + 1):
                return batch, handle
    return None


def test_an_xa_commit_mariadb_answers_without_doing_it_is_never_taken_for_done(
    mtarget: Target, mariadb_server: ServiceControl
) -> None:
    """MariaDB 10.11 answers OK to an ``XA COMMIT`` that meets the xid while the session that
    prepared it is ending, yet keeps the InnoDB transaction prepared and takes the xid out of
    ``XA RECOVER``: no row visible, the locks held. The committer never says such a batch is
    committed, nor lost: the commit is transient (the marker row is held) until a restart of
    the server gives the xid back, and then it commits every row."""
    t = mtarget
    committer = SqlCommitter(t.settings())
    lost = race(t)
    if lost is None:
        pytest.fail(f"the server committed every one of {RACE_ROUNDS} raced transactions")
    batch, handle = lost
    assert handle["xid"] not in t.prepared()
    with pytest.raises(TransientCommitError, match="Restart the server"):
        committer.commit(handle)
    mariadb_server.restart()
    assert handle["xid"] in t.prepared(), "a restart gives the xid back to XA RECOVER"
    committer.commit(handle)
    assert len(t.rows()) == 2 * (batch + 1)


def test_a_commit_waits_while_the_preparing_session_is_listed_then_commits(
    mtarget: Target,
) -> None:
    """The committer's wait before ``XA COMMIT`` (``awaitSessionEnd`` on the session id the
    handle records): it holds while that session is in the process list, returns within its
    grace once the session is gone, gives up after ``SESSION_END_WAIT_SECONDS`` on an id that
    stays (a new session of the same id after a restart), and the commit then finds the rows."""
    t = mtarget
    createSimple(t)
    writer = SqlWriter(t.settings())
    txn = writer.beginTransaction(t.ctx(0))
    writer.write(txn, simple(range(2)))
    assert txn.conn is not None
    session = serverSession(txn.conn)
    assert isinstance(session, int)
    ended: list[float] = []

    def wait() -> None:
        with t.engine.connect() as conn:
            awaitSessionEnd(conn, session)
            ended.append(time.monotonic())

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive(), "the wait returned while the preparing session was listed"
    closing = time.monotonic()
    handle = writer.preCommit(txn)  # ends the session
    assert handle["session"] == session
    waiter.join(SESSION_END_WAIT_SECONDS)
    assert not waiter.is_alive() and closing < ended[0] < closing + 1, (closing, ended)
    assert SqlCommitter(t.settings()).commit(handle) is None
    assert len(t.rows()) == 2 and not t.prepared()

    with t.engine.connect() as conn, t.engine.connect() as listed:
        started = time.monotonic()
        awaitSessionEnd(conn, serverSession(listed))
        assert time.monotonic() - started >= SESSION_END_WAIT_SECONDS


def test_the_documented_rejection_is_what_the_sink_says(mtarget: Target) -> None:
    """docs/sql.md, "A record the target rejects": the example is real output (the document's
    table ``events`` and sink ``events``, its server's address)."""
    t = mtarget
    t.execute(f"CREATE TABLE {t.table} (id BIGINT PRIMARY KEY, note VARCHAR(10)) ENGINE=InnoDB")
    writer = SqlWriter(t.settings())
    txn = writer.beginTransaction(t.ctx(7, 2))
    notes = pa.record_batch(
        {"id": pa.array([1, 2, 3, 4], pa.int64()), "note": ["ok", "ok", "ok", "a note too long"]}
    )
    with pytest.raises(RowRejectedError) as info:
        writer.write(txn, notes)
    writer.abortTransaction(txn)

    def documented(text: str) -> str:
        return re.sub(r" at mysql [\w.-]+:\d+/[^:\s]+:", " at mysql <server>:", oneLine(text))

    actual = str(info.value).replace(t.sinkId, "events").replace(t.table, "events")
    assert [documented(actual)] == [
        documented(b) for b in sectionBlocks("sql.md", "A record the target rejects")
    ]


def test_missing_table_without_create_table_says_how_to_fix(target: Target) -> None:
    with pytest.raises(SqlSinkError, match="createTable=true"):
        validateTarget(target.settings(), SIMPLE, target.sinkId)


def test_missing_columns_are_named(target: Target) -> None:
    t = target
    t.execute(f"CREATE TABLE {t.table} (id BIGINT)")
    with pytest.raises(SqlSinkError, match=r"no column\(s\) \['v'\]"):
        validateTarget(t.settings(), SIMPLE, t.sinkId)


def test_a_table_on_an_engine_without_xa_is_refused_with_alter_table(mtarget: Target) -> None:
    t = mtarget
    t.execute(f"CREATE TABLE {t.table} (id BIGINT, v TEXT) ENGINE=Aria")
    with pytest.raises(SqlSinkError, match="ENGINE=InnoDB"):
        validateTarget(t.settings(), SIMPLE, t.sinkId)
    t.execute(f"ALTER TABLE {t.table} ENGINE=MyISAM")
    with pytest.raises(SqlSinkError, match="MyISAM.*ALTER TABLE"):
        validateTarget(t.settings(), SIMPLE, t.sinkId)


def test_an_xid_too_long_for_xa_is_refused_before_writing(mtarget: Target) -> None:
    t = mtarget
    longId = "s" * 40
    with pytest.raises(XidTooLongError, match="64"):
        validateTarget(t.settings(createTable="true"), SIMPLE, longId)
    writer = SqlWriter(t.settings())
    with pytest.raises(XidTooLongError, match="sinkId"):
        writer.beginTransaction(TransactionContext(longId, "q", 10**12, 5, 0))


def test_bad_url_and_options_name_the_fix() -> None:
    with pytest.raises(TwoPhaseConfigError, match="SQLAlchemy URL"):
        SqlSettings.fromOptions({"url": "not a url", "dbtable": "t"})
    with pytest.raises(TwoPhaseConfigError, match="not supported"):
        SqlSettings.fromOptions({"url": "sqlite:///x.db", "dbtable": "t"})
    with pytest.raises(TwoPhaseConfigError, match="dbtable"):
        SqlSettings.fromOptions({"url": "mysql+pymysql://u@h/db"})
    with pytest.raises(TwoPhaseConfigError, match="keyColumns"):
        SqlSettings.fromOptions({"url": "mysql+pymysql://u@h/db", "dbtable": "t", "mode": "upsert"})
    assert publicOptionValue("url", "mysql+pymysql://u:s3cret@h:1/db") == "mysql+pymysql://u@h:1/db"


def test_server_down_is_retryable_on_both_sides() -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    url = f"mysql+pymysql://u:p@127.0.0.1:{port}/db"
    options = {"url": url, "dbtable": "t", "connectTimeout": "2", "connectRetrySeconds": "1"}
    settings = SqlSettings.fromOptions(options)
    started = time.monotonic()
    with pytest.raises(SqlUnavailableError, match="cannot connect"):
        validateTarget(settings, SIMPLE, "s1")
    assert time.monotonic() - started >= 0.9  # retried for connectRetrySeconds
    handle = {
        "kind": "sql",
        "xid": "tp1:s1:b1:p0:a0:0000abcd",
        "url": settings.publicUrl,
        "batchId": 1,
        "partitionId": 0,
        "attempt": 0,
        "rows": 1,
        "table": "t",
    }
    with pytest.raises(TransientCommitError):
        SqlCommitter(settings).commit(handle)


def test_prepared_xa_survives_a_server_kill_and_commits_after_restart(
    mtarget: Target, mariadb_server: ServiceControl
) -> None:
    t = mtarget
    createSimple(t)
    h = prepare(t, 1, simple(range(3)))
    mariadb_server.kill()
    with pytest.raises(TransientCommitError):
        SqlCommitter(t.settings(connectTimeout="2")).commit(h)
    # A task that starts while the server is down waits for it (connectRetrySeconds).
    restart = threading.Timer(1.0, mariadb_server.start)
    restart.start()
    h2 = prepare(t, 2, simple(range(3, 5)))
    restart.join()
    t.engine.dispose()
    assert h["xid"] in t.prepared()
    committer = SqlCommitter(t.settings())
    committer.commit(h)
    committer.commit(h2)
    assert [r[0] for r in t.rows()] == [0, 1, 2, 3, 4]


def test_a_frozen_server_fails_the_task_and_the_commit_in_bounded_time_then_commits_once(
    target: Target, request: pytest.FixtureRequest
) -> None:
    """A frozen server (every process stopped: connections open, nothing answered, as a paused
    VM leaves them) must not hold a task's INSERT or the driver's commit forever: each fails
    within socketTimeout (the commit within socketTimeout + connectTimeout: its pooled session
    is pinged, then a new one tried), retryably, naming the option. MariaDB through PyMySQL's
    read timeout; PostgreSQL, whose libpq has none and whose kernel keeps acknowledging TCP,
    through the sink's own bound. The INSERT the server received before it froze is rolled
    back when it resumes; the decided batch then commits."""
    t = target
    server: ServiceControl = request.getfixturevalue(
        "mariadb_server" if t.family == "mysql" else "postgres_server"
    )
    createSimple(t)
    opts = {"socketTimeout": "2", "connectTimeout": "2", "connectRetrySeconds": "0"}
    h0 = prepare(t, 0, simple(range(0, 2)), 0, **opts)
    h1 = prepare(t, 1, simple(range(2, 4)), 0, **opts)
    committer = SqlCommitter(t.settings(**opts))
    committer.commit(h0)  # the committer's pool now holds a session
    writer = SqlWriter(t.settings(**opts))
    txn = writer.beginTransaction(t.ctx(2))
    writer.write(txn, simple(range(4, 6)))  # the task's session is open, its XA active
    outcomes = callsDuringAFreeze(
        server,
        {
            "write": lambda: writer.write(txn, simple(range(6, 8))),
            "commit": lambda: committer.commit(h1),
        },
    )
    writeError = failedWithin(outcomes, "write", SqlUnavailableError, 6)
    assert "no answer within socketTimeout=2 s" in str(writeError)
    assert "batch 2, partition 0" in str(writeError) and "raise the option" in str(writeError)
    failedWithin(outcomes, "commit", TransientCommitError, 10)
    writer.abortTransaction(txn)
    committer.commit(h1)  # after the server resumed: once
    committer.commit(h1)  # and again (a retry after a lost reply): a no-op
    assert [r[0] for r in t.rows()] == [0, 1, 2, 3]
    assert t.prepared() == []


def test_a_lost_reply_to_xa_commit_fails_in_bounded_time_and_the_retry_finds_it_done(
    mtarget: Target, proxies: Toxiproxy
) -> None:
    """The network loses MariaDB's answer to ``XA COMMIT`` (the request arrived and committed):
    the driver's commit fails within socketTimeout, retryably, and the coordinator's retry
    finds the xid no longer prepared and its marker committed, and succeeds without writing
    anything twice. The answers are lost from the moment ``XA COMMIT`` is sent: the pooled
    session's ping before it must get through, or the statement is never sent at all (the
    frozen-server test covers that)."""
    t = mtarget
    createSimple(t)
    proxy = proxies.proxy("mariadb")
    opts = {
        "url": proxiedUrl(t.url, proxy),
        "socketTimeout": "2",
        "connectTimeout": "2",
        "connectRetrySeconds": "0",
    }
    committer = SqlCommitter(t.settings(**opts))
    committer.commit(prepare(t, 0, simple(range(0, 2)), 0, **opts))
    decided = prepare(t, 1, simple(range(2, 4)), 0, **opts)
    sent: list[str] = []

    def loseRepliesFromXaCommit(conn: object, cursor: object, statement: str, *_: object) -> None:
        if statement.startswith("XA COMMIT"):
            sent.append(statement)
            proxy.loseReplies()

    def arm() -> None:
        sa.event.listen(sa.Engine, "before_cursor_execute", loseRepliesFromXaCommit)

    def heal() -> None:
        sa.event.remove(sa.Engine, "before_cursor_execute", loseRepliesFromXaCommit)
        proxy.heal()

    outcomes = callsDuring(arm, heal, {"commit": lambda: committer.commit(decided)})
    commitError = failedWithin(outcomes, "commit", TransientCommitError, 6)
    assert "socketTimeout=2" in str(commitError)
    assert len(sent) == 1, sent
    # Read directly, not through the proxy: the request did reach the server.
    assert [r[0] for r in t.rows()] == [0, 1, 2, 3]
    assert t.prepared() == []
    committer.commit(decided)  # the coordinator's retry
    assert [r[0] for r in t.rows()] == [0, 1, 2, 3]
