"""The postgres sink's writer and committer against the real PostgreSQL of `make services`.

No Spark: each test drives the writer's ``beginTransaction`` -> ``write`` -> ``preCommit`` and
the committer's ``commit``/``abort``/``recoverAndAbort`` directly, like the files sink's tests,
and reads the table back over an ordinary connection (a reader that only sees committed rows).
Every test uses its own table and sink id, so it never touches another test's (or another
engineer's) prepared transactions.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from integration_tests.conftest import (
    ServiceControl,
    callsDuring,
    callsDuringAFreeze,
    failedWithin,
)
from integration_tests.docs_blocks import oneLine, sectionBlocks
from integration_tests.toxiproxy import Toxiproxy, proxiedUrl
from twophase.protocol import (
    RecoveryScope,
    TransactionContext,
    TransactionLostError,
    TransientCommitError,
)
from twophase.redaction import publicOptions
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.postgres import (
    SAFE_OPTIONS,
    PostgresCommitter,
    PostgresSettings,
    PostgresSinkError,
    PostgresUnavailableError,
    PostgresWriter,
    PreparedLimitError,
    RowRejectedError,
    publicOptionValue,
    validateTarget,
)
from twophase.sinks.postgres.sessions import TASK_SESSIONS
from twophase.sinks.relational.naming import sinkPrefix

# -- helpers ----------------------------------------------------------------------------------


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def table(pg_url: str) -> Iterator[str]:
    """A fresh table name (created by the test); dropped afterwards with its sink's leftovers."""
    name = unique("it_pg")
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for (gid,) in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%{name}%",)
        ).fetchall():
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        conn.execute("SET lock_timeout = '10s'")
        for dropped in (name, *stagingTables(name)):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(dropped)))


def stagingTables(table: str) -> tuple[str, str]:
    """The staging and marker tables the sink creates next to ``table`` (documented names)."""
    return f"{table}_twophase_staging", f"{table}_twophase_commits"


def sinkIdOf(table: str) -> str:
    return table.replace("_", "-")


class Sink(NamedTuple):
    """The sink's two halves, built from the same options, as the Spark binding builds them."""

    writer: PostgresWriter
    committer: PostgresCommitter


def settingsOf(pg_url: str, table: str, **options: str) -> PostgresSettings:
    return PostgresSettings.fromOptions({"url": pg_url, "table": table, **options})


def sink(pg_url: str, table: str, **options: str) -> Sink:
    settings = settingsOf(pg_url, table, **options)
    return Sink(PostgresWriter(settings), PostgresCommitter(settings))


def context(table: str, batch: int = 0, part: int = 0, attempt: int = 0) -> TransactionContext:
    return TransactionContext(sinkIdOf(table), "q", batch, part, attempt, "run1")


def execute(pg_url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        cur = conn.execute(statement, params or None)
        return cur.fetchall() if cur.description else []


def prepared(pg_url: str, table: str) -> list[str]:
    rows = execute(
        pg_url,
        "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)",
        sinkPrefix(sinkIdOf(table)),
    )
    return sorted(r[0] for r in rows)


def idsBatch(ids: list[int], payload: str = "row-") -> pa.RecordBatch:
    return pa.record_batch(
        {"id": pa.array(ids, pa.int64()), "payload": pa.array([f"{payload}{i}" for i in ids])}
    )


def writeAndPrepare(
    w: PostgresWriter, ctx: TransactionContext, *batches: pa.RecordBatch
) -> dict[str, Any]:
    txn = w.beginTransaction(ctx)
    try:
        for batch in batches:
            w.write(txn, batch)
        return w.preCommit(txn)
    except BaseException:
        w.abortTransaction(txn)
        raise


def createIdTable(pg_url: str, table: str) -> None:
    execute(pg_url, f"CREATE TABLE {table} (id bigint PRIMARY KEY, payload text NOT NULL)")


# -- the happy path and every type -------------------------------------------------------------

TYPED = pa.record_batch(
    {
        "id": pa.array([1, 2, 3, 4], pa.int64()),
        "tiny": pa.array([-128, 127, None, 0], pa.int8()),
        "small": pa.array([-32768, 32767, None, 0], pa.int16()),
        "int": pa.array([-(2**31), 2**31 - 1, None, 0], pa.int32()),
        "big": pa.array([-(2**63), 2**63 - 1, None, 0], pa.int64()),
        "f4": pa.array([0.1, float("inf"), None, float("nan")], pa.float32()),
        "f8": pa.array([float("nan"), float("-inf"), None, 1e-300], pa.float64()),
        "dec": pa.array(
            [decimal.Decimal("-12345678.90"), decimal.Decimal("0.01"), None, decimal.Decimal(0)],
            pa.decimal128(10, 2),
        ),
        "text": pa.array(['a,"b"\nc\\d\te\r', "", None, "\\.\nNULL,\\N é ☃"]),
        "bin": pa.array([b'\x00\x01\\,\n"', b"", None, bytes(range(256))]),
        "flag": pa.array([True, False, None, True]),
        "day": pa.array([dt.date(1, 1, 1), dt.date(9999, 12, 31), None, dt.date(2024, 2, 29)]),
        "ts": pa.array(
            [
                dt.datetime(1970, 1, 1),
                dt.datetime(2024, 2, 29, 23, 59, 59, 999999),
                None,
                dt.datetime(1, 1, 1),
            ],  # fmt: skip
            pa.timestamp("us", tz="UTC"),
        ),
        "ntz": pa.array(
            [
                dt.datetime(1970, 1, 1),
                dt.datetime(2024, 2, 29, 23, 59, 59, 999999),
                None,
                dt.datetime(9999, 12, 31),
            ],  # fmt: skip
            pa.timestamp("us"),
        ),
    }
)


def readTyped(pg_url: str, table: str) -> list[dict[str, Any]]:
    with psycopg.connect(pg_url) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        cur = conn.execute(sql.SQL("SELECT * FROM {} ORDER BY id").format(sql.Identifier(table)))
        names = [d.name for d in cur.description or []]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def sameValue(a: Any, b: Any, single: bool = False) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a:
        return b != b
    if single and isinstance(a, float) and isinstance(b, float):
        return bool(np.float32(a) == np.float32(b))  # psycopg reads real as a double
    if isinstance(a, dt.datetime) and a.tzinfo is not None:
        return a == b
    return bool(a == b)


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_every_primitive_type_and_null_round_trips_and_is_invisible_until_commit(
    pg_url: str, table: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    keys = {"keyColumns": "id"} if mode == "upsert" else {}
    w, c = sink(pg_url, table, mode=mode, createTable="true", **keys)
    validateTarget(w.settings, TYPED.schema)  # creates the table from the Arrow (= Spark) schema
    handle = writeAndPrepare(w, context(table), TYPED.slice(0, 2), TYPED.slice(2))

    assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(0,)]
    assert prepared(pg_url, table) == [handle["gid"]]
    assert json.loads(json.dumps(handle)) == handle and "password" not in json.dumps(handle)

    c.commit(handle)
    with caplog.at_level(logging.INFO, logger="twophase.sinks.postgres"):
        c.commit(handle)  # idempotent: no longer prepared, the server says committed
    assert "already committed" in caplog.text
    assert prepared(pg_url, table) == []

    rows = readTyped(pg_url, table)
    expected = TYPED.to_pylist()
    assert len(rows) == len(expected)
    for got, want in zip(rows, expected, strict=True):
        for name, value in want.items():
            assert sameValue(value, got[name], name == "f4"), (name, value, got[name])


def test_empty_task_opens_no_connection_and_commits_nothing(pg_url: str, table: str) -> None:
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table)
    handle = writeAndPrepare(w, context(table))
    assert handle["gid"] is None and handle["rows"] == 0
    c.commit(handle)
    c.abort(handle)


# -- driver side: commit, abort, recovery -----------------------------------------------------


def test_commit_of_a_transaction_rolled_back_behind_our_back_is_a_loud_loss(
    pg_url: str, table: str
) -> None:
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table)
    handle = writeAndPrepare(w, context(table), idsBatch([1, 2]))
    execute(pg_url, sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(handle["gid"])).as_string())
    with pytest.raises(TransactionLostError, match="rolled back"):
        c.commit(handle)


def test_recover_and_abort_keeps_decided_handles_and_spares_other_sinks(
    pg_url: str, table: str
) -> None:
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table)
    decided = writeAndPrepare(w, context(table, batch=1, part=0), idsBatch([1]))
    straggler = writeAndPrepare(w, context(table, batch=1, part=0, attempt=1), idsBatch([2]))
    other = writeAndPrepare(w, context(table, batch=2, part=0), idsBatch([3]))
    foreign = TransactionContext(sinkIdOf(table) + "x", "q", 1, 0, 0, "run1")
    foreignHandle = writeAndPrepare(w, foreign, idsBatch([4]))
    try:
        scope = RecoveryScope(sinkIdOf(table), keep=(decided,), batchId=1)
        assert [h["gid"] for h in c.recoverAndAbort(scope)] == [straggler["gid"]]
        assert prepared(pg_url, table) == sorted([decided["gid"], other["gid"]])
        aborted = c.recoverAndAbort(RecoveryScope(sinkIdOf(table), keep=(decided,)))
        assert [(h["gid"], h["batchId"]) for h in aborted] == [(other["gid"], 2)]
        assert c.recoverAndAbort(RecoveryScope(sinkIdOf(table), keep=(decided,))) == []
        c.recoverAndCommit(decided)
        assert execute(pg_url, f"SELECT id FROM {table}") == [(1,)]
        assert foreignHandle["gid"] in {
            r[0] for r in execute(pg_url, "SELECT gid FROM pg_prepared_xacts")
        }
    finally:
        c.abort(foreignHandle)


def test_a_committer_rebuilt_from_sink_json_finishes_with_the_password_from_the_environment(
    pg_url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``twophase recover`` in another process: sink.json holds the url without its password,
    libpq takes it from PGPASSWORD, and the handle's transaction is kept, then committed."""
    createIdTable(pg_url, table)
    w, _ = sink(pg_url, table)
    handle = writeAndPrepare(w, context(table, batch=4), idsBatch([1, 2]))
    shown = {"url": publicOptionValue("url", pg_url) or "", "table": table}
    persisted = publicOptions(shown, SAFE_OPTIONS)
    password = str(psycopg.conninfo.conninfo_to_dict(pg_url)["password"])
    text = json.dumps(persisted)
    assert f":{password}@" not in text and "password" not in text and "***" not in text
    monkeypatch.setenv("PGPASSWORD", password)
    recovered = PostgresCommitter.fromOptions(persisted)
    assert recovered.settings.secrets == ()
    assert recovered.recoverAndAbort(RecoveryScope(sinkIdOf(table), keep=(handle,))) == []
    recovered.recoverAndCommit(handle)
    assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(2,)]
    assert prepared(pg_url, table) == []


def test_task_that_dies_mid_copy_leaves_nothing_prepared_or_visible(
    pg_url: str, table: str
) -> None:
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table)
    txn = w.beginTransaction(context(table))
    w.write(txn, idsBatch(list(range(1000))))
    assert txn.conn is not None
    txn.conn.pgconn.finish()  # the socket closes as when the process is SIGKILLed mid-COPY
    assert prepared(pg_url, table) == []
    assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(0,)]
    # the retry of the task writes the same ids without waiting for anything
    c.commit(writeAndPrepare(w, context(table, attempt=1), idsBatch(list(range(1000)))))
    assert execute(pg_url, f"SELECT count(*), count(DISTINCT id) FROM {table}") == [(1000, 1000)]


def test_retry_blocked_by_an_attempt_killed_after_prepare_fails_clearly_until_recovery(
    pg_url: str, table: str
) -> None:
    """A task killed right after PREPARE leaves its unique keys locked: the retry cannot wait
    for a transaction only the driver can finish, so it fails with the gids, and recovery
    (the next start of the query) rolls the zombie back."""
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table, lockTimeoutSeconds="1")
    zombie = writeAndPrepare(w, context(table, batch=3), idsBatch([1, 2, 3]))
    with pytest.raises(PostgresSinkError) as info:
        writeAndPrepare(w, context(table, batch=3, attempt=1), idsBatch([1, 2, 3]))
    message = str(info.value)
    assert "lockTimeoutSeconds=1" in message and zombie["gid"] in message
    assert prepared(pg_url, table) == [zombie["gid"]]
    assert [h["gid"] for h in c.recoverAndAbort(RecoveryScope(sinkIdOf(table)))] == [zombie["gid"]]
    c.commit(writeAndPrepare(w, context(table, batch=3, attempt=2), idsBatch([1, 2, 3])))
    assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(3,)]


# -- upsert -----------------------------------------------------------------------------------


def test_upsert_updates_existing_keys_last_row_wins_and_replays_are_harmless(
    pg_url: str, table: str
) -> None:
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table, mode="upsert", keyColumns="id", upsertBatchRows="3")
    validateTarget(w.settings, idsBatch([1]).schema)
    c.commit(writeAndPrepare(w, context(table, batch=0), idsBatch([1, 2, 3, 4], "v0-")))
    batch1 = pa.record_batch(
        {"id": pa.array([2, 5, 2, 3], pa.int64()), "payload": ["v1-a", "v1-b", "v1-c", "v1-d"]}
    )
    # batch 1 runs, is not decided (driver crash), is aborted, and is replayed
    c.abort(writeAndPrepare(w, context(table, batch=1), batch1))
    assert execute(pg_url, f"SELECT id, payload FROM {table} ORDER BY id") == [
        (1, "v0-1"), (2, "v0-2"), (3, "v0-3"), (4, "v0-4")]  # fmt: skip
    handle = writeAndPrepare(w, context(table, batch=1, attempt=1), batch1)
    c.commit(handle)
    c.commit(handle)
    assert execute(pg_url, f"SELECT id, payload FROM {table} ORDER BY id") == [
        (1, "v0-1"), (2, "v1-c"), (3, "v1-d"), (4, "v0-4"), (5, "v1-b")]  # fmt: skip


# -- bad input: each a clear error, nothing visible --------------------------------------------


def test_missing_table_without_create_table_says_how_to_fix(pg_url: str, table: str) -> None:
    with pytest.raises(TwoPhaseConfigError) as info:
        validateTarget(settingsOf(pg_url, table), idsBatch([1]).schema)
    message = str(info.value)
    assert table in message and "does not exist" in message and "createTable=true" in message


def test_missing_and_mistyped_columns_are_named_with_the_fix(pg_url: str, table: str) -> None:
    execute(
        pg_url,
        f'CREATE TABLE {table} (id integer PRIMARY KEY, "Payload" text, need text NOT NULL)',
    )
    schema = pa.schema([("id", pa.int64()), ("payload", pa.string())])
    with pytest.raises(TwoPhaseConfigError) as info:
        validateTarget(settingsOf(pg_url, table), schema)
    message = str(info.value)
    assert "column 'id' is a Spark bigint but the table column is integer" in message
    assert "'payload' is not in the table" in message and "'Payload'" in message
    assert "'need' is NOT NULL without a default" in message


def test_upsert_without_a_matching_unique_index_is_refused(pg_url: str, table: str) -> None:
    execute(pg_url, f"CREATE TABLE {table} (id bigint, payload text)")
    with pytest.raises(TwoPhaseConfigError, match="CREATE UNIQUE INDEX"):
        validateTarget(
            settingsOf(pg_url, table, mode="upsert", keyColumns="id"), idsBatch([1]).schema
        )


SECRET = "private-value-do-not-show"

# What each kind of bad row meets: the payload column's definition, the payload of the bad row
# (row 1 of the task's second record batch, so row 3 of the task), rows in the table before,
# and what the error must say besides the row's position.
REJECTIONS: dict[str, tuple[str, str | None, int, str | None, list[str]]] = {
    "not-null": (
        "payload text NOT NULL",
        None,
        3,
        None,
        ["column payload", "violates not-null constraint", "df.na.drop(subset=['payload'])"],
    ),
    "check": (
        "payload text CONSTRAINT short_payload CHECK (length(payload) < 10)",
        SECRET,
        3,
        None,
        ["constraint short_payload", "filter the rows that break constraint short_payload"],
    ),
    "too-long": (
        "payload varchar(10)",
        SECRET,
        3,
        None,
        ["column payload", "character varying(10)", "widen column payload", "truncate"],
    ),
    "duplicate-in-batch": (
        "payload text",
        "dup",
        11,
        None,
        ["key (id) already exists", "deduplicate"],
    ),
    "duplicate-of-a-row": (
        "payload text",
        "dup",
        424242,
        "INSERT INTO {table} VALUES (424242, 'there before')",
        ["key (id) already exists", "deduplicate"],
    ),
}


@pytest.mark.parametrize("commitMode", ["prepared", "staged"])
@pytest.mark.parametrize("case", list(REJECTIONS))
def test_a_rejected_row_names_its_position_column_and_fix_and_nothing_is_visible(
    pg_url: str, table: str, case: str, commitMode: str
) -> None:
    """The task fails (the staged path checks keys at the move, after the decision, and fails
    the commit), naming the batch, partition, row, column or constraint and the fix, never the
    value; nothing of the batch is visible, and a later good batch commits."""
    column, payload, badId, before, expected = REJECTIONS[case]
    execute(pg_url, f"CREATE TABLE {table} (id bigint PRIMARY KEY, {column})")
    if before:
        execute(pg_url, before.format(table=table))
    existing = execute(pg_url, f"SELECT count(*) FROM {table}")[0][0]
    w, c = sink(pg_url, table, commitMode=commitMode)
    validateTarget(w.settings, idsBatch([1]).schema)
    bad = pa.record_batch(
        {"id": pa.array([12, badId, 14], pa.int64()), "payload": pa.array(["a", payload, "c"])}
    )
    atTheMove = commitMode == "staged" and case.startswith("duplicate")
    with pytest.raises(RowRejectedError) as info:
        handle = writeAndPrepare(w, context(table, batch=5, part=2), idsBatch([10, 11]), bad)
        assert atTheMove, "the task should have failed"
        c.commit(handle)
    message = str(info.value)
    assert "batch 5" in message and "partition 2" in message and table in message
    assert "row 3 of partition 2 (counting from 0)" in message
    for fragment in expected:
        assert fragment in message, (fragment, message)
    assert SECRET not in message and "424242" not in message and "Failing row" not in message
    assert SECRET not in str(info.value.__cause__), "the chained server error quotes the row"
    if atTheMove:  # decided: the rows stay staged, moved at the restart after the fix
        assert "The batch is decided" in message and "restart the query" in message
        assert ("DROP CONSTRAINT" in message) == (case == "duplicate-in-batch")
    else:
        assert "restart the query: the batch is written again" in message
    assert prepared(pg_url, table) == []
    assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(existing,)]

    c.commit(writeAndPrepare(w, context(table, batch=6, part=2), idsBatch([20, 21])))
    assert execute(pg_url, f"SELECT count(*) FROM {table} WHERE id IN (20, 21)") == [(2,)]


SET_ASIDE = [
    (case, mode)
    for case in REJECTIONS
    for mode in ("append", "upsert")
    if mode == "append" or not case.startswith("duplicate")  # an upsert updates those
]


@pytest.mark.parametrize(("case", "mode"), SET_ASIDE)
def test_with_bad_records_a_rejected_row_is_set_aside_in_the_task_s_own_transaction(
    pg_url: str, table: str, case: str, mode: str
) -> None:
    """``badRecords``: the rows around the rejected one reach the target, the rejected one the
    dead-letter table (created by the driver), both inside the task's prepared transaction:
    invisible until the commit, committed once, never when the batch is aborted."""
    column, payload, badId, before, expected = REJECTIONS[case]
    execute(pg_url, f"CREATE TABLE {table} (id bigint PRIMARY KEY, {column})")
    if before:
        execute(pg_url, before.format(table=table))
    existing = {r[0] for r in execute(pg_url, f"SELECT id FROM {table}")}
    aside = f"{table}_rejected"
    upsert = {"mode": "upsert", "keyColumns": "id"} if mode == "upsert" else {}
    w, c = sink(pg_url, table, badRecords=aside, **upsert)
    try:
        validateTarget(w.settings, idsBatch([1]).schema)
        bad = pa.record_batch(
            {"id": pa.array([12, badId, 14], pa.int64()), "payload": pa.array(["a", payload, "c"])}
        )
        ctx = context(table, batch=5, part=2)
        handle = writeAndPrepare(w, ctx, idsBatch([10, 11]), bad)
        assert handle["setAside"] == 1 and handle["rows"] == 5
        assert execute(pg_url, f"SELECT count(*) FROM {aside}") == [(0,)]
        assert {r[0] for r in execute(pg_url, f"SELECT id FROM {table}")} == existing
        c.commit(handle)
        ids = {r[0] for r in execute(pg_url, f"SELECT id FROM {table}")}
        assert ids == existing | {10, 11, 12, 14}
        [row] = execute(
            pg_url,
            f"SELECT gid, row_position, sink_id, batch_id, partition_id, error, record "
            f"FROM {aside}",
        )
        assert row[0] == handle["gid"] and row[1:5] == (3, sinkIdOf(table), 5, 2)
        assert "row 3 of partition 2 (counting from 0)" in row[5]
        assert any(fragment in row[5] for fragment in expected[:1]), row[5]
        assert SECRET not in row[5] and "424242" not in row[5]
        assert row[6] == {"id": badId, "payload": payload}  # the record holds the row

        aborted = writeAndPrepare(w, context(table, batch=6, part=2), bad)
        c.abort(aborted)
        assert execute(pg_url, f"SELECT count(*) FROM {aside}") == [(1,)]
        assert prepared(pg_url, table) == []
    finally:
        execute(pg_url, f"DROP TABLE IF EXISTS {aside}")


def test_bad_records_needs_a_prepared_transaction_per_partition_and_says_so(
    pg_url: str, table: str
) -> None:
    """Every partition is prepared with ``badRecords``; one past the server's limit fails
    before writing, naming the fixes that apply."""
    createIdTable(pg_url, table)
    w, _ = sink(pg_url, table, badRecords=f"{table}_rejected")
    limit = int(execute(pg_url, "SHOW max_prepared_transactions")[0][0])
    try:
        validateTarget(w.settings, idsBatch([1]).schema)
        with pytest.raises(PreparedLimitError) as info:
            writeAndPrepare(w, context(table, part=limit), idsBatch([1]))
        message = str(info.value)
        assert "with option badRecords every partition holds a prepared transaction" in message
        assert "write fewer partitions" in message and "badRecords=fail" in message
        assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(0,)]
        assert execute(pg_url, "SELECT to_regclass(%s)", f"{table}_twophase_staging") == [(None,)]
    finally:
        execute(pg_url, f"DROP TABLE IF EXISTS {table}_rejected")


@pytest.mark.parametrize("constraint", ["payload text NOT NULL", "payload varchar(3)"])
def test_an_upsert_names_the_row_the_server_did_not_place(
    pg_url: str, table: str, constraint: str
) -> None:
    """An upsert statement says no line: the row is found in its chunk (after the last row per
    key was kept), its position counted in the task."""
    execute(pg_url, f"CREATE TABLE {table} (id bigint PRIMARY KEY, {constraint})")
    w, c = sink(pg_url, table, mode="upsert", keyColumns="id", upsertBatchRows="2")
    bad = pa.record_batch(
        {
            "id": pa.array([1, 2, 2, 3], pa.int64()),
            "payload": pa.array(["a", "b", None if "NULL" in constraint else SECRET, "c"]),
        }
    )
    with pytest.raises(RowRejectedError) as info:
        writeAndPrepare(w, context(table, batch=2), idsBatch([10, 11], "r"), bad)
    message = str(info.value)
    # chunks: rows 2-3 (ids 1, 2), rows 4-5 (ids 2, 3): the bad row is the task's row 4
    assert "row 4 of partition 0 (counting from 0), column payload" in message, message
    assert SECRET not in message
    assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(0,)]
    c.commit(writeAndPrepare(w, context(table, batch=3), idsBatch([1], "r")))
    assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(1,)]


def documentedForm(text: str, table: str) -> str:
    """A message as docs/postgres.md shows it: the table ``orders``, sink ``orders``; the
    server's address and a staged token's attempt and run are the document's own."""
    text = oneLine(text).replace(sinkIdOf(table), "orders").replace(table, "orders")
    text = re.sub(r"at \S+@[\w.]+:\d+/[^:\s]+:", "at <server>:", text)
    return re.sub(r"staged as tp1:\S+ ", "staged as <token> ", text)


def test_the_documented_rejections_are_what_the_sink_says(pg_url: str, table: str) -> None:
    """docs/postgres.md, "A record the target rejects": both examples are real output."""
    execute(pg_url, f"CREATE TABLE {table} (id bigint PRIMARY KEY, note varchar(10))")
    w, _ = sink(pg_url, table)
    notes = pa.record_batch(
        {"id": pa.array([1, 2, 3, 4], pa.int64()), "note": ["ok", "ok", "ok", "a note too long"]}
    )
    with pytest.raises(RowRejectedError) as tooLong:
        writeAndPrepare(w, context(table, batch=7, part=2), notes)
    execute(pg_url, f"INSERT INTO {table} VALUES (2, 'there')")
    staged, c = sink(pg_url, table, commitMode="staged")
    validateTarget(staged.settings, notes.schema)
    handle = writeAndPrepare(staged, context(table, batch=7, part=3), notes.slice(0, 3))
    with pytest.raises(RowRejectedError) as atTheMove:
        c.commit(handle)
    documented = sectionBlocks("postgres.md", "A record the target rejects")
    assert [documentedForm(str(e.value), table) for e in (tooLong, atTheMove)] == [
        documentedForm(block, "orders") for block in documented
    ]


def test_an_upsert_refuses_a_value_too_long_for_its_column_as_copy_does(
    pg_url: str, table: str
) -> None:
    """A cast to varchar(n) would cut the value; the insert's own check refuses it."""
    execute(pg_url, f"CREATE TABLE {table} (id bigint PRIMARY KEY, payload varchar(5))")
    w, c = sink(pg_url, table, mode="upsert", keyColumns="id")
    with pytest.raises(RowRejectedError, match="value too long for type character varying"):
        writeAndPrepare(w, context(table), idsBatch([1, 2], payload="too-long-"))
    assert prepared(pg_url, table) == [] and execute(pg_url, f"SELECT count(*) FROM {table}") == [
        (0,)
    ]
    c.commit(writeAndPrepare(w, context(table, batch=1), idsBatch([1, 2], payload="r")))
    assert execute(pg_url, f"SELECT payload FROM {table} ORDER BY id") == [("r1",), ("r2",)]


def test_password_never_reaches_handles_logs_or_errors(
    pg_url: str, table: str, caplog: pytest.LogCaptureFixture
) -> None:
    password = str(psycopg.conninfo.conninfo_to_dict(pg_url)["password"])
    wrongPassword = f"Wr0ng-{uuid.uuid4().hex}"
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table, connectRetrySeconds="0")
    with caplog.at_level(logging.DEBUG, logger="twophase"):
        handle = writeAndPrepare(w, context(table), idsBatch([1]))
        c.commit(handle)
        c.commit(handle)
        wrong = settingsOf(pg_url, table, password=wrongPassword)
        with pytest.raises(PostgresSinkError) as info:
            validateTarget(wrong, idsBatch([1]).schema)
        with pytest.raises(PostgresSinkError) as inUrl:
            validateTarget(
                settingsOf(pg_url.replace(f":{password}@", f":{wrongPassword}@"), table),
                idsBatch([1]).schema,
            )
    assert "password authentication failed" in str(info.value)
    assert "password" not in json.dumps(handle)
    texts = (
        json.dumps(handle),
        caplog.text,
        str(info.value),
        str(inUrl.value),
        repr(PostgresWriter(wrong)),
        repr(PostgresCommitter(wrong)),
    )
    for text in (*texts, c.describe(handle)):
        assert wrongPassword not in text and f":{password}@" not in text


# -- server down, restarted ----------------------------------------------------------------------


def test_prepared_transactions_survive_a_server_crash_and_commit_waits_for_the_server(
    pg_url: str, table: str, postgres_server: ServiceControl
) -> None:
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table, connectRetrySeconds="1")
    handle = writeAndPrepare(w, context(table), idsBatch([1, 2, 3]))
    postgres_server.kill()
    try:
        with pytest.raises(TransientCommitError):
            c.commit(handle)  # the coordinator retries these
        with pytest.raises(PostgresUnavailableError, match="unreachable"):
            writeAndPrepare(w, context(table, batch=1), idsBatch([4]))
        with pytest.raises(TransientCommitError):
            c.recoverAndAbort(RecoveryScope(sinkIdOf(table), keep=(handle,)))
    finally:
        postgres_server.start()
    assert prepared(pg_url, table) == [handle["gid"]]
    assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(0,)]
    for _ in range(3):  # pooled connections died with the server: retried like the coordinator
        try:
            c.commit(handle)
            break
        except TransientCommitError:
            continue
    assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(3,)]


def test_a_frozen_server_fails_the_task_and_the_commit_in_bounded_time_then_commits_once(
    pg_url: str, table: str, postgres_server: ServiceControl
) -> None:
    """A frozen PostgreSQL (every process stopped: connections open, packets acknowledged by
    the kernel, nothing answered, as a paused container leaves them) must not hold a task's
    COPY or the driver's COMMIT PREPARED forever: libpq has no read timeout, so socketTimeout
    drops the connection; both fail retryably, naming the option. The task's unprepared
    transaction is rolled back when the server resumes; the decided batch then commits."""
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table, socketTimeout="2", connectTimeout="2", connectRetrySeconds="0")
    h0 = writeAndPrepare(w, context(table, batch=0), idsBatch([1, 2]))
    h1 = writeAndPrepare(w, context(table, batch=1), idsBatch([3, 4]))
    c.commit(h0)  # the driver's pool now holds a connection
    txn = w.beginTransaction(context(table, batch=2))
    w.write(txn, idsBatch([5, 6]))  # the task's COPY is open
    outcomes = callsDuringAFreeze(
        postgres_server, {"preCommit": lambda: w.preCommit(txn), "commit": lambda: c.commit(h1)}
    )
    taskError = failedWithin(outcomes, "preCommit", PostgresUnavailableError, 6)
    assert "batch 2, partition 0" in str(taskError)
    assert "no answer within socketTimeout=2 s" in str(taskError)
    commitError = failedWithin(outcomes, "commit", TransientCommitError, 6)
    assert "socketTimeout=2" in str(commitError)
    w.abortTransaction(txn)
    c.commit(h1)  # after the server resumed: once
    c.commit(h1)  # and again (a retry after a lost reply): a no-op
    assert execute(pg_url, f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,), (3,), (4,)]
    assert prepared(pg_url, table) == []


def test_a_lost_reply_to_commit_prepared_fails_in_bounded_time_and_the_retry_finds_it_done(
    pg_url: str, table: str, proxies: Toxiproxy
) -> None:
    """The network loses the server's answer to ``COMMIT PREPARED`` (the request arrived and
    committed): the driver's commit fails within socketTimeout, retryably, and the coordinator's
    retry finds the gid no longer prepared, asks the server what became of the transaction
    (committed) and succeeds without writing anything twice."""
    createIdTable(pg_url, table)
    proxy = proxies.proxy("postgres")
    w, c = sink(
        proxiedUrl(pg_url, proxy),
        table,
        socketTimeout="2",
        connectTimeout="2",
        connectRetrySeconds="0",
    )
    c.commit(writeAndPrepare(w, context(table, batch=0), idsBatch([1, 2])))  # pool: 1 session
    decided = writeAndPrepare(w, context(table, batch=1), idsBatch([3, 4]))
    outcomes = callsDuring(proxy.loseReplies, proxy.heal, {"commit": lambda: c.commit(decided)})
    commitError = failedWithin(outcomes, "commit", TransientCommitError, 6)
    assert "socketTimeout=2" in str(commitError)
    # Read directly, not through the proxy: the request did reach the server.
    assert execute(pg_url, f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,), (3,), (4,)]
    assert prepared(pg_url, table) == []
    c.commit(decided)  # the coordinator's retry
    assert execute(pg_url, f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,), (3,), (4,)]


# -- memory -------------------------------------------------------------------------------------


def test_memory_per_task_stays_at_one_batch_however_many_batches(pg_url: str, table: str) -> None:
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table)
    txn = w.beginTransaction(context(table))
    pool = pa.default_memory_pool()
    tracemalloc.start()
    try:
        peaks = []
        for start in range(0, 400_000, 20_000):
            w.write(txn, idsBatch(list(range(start, start + 20_000)), "x" * 50))
            peaks.append(tracemalloc.get_traced_memory()[1])
        handle = w.preCommit(txn)
    finally:
        tracemalloc.stop()
    assert pool.bytes_allocated() < 50_000_000
    assert max(peaks) < 60_000_000  # one batch of Python objects + its CSV, not 400k rows
    assert peaks[-1] < 2 * peaks[1] + 5_000_000  # flat: no growth with the number of batches
    c.abort(handle)


# -- a server without prepared transactions ------------------------------------------------------


@pytest.fixture(scope="module")
def server_without_2pc() -> Iterator[str]:
    """A private, throwaway PostgreSQL with max_prepared_transactions = 0 (the default)."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    initdb = str(bins[0]) if bins else shutil.which("initdb")
    if not initdb:
        pytest.fail("initdb not found: install the PostgreSQL server packages (make services)")
    binDir = Path(initdb).parent
    root = tempfile.mkdtemp(prefix="twophase-pg0-", dir="/tmp")
    asUser: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        shutil.chown(root, "postgres")
        asUser = ["runuser", "-u", "postgres", "--"]
    data = f"{root}/data"

    def run(*args: str) -> None:
        subprocess.run([*asUser, *args], check=True, capture_output=True, timeout=120, cwd="/")

    try:
        run(str(binDir / "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "--no-sync")
        run(
            str(binDir / "pg_ctl"), "start", "-w", "-D", data, "-l", f"{root}/log",
            "-o", f"-c listen_addresses='' -k {root} -c max_prepared_transactions=0",
        )  # fmt: skip
        yield f"host={root} user=postgres dbname=postgres"
    finally:
        subprocess.run(
            [*asUser, str(binDir / "pg_ctl"), "stop", "-m", "immediate", "-D", data],
            capture_output=True,
            cwd="/",
        )
        shutil.rmtree(root, ignore_errors=True)


def test_max_prepared_transactions_zero_is_refused_with_how_to_set_it(
    server_without_2pc: str,
) -> None:
    settings = PostgresSettings.fromOptions(
        {"url": server_without_2pc, "table": "t", "createTable": "true", "commitMode": "prepared"}
    )
    with pytest.raises(TwoPhaseConfigError) as info:
        validateTarget(settings, idsBatch([1]).schema)
    message = str(info.value)
    assert "max_prepared_transactions = 0" in message
    assert "ALTER SYSTEM SET max_prepared_transactions" in message
    assert "number of partitions" in message and "restart" in message
    assert "commitMode=auto" in message


def test_max_prepared_transactions_zero_in_auto_mode_stages_every_partition(
    server_without_2pc: str,
) -> None:
    """Many managed servers allow no prepared transactions: ``auto`` stages everything."""
    w, c = sink(server_without_2pc, "t0", createTable="true")
    validateTarget(w.settings, idsBatch([1]).schema)
    handles = [writeAndPrepare(w, context("t0", part=p), idsBatch([p])) for p in range(2)]
    assert [h.get("path") for h in handles] == ["staged", "staged"]
    for h in handles:
        c.commit(h)
    assert execute(server_without_2pc, "SELECT id FROM t0 ORDER BY id") == [(0,), (1,)]


# -- the staged path (commitMode staged, and auto beyond maxPreparedPartitions) ----------------


def staged(pg_url: str, table: str) -> dict[str, int]:
    """Rows per token in the staging table (committed, invisible in the target)."""
    rows = execute(
        pg_url,
        sql.SQL("SELECT __tp_token, count(*) FROM {} GROUP BY 1")
        .format(sql.Identifier(stagingTables(table)[0]))
        .as_string(),
    )
    return {str(token): int(n) for token, n in rows}


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_staged_every_type_round_trips_invisible_until_moved_and_a_second_commit_is_a_noop(
    pg_url: str, table: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    keys = {"keyColumns": "id"} if mode == "upsert" else {}
    w, c = sink(pg_url, table, mode=mode, createTable="true", commitMode="staged", **keys)
    validateTarget(w.settings, TYPED.schema)  # creates the target, staging and marker tables
    handle = writeAndPrepare(w, context(table), TYPED.slice(0, 2), TYPED.slice(2))

    assert handle["path"] == "staged" and "gid" not in handle
    assert staged(pg_url, table) == {handle["token"]: 4}
    assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(0,)]
    assert prepared(pg_url, table) == []
    assert json.loads(json.dumps(handle)) == handle and "password" not in json.dumps(handle)

    c.commit(handle)
    with caplog.at_level(logging.INFO, logger="twophase.sinks.postgres"):
        c.recoverAndCommit(handle)  # idempotent: the marker says it was moved
    assert "marker found" in caplog.text
    assert staged(pg_url, table) == {}

    rows = readTyped(pg_url, table)
    expected = TYPED.to_pylist()
    assert len(rows) == len(expected)
    for got, want in zip(rows, expected, strict=True):
        for name, value in want.items():
            assert sameValue(value, got[name], name == "f4"), (name, value, got[name])


def test_staged_abort_is_idempotent_and_a_commit_after_it_is_a_loud_loss(
    pg_url: str, table: str
) -> None:
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table, commitMode="staged")
    validateTarget(w.settings, idsBatch([1]).schema)
    handle = writeAndPrepare(w, context(table), idsBatch([1, 2]))
    c.abort(handle)
    c.abort(handle)
    assert staged(pg_url, table) == {}
    with pytest.raises(TransactionLostError, match="staged rows are gone"):
        c.commit(handle)
    assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(0,)]


def test_staged_sweep_removes_unkept_tokens_keeps_kept_ones_and_spares_other_sinks(
    pg_url: str, table: str
) -> None:
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table, commitMode="staged")
    validateTarget(w.settings, idsBatch([1]).schema)
    decided = writeAndPrepare(w, context(table, batch=1, part=0), idsBatch([1]))
    straggler = writeAndPrepare(w, context(table, batch=1, part=0, attempt=1), idsBatch([2]))
    other = writeAndPrepare(w, context(table, batch=2, part=0), idsBatch([3]))
    foreign = writeAndPrepare(
        w, TransactionContext(sinkIdOf(table) + "x", "q", 1, 0, 0, "run1"), idsBatch([4])
    )
    scope = RecoveryScope(sinkIdOf(table), keep=(decided,), batchId=1)
    assert [(h["token"], h["rows"]) for h in c.recoverAndAbort(scope)] == [(straggler["token"], 1)]
    aborted = c.recoverAndAbort(RecoveryScope(sinkIdOf(table), keep=(decided,)))
    assert [(h["token"], h["batchId"]) for h in aborted] == [(other["token"], 2)]
    assert c.recoverAndAbort(RecoveryScope(sinkIdOf(table), keep=(decided,))) == []
    assert staged(pg_url, table) == {decided["token"]: 1, foreign["token"]: 1}
    c.recoverAndCommit(decided)
    assert execute(pg_url, f"SELECT id FROM {table}") == [(1,)]
    with pytest.raises(TransactionLostError):
        c.commit(straggler)  # never decided, swept: committing it can only be a loud loss


def test_markers_are_pruned_to_the_last_two_batches_and_commits_stay_no_ops_there(
    pg_url: str, table: str
) -> None:
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table, commitMode="staged")
    validateTarget(w.settings, idsBatch([1]).schema)
    # batch 9 of an earlier query that used the same sink id, then batches 0-3 of this one
    earlier = writeAndPrepare(w, context(table, batch=9), idsBatch([9]))
    c.commit(earlier)
    handles = [writeAndPrepare(w, context(table, batch=b), idsBatch([b])) for b in range(4)]
    for h in handles:
        c.commit(h)
    c.recoverAndAbort(RecoveryScope(sinkIdOf(table)))  # a start: prunes nothing
    assert len(execute(pg_url, f"SELECT 1 FROM {stagingTables(table)[1]}")) == 5
    c.recoverAndAbort(RecoveryScope(sinkIdOf(table), keep=(handles[3],), batchId=3))
    markers = execute(pg_url, f"SELECT batch_id FROM {stagingTables(table)[1]} ORDER BY 1")
    assert markers == [(2,), (3,)]
    c.commit(handles[3])
    c.commit(handles[2])
    assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(5,)]


CHILD_WRITER = """
import os, signal, sys
import pyarrow as pa
from twophase.protocol import TransactionContext
from twophase.sinks.postgres import PostgresWriter
url, table, sinkId, where = sys.argv[1:]
w = PostgresWriter.fromOptions({"url": url, "table": table, "commitMode": "staged"})
txn = w.beginTransaction(TransactionContext(sinkId, "q", 5, 0, 0, where))
w.write(txn, pa.record_batch({"id": pa.array(range(100), pa.int64()),
                              "payload": pa.array([str(i) for i in range(100)])}))
if where == "afterPreCommit":
    w.preCommit(txn)
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_writer_killed_mid_copy_stages_nothing_and_killed_after_staging_is_swept(
    pg_url: str, table: str
) -> None:
    """SIGKILLed writers: mid-COPY the server rolls the staging transaction back; after the
    staging COMMIT (before Spark hears of the handle) the rows stay staged, invisible, until
    the sweep of the next recovery removes them."""
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table, commitMode="staged")
    validateTarget(w.settings, idsBatch([1]).schema)
    for where in ("midCopy", "afterPreCommit"):
        child = subprocess.run(
            [sys.executable, "-c", CHILD_WRITER, pg_url, table, sinkIdOf(table), where],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert child.returncode == -9 and "ready" in child.stdout, child.stderr[-2000:]
    [(token, rows)] = staged(pg_url, table).items()
    assert ":a0:rafterPreCommit:" in token and rows == 100
    assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(0,)]
    [swept] = c.recoverAndAbort(RecoveryScope(sinkIdOf(table)))
    assert swept["token"] == token and staged(pg_url, table) == {}


def test_staged_upsert_last_row_per_key_wins_across_chunks_and_updates_existing_keys(
    pg_url: str, table: str
) -> None:
    createIdTable(pg_url, table)
    execute(pg_url, f"INSERT INTO {table} VALUES (1, 'old'), (9, 'untouched')")
    w, c = sink(
        pg_url, table, mode="upsert", keyColumns="id", commitMode="staged", upsertBatchRows="2"
    )
    validateTarget(w.settings, idsBatch([1]).schema)
    handle = writeAndPrepare(w, context(table), idsBatch([1, 2, 1], "a"), idsBatch([2, 3, 1], "b"))
    assert handle["rows"] == 6 and handle["keys"] == ["id"]
    c.commit(handle)
    c.commit(handle)
    assert execute(pg_url, f"SELECT id, payload FROM {table} ORDER BY id") == [
        (1, "b1"),
        (2, "b2"),
        (3, "b3"),
        (9, "untouched"),
    ]


def test_a_staged_row_the_target_refuses_at_the_move_fails_loudly_and_commits_after_the_fix(
    pg_url: str, table: str
) -> None:
    """Unique keys are checked at the move, after the decision: the commit names the
    constraint, the rows stay staged (nothing visible), and commit succeeds once fixed."""
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table, commitMode="staged")
    validateTarget(w.settings, idsBatch([1]).schema)
    handle = writeAndPrepare(w, context(table), idsBatch([1, 2]))
    execute(pg_url, f"INSERT INTO {table} VALUES (2, 'someone else')")
    with pytest.raises(PostgresSinkError, match=f"constraint {table}_pkey"):
        c.commit(handle)
    assert staged(pg_url, table) == {handle["token"]: 2}
    execute(pg_url, f"DELETE FROM {table} WHERE id = 2")
    c.commit(handle)
    assert execute(pg_url, f"SELECT id, payload FROM {table} ORDER BY id") == [
        (1, "row-1"),
        (2, "row-2"),
    ]


def test_a_staged_row_breaking_not_null_fails_the_task_before_anything_is_decided(
    pg_url: str, table: str
) -> None:
    createIdTable(pg_url, table)
    w, _ = sink(pg_url, table, commitMode="staged")
    validateTarget(w.settings, idsBatch([1]).schema)
    bad = pa.record_batch(
        {"id": pa.array([1], pa.int64()), "payload": pa.array([None], pa.string())}
    )
    with pytest.raises(RowRejectedError, match="column payload"):
        writeAndPrepare(w, context(table), bad)
    assert staged(pg_url, table) == {}


def test_auto_mode_mixes_prepared_and_staged_partitions_in_one_batch(
    pg_url: str, table: str
) -> None:
    createIdTable(pg_url, table)
    w, c = sink(pg_url, table, maxPreparedPartitions="1")
    validateTarget(w.settings, idsBatch([1]).schema)
    handles = [writeAndPrepare(w, context(table, part=p), idsBatch([p, 10 + p])) for p in range(3)]
    assert [h.get("path", "prepared") for h in handles] == ["prepared", "staged", "staged"]
    assert prepared(pg_url, table) == [handles[0]["gid"]]
    scope = RecoveryScope(sinkIdOf(table), keep=tuple(handles), batchId=0)
    assert c.recoverAndAbort(scope) == []
    for h in handles:
        c.commit(h)
        c.commit(h)
    assert execute(pg_url, f"SELECT count(*), count(DISTINCT id) FROM {table}") == [(6, 6)]
    assert prepared(pg_url, table) == [] and staged(pg_url, table) == {}


def test_a_thousand_partitions_in_one_batch_against_a_server_allowing_a_hundred_prepared(
    pg_url: str, table: str
) -> None:
    """The default (``auto``): half the server's slots prepare, the other 950 partitions stage;
    the batch commits exactly once and leaves nothing prepared or staged."""
    createIdTable(pg_url, table)
    [(limit,)] = execute(pg_url, "SELECT current_setting('max_prepared_transactions')::int")
    partitions = 10 * limit
    w, c = sink(pg_url, table)
    validateTarget(w.settings, idsBatch([1]).schema)
    handles = [
        writeAndPrepare(w, context(table, part=p), idsBatch([2 * p, 2 * p + 1]))
        for p in range(partitions)
    ]
    paths = [h.get("path", "prepared") for h in handles]
    assert (
        paths.count("prepared") == limit // 2 and paths.count("staged") == partitions - limit // 2
    )
    assert len(prepared(pg_url, table)) == limit // 2
    for h in handles:
        c.commit(h)
    assert execute(pg_url, f"SELECT count(*), count(DISTINCT id) FROM {table}") == [
        (2 * partitions, 2 * partitions)
    ]
    assert prepared(pg_url, table) == [] and staged(pg_url, table) == {}


def test_prepared_mode_refuses_a_partition_beyond_the_servers_limit_before_writing(
    pg_url: str, table: str
) -> None:
    createIdTable(pg_url, table)
    [(limit,)] = execute(pg_url, "SELECT current_setting('max_prepared_transactions')::int")
    w, _ = sink(pg_url, table, commitMode="prepared")
    validateTarget(w.settings, idsBatch([1]).schema)
    with pytest.raises(PreparedLimitError) as info:
        writeAndPrepare(w, context(table, part=limit), idsBatch([1, 2]))
    message = str(info.value)
    assert f"max_prepared_transactions = {limit}" in message
    assert f"partition {limit}" in message and "Nothing was written" in message
    assert "commitMode=auto" in message and "fewer partitions" in message
    assert prepared(pg_url, table) == []
    assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(0,)]
    assert execute(pg_url, "SELECT to_regclass(%s)", stagingTables(table)[0]) == [(None,)]


def test_a_worker_reuses_its_session_between_tasks_and_replaces_a_broken_one(
    pg_url: str, table: str
) -> None:
    createIdTable(pg_url, table)
    app = unique("tp_sessions")
    w, c = sink(pg_url, table, applicationName=app, maxPreparedPartitions="1")
    validateTarget(w.settings, idsBatch([1]).schema)

    def backends() -> list[int]:
        rows = execute(pg_url, "SELECT pid FROM pg_stat_activity WHERE application_name = %s", app)
        return sorted(r[0] for r in rows)

    try:
        driver = backends()  # validateTarget's pooled connection
        handles = [writeAndPrepare(w, context(table, part=p % 2), idsBatch([p])) for p in range(4)]
        [task] = [pid for pid in backends() if pid not in driver]  # one session, four tasks
        execute(pg_url, "SELECT pg_terminate_backend(%s, 10000)", task)  # waits for the exit
        handles.append(writeAndPrepare(w, context(table, part=1), idsBatch([4])))
        [replaced] = [pid for pid in backends() if pid not in driver]
        assert replaced != task
        for h in handles:
            c.commit(h)
        assert execute(pg_url, f"SELECT count(*) FROM {table}") == [(5,)]
    finally:
        TASK_SESSIONS.clear()


CHILD_COMMITTER = """
import json, sys
from twophase.sinks.postgres import PostgresCommitter
url, table, handle = sys.argv[1:]
PostgresCommitter.fromOptions({"url": url, "table": table}).commit(json.loads(handle))
"""


def test_a_move_cut_short_by_a_killed_driver_or_a_dropped_connection_is_redone_once(
    pg_url: str, table: str
) -> None:
    """The move is one transaction: a driver SIGKILLed in it, or its session ended by the
    server, leaves the rows staged and no marker; the next commit moves them exactly once.
    The move is held mid-way (staged rows deleted, the upsert waiting) by a row lock."""
    createIdTable(pg_url, table)
    execute(pg_url, f"INSERT INTO {table} VALUES (1, 'old')")
    w, c = sink(pg_url, table, mode="upsert", keyColumns="id", commitMode="staged")
    validateTarget(w.settings, idsBatch([1]).schema)
    handle = writeAndPrepare(w, context(table), idsBatch([1, 2, 3]))

    def waitingMove() -> int:
        for _ in range(300):
            rows = execute(
                pg_url,
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                f"%{stagingTables(table)[0]}%",
            )
            if rows:
                return int(rows[0][0])
            time.sleep(0.05)
        raise AssertionError("the move never waited for the row lock")

    for cut in ("driver SIGKILL", "backend terminated"):
        with psycopg.connect(pg_url) as locker:  # holds row 1 until the end of the block
            locker.execute(f"SELECT * FROM {table} WHERE id = 1 FOR UPDATE")
            child = subprocess.Popen(
                [sys.executable, "-c", CHILD_COMMITTER, pg_url, table, json.dumps(handle)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            backend = waitingMove()
            if cut == "driver SIGKILL":
                child.kill()  # the move finishes once the lock goes, then finds no COMMIT
            else:
                execute(pg_url, "SELECT pg_terminate_backend(%s, 10000)", backend)
            _, stderr = child.communicate(timeout=60)
            assert child.returncode != 0
            if cut == "backend terminated":
                assert "TransientCommitError" in stderr, stderr[-2000:]
        # The orphaned backend notices its client is gone and rolls the move back: what the
        # cut left is final once it has exited (until then it holds the move's locks).
        deadline = time.monotonic() + 30
        while execute(pg_url, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", backend):
            assert time.monotonic() < deadline, f"the cut move's backend {backend} still runs"
            time.sleep(0.05)
        assert staged(pg_url, table) == {handle["token"]: 3}
        assert execute(pg_url, f"SELECT id, payload FROM {table}") == [(1, "old")]
    c.commit(handle)
    c.commit(handle)
    assert execute(pg_url, f"SELECT id, payload FROM {table} ORDER BY id") == [
        (1, "row-1"),
        (2, "row-2"),
        (3, "row-3"),
    ]


def test_staging_tables_without_create_privilege_fail_with_the_ddl_and_the_alternatives(
    pg_url: str, table: str
) -> None:
    """``staged`` refuses to start; ``auto`` starts (its prepared partitions need no staging
    table) and a partition that would stage fails before writing, naming the fixes."""
    schema = f"s_{table}"
    execute(pg_url, f"CREATE SCHEMA {schema}")
    try:
        execute(pg_url, f"CREATE TABLE {schema}.{table} (id bigint, payload text)")
        execute(pg_url, f"REVOKE CREATE ON SCHEMA {schema} FROM CURRENT_USER")
        staged = settingsOf(pg_url, f"{schema}.{table}", commitMode="staged")
        with pytest.raises(TwoPhaseConfigError) as info:
            validateTarget(staged, idsBatch([1]).schema)
        message = str(info.value)
        assert f"{schema}.{table}_twophase_staging" in message and "permission denied" in message
        assert (
            f"Grant CREATE on schema {schema}" in message
            and "CREATE TABLE IF NOT EXISTS" in message
        )
        assert "commitMode=prepared" in message
        validateTarget(
            settingsOf(pg_url, f"{schema}.{table}", commitMode="prepared"), idsBatch([1]).schema
        )
        w, c = sink(pg_url, f"{schema}.{table}", maxPreparedPartitions="1")
        validateTarget(w.settings, idsBatch([1]).schema)
        kept = writeAndPrepare(w, context(table, part=0), idsBatch([1]))
        with pytest.raises(PostgresSinkError) as refused:
            writeAndPrepare(w, context(table, part=1), idsBatch([2]))
        message = str(refused.value)
        assert "Nothing was written" in message and "maxPreparedPartitions = 1" in message
        assert f"CREATE on schema {schema}" in message and "coalesce" in message
        c.commit(kept)
        assert execute(pg_url, f"SELECT id FROM {schema}.{table}") == [(1,)]
    finally:
        execute(pg_url, f"DROP SCHEMA {schema} CASCADE")
