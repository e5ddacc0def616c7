"""The relational sinks (postgres, sql) side by side: the same options, names and sessions.

What both sinks share (``twophase.sinks.relational``) is tested once over both; each sink's own
options stay in tests/test_postgres_options.py and tests/test_sql_options.py.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from twophase.protocol import TransactionContext
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.postgres import PostgresSettings
from twophase.sinks.postgres import rejections as pgRejections
from twophase.sinks.postgres import validateTarget as pgValidate
from twophase.sinks.postgres.dialect import gidFor
from twophase.sinks.relational.naming import TransactionName, batchPrefix, sinkPrefix, taskOf
from twophase.sinks.relational.rejections import Rejection
from twophase.sinks.relational.sessions import IdleSessions
from twophase.sinks.sql import SqlSettings
from twophase.sinks.sql import rejections as sqlRejections
from twophase.sinks.sql import validateTarget as sqlValidate
from twophase.sinks.sql.dialect import xidFor

SINKS: dict[str, tuple[Callable[[dict[str, str]], Any], str]] = {
    "postgres": (PostgresSettings.fromOptions, "postgresql://u:s3cret@h/db"),
    "sql": (SqlSettings.fromOptions, "mysql+pymysql://u:s3cret@h/db"),
}


def settings(sink: str, **options: str) -> Any:
    fromOptions, url = SINKS[sink]
    return fromOptions({"url": url, **options})


@pytest.mark.parametrize("sink", SINKS)
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "sink needs option dbtable (or table): the target table"),
        (
            {"dbtable": "orders", "table": "events"},
            "options dbtable='orders' and table='events' disagree; give one of them",
        ),
        ({"dbtable": "t", "mode": "merge"}, "option mode='merge' is not supported; use append or"),
        ({"dbtable": "t", "mode": "upsert"}, "option mode=upsert needs option keyColumns"),
        ({"dbtable": "t", "keyColumns": "id"}, "option keyColumns is only used with mode=upsert"),
        (
            {"dbtable": "t", "mode": "append", "keyColumns": "id"},
            "option keyColumns is only used with mode=upsert",
        ),
        ({"dbtable": "t", "mode": "upsert", "keyColumns": "a,,b"}, "distinct, non-empty column"),
        ({"dbtable": "t", "mode": "upsert", "keyColumns": "a, a"}, "distinct, non-empty column"),
        ({"dbtable": "orders", "badRecords": "orders"}, "names the target table"),
        ({"dbtable": "t", "badRecords": "s.bad"}, "no schema: it lives in the target's"),
        ({"dbtable": "t", "badRecords": "/tmp/bad"}, "plain name of a dead-letter table"),
        ({"dbtable": "t", "badRecords": "b" * 65}, "plain name of a dead-letter table"),
        ({"dbtable": "t", "socketTimeout": "-1"}, "socketTimeout=-1.0 must be 0 or more"),
        ({"dbtable": "t", "socketTimeout": "soon"}, "socketTimeout='soon' is not a number"),
        (
            {"dbtable": "t", "connectRetrySeconds": "-2"},
            "connectRetrySeconds=-2.0 must be 0 or more",
        ),
        ({"dbtable": "t", "createTable": "maybe"}, "createTable"),
        ({"dbtable": "t", "batchsize": "0"}, "option batchsize=0 must be at least 1"),
    ],
)
def test_both_sinks_refuse_the_same_options_with_the_same_message(
    sink: str, options: dict[str, str], message: str
) -> None:
    with pytest.raises(TwoPhaseConfigError, match=re.escape(message)) as info:
        settings(sink, **options)
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("sink", SINKS)
def test_both_sinks_read_the_shared_options_alike(sink: str) -> None:
    both = {"dbtable": "s.orders", "table": "s.orders"}
    for given in ({"dbtable": "s.orders"}, {"table": "s.orders"}, both):
        s = settings(sink, **given)
        assert (s.schema, s.table) == ("s", "orders")
    upsert = settings(sink, dbtable="t", mode=" UPSERT ", keyColumns=' "id", `day` ')
    assert (upsert.mode, upsert.keyColumns) == ("upsert", ("id", "day"))
    for fail in ("fail", "FAIL", " fail "):
        assert settings(sink, dbtable="t", badRecords=fail).badRecords is None
    timed = settings(sink, dbtable="t", connectRetrySeconds="0.5", socketTimeout="0")
    assert (timed.connectRetrySeconds, timed.socketTimeout) == (0.5, 0)
    plain = settings(sink, dbtable="t")
    assert (plain.mode, plain.keyColumns, plain.createTable) == ("append", (), False)
    assert (plain.connectRetrySeconds, plain.socketTimeout, plain.badRecords) == (30, 120, None)


@pytest.mark.parametrize("sink", SINKS)
def test_both_sinks_refuse_key_columns_the_stream_does_not_have_before_connecting(
    sink: str,
) -> None:
    s = settings(sink, dbtable="t", mode="upsert", keyColumns="id,day")
    validate = pgValidate if sink == "postgres" else lambda s, schema: sqlValidate(s, schema, "s")
    with pytest.raises(TwoPhaseConfigError, match=re.escape("keyColumns names ['day'], which")):
        validate(s, pa.schema([("id", pa.int64()), ("v", pa.string())]))


def test_postgres_takes_sparks_batchsize_for_its_upsert_statements_too() -> None:
    assert settings("postgres", dbtable="t").upsertBatchRows == 20000
    assert settings("postgres", dbtable="t", batchsize="500").upsertBatchRows == 500
    assert settings("postgres", dbtable="t", upsertBatchRows="500").upsertBatchRows == 500
    both = settings("postgres", dbtable="t", batchsize="500", upsertBatchRows="500")
    assert both.upsertBatchRows == 500
    with pytest.raises(TwoPhaseConfigError, match="options batchsize='5' and upsertBatchRows="):
        settings("postgres", dbtable="t", batchsize="5", upsertBatchRows="500")


def test_each_dialect_names_a_dead_letter_table_as_its_database_does() -> None:
    assert settings("postgres", dbtable="t", badRecords="Bad_Rows").badRecords == "bad_rows"
    assert settings("sql", dbtable="t", badRecords="Bad_Rows").badRecords == "Bad_Rows"
    assert settings("sql", dbtable="t", badRecords="b" * 64).badRecords == "b" * 64
    with pytest.raises(TwoPhaseConfigError, match="at most 63"):
        settings("postgres", dbtable="t", badRecords="b" * 64)


@pytest.mark.parametrize("sink", SINKS)
def test_settings_built_directly_check_mode_and_keys_too(sink: str) -> None:
    s = settings(sink, dbtable="t", mode="upsert", keyColumns="id")
    with pytest.raises(TwoPhaseConfigError, match="only used with mode=upsert"):
        type(s)(**{**vars(s), "mode": "append"})


# -- transaction names: written per sink, read by both, recovery and doctor ------------------

CONTEXT = TransactionContext("tp-0123456789ab", "query", 7, 3, 1, "9f8e7d6c")
NEW_NAME = {"postgres": gidFor, "sql": lambda ctx: xidFor(ctx, 64)}


@pytest.mark.parametrize(
    ("written", "run", "nonce"),
    [
        ("tp1:tp-0123456789ab:b7:p3:a1:r9f8e7d6c:0a1b2c3d", "9f8e7d6c", "0a1b2c3d"),  # postgres
        ("tp1:tp-0123456789ab:b7:p3:a1:r:0a1b2c3d", "", "0a1b2c3d"),  # postgres, no run id
        ("tp1:tp-0123456789ab:b7:p3:a1:0a1b2c3d", None, "0a1b2c3d"),  # sql
    ],
)
def test_names_in_existing_logs_and_servers_still_parse_and_print_the_same(
    written: str, run: str | None, nonce: str
) -> None:
    name = TransactionName.parse(written)
    assert name is not None and str(name) == written
    assert (name.sinkId, name.batchId, name.partitionId, name.attempt) == (CONTEXT.sinkId, 7, 3, 1)
    assert (name.run, name.nonce) == (run, nonce)
    assert taskOf(written) == {"batchId": 7, "partitionId": 3, "attempt": 1}  # found handles


@pytest.mark.parametrize("sink", NEW_NAME)
def test_a_new_name_parses_back_and_its_prefixes_select_one_sink_and_one_batch(sink: str) -> None:
    name = NEW_NAME[sink](CONTEXT)
    text = str(name)
    assert TransactionName.parse(text) == name
    assert text.startswith(sinkPrefix(CONTEXT.sinkId) + "b7:p3:a1:")
    assert text.startswith(batchPrefix(CONTEXT.sinkId, 7))
    assert not text.startswith(sinkPrefix("tp-0123456789a"))  # no sink id prefixes another's
    assert not text.startswith(batchPrefix(CONTEXT.sinkId, 70))
    assert str(NEW_NAME[sink](CONTEXT)) != text  # a retried attempt never collides
    assert (name.run is None) == (sink == "sql")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "other",
        "tp1:x",
        "1_abc_def",
        "tp1:s:b1:p0:a0:zz",
        "tp1:sink:b1:p2:a3:rrun:zz",
        "tp2:sink:b1:p2:a3:r:ab",
        "tp1:sink:b1:p2:a3:r:0a1b2c3d:extra",
    ],
)
def test_names_of_others_do_not_parse(text: str) -> None:
    assert TransactionName.parse(text) is None and taskOf(text) == {}


# -- idle sessions ------------------------------------------------------------------------------


def test_idle_sessions_are_kept_per_key_up_to_the_limit_and_drained() -> None:
    pool: IdleSessions[str, object] = IdleSessions(maxIdle=2)
    first, second, third = object(), object(), object()
    assert pool.keep("a", first) and pool.keep("a", second) and not pool.keep("a", third)
    assert pool.keep("b", third) and pool.count("a") == 2
    assert pool.take("a") is second and pool.take("c") is None
    assert sorted(map(id, pool.drain())) == sorted(map(id, [first, third]))
    assert pool.count("a") == pool.count("b") == 0


def test_a_forked_process_never_reuses_nor_drops_its_parents_sessions() -> None:
    """Both sinks alike: a child gets no session of its parent's, and keeps referring to them,
    so that collecting them cannot close the parent's connections."""
    pool: IdleSessions[str, object] = IdleSessions()
    parents = object()
    pool.keep("a", parents)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        ok = pool.take("a") is None and pool.drain() == [] and parents in pool._inherited
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert pool.take("a") is parents  # the parent's pool is untouched


# -- a refused row ------------------------------------------------------------------------------

REJECTIONS = {"postgres": pgRejections, "sql": sqlRejections}


@pytest.mark.parametrize("sink", REJECTIONS)
@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("null", ["NULLs of column v upstream", "df.na.drop(subset=['v'])", "take NULL (ALTER"]),
        ("tooLong", ["widen", "ALTER TABLE s.t", "truncate the value upstream"]),
        ("duplicate", ["deduplicate the key upstream", "mode=upsert and keyColumns"]),
        ("check", ["filter the rows that break constraint c upstream"]),
        ("foreignKey", ["write the rows constraint c refers to first"]),
        ("outOfRange", ["widen the type of v"]),
        ("", ["fix the value upstream"]),
    ],
)
def test_both_sinks_give_the_same_fix_for_each_kind_of_refused_row(
    sink: str, kind: str, words: list[str]
) -> None:
    rejection = Rejection("code 1", kind, "refused", column="v", constraint="c", row=3)
    fix = REJECTIONS[sink].fixFor(rejection, "s.t")
    for word in words:
        assert word in fix
    told = REJECTIONS[sink].describe(rejection, 2)
    assert (
        told == "row 3 of partition 2 (counting from 0), column v: refused (code 1; constraint c)"
    )


def test_a_null_in_a_column_the_server_does_not_name_still_gets_the_null_fix() -> None:
    for module in REJECTIONS.values():
        fix = module.fixFor(Rejection("code 1", "null", "refused"), "t")
        assert "NULLs of the column upstream" in fix and "<column>" in fix
