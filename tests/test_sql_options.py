"""The sql sink without a server: options, transaction ids, statements, handles."""

from __future__ import annotations

import pytest
from sqlalchemy.dialects import mysql, postgresql

from twophase.protocol import TransactionContext
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.relational.naming import TransactionName
from twophase.sinks.sql import SAFE_OPTIONS, SqlSettings, XidTooLongError, publicOptionValue
from twophase.sinks.sql.dialect import checkXidRoom, insertStatement, xidFor
from twophase.sinks.sql.handles import checkHandle, taskHandle

URL = "mysql+pymysql://app:pw%40x@db:3306/shop"


def test_settings_read_spark_style_options_and_override_the_url() -> None:
    s = SqlSettings.fromOptions(
        {"url": URL, "dbtable": "sales.events", "batchsize": "50", "user": "other",
         "password": "new", "mode": "UPSERT", "keyColumns": "id, day"}
    )  # fmt: skip
    assert (s.schema, s.table, s.batchsize, s.mode) == ("sales", "events", 50, "upsert")
    assert s.keyColumns == ("id", "day")
    assert (s.url.username, s.url.password, s.family) == ("other", "new", "mysql")
    assert s.publicUrl == "mysql+pymysql://other@db:3306/shop"
    assert s.socketTimeout == 120  # a bound by default, above InnoDB's 50 s lock wait
    assert (
        SqlSettings.fromOptions({"url": URL, "dbtable": "t", "socketTimeout": "0"}).socketTimeout
        == 0
    )
    pg = SqlSettings.fromOptions({"url": "postgresql+psycopg://u@h/db", "table": "t"})
    assert (pg.family, pg.schema, pg.table) == ("postgresql", None, "t")
    assert s.badRecords is None and pg.badRecords is None  # a rejected row fails the batch
    dead = SqlSettings.fromOptions({"url": URL, "table": "s.t", "badRecords": "t_rejected"})
    assert (dead.badRecords, dead.schema) == ("t_rejected", "s")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dbtable": "t"}, "option url is required"),
        ({"url": "nonsense", "dbtable": "t"}, "SQLAlchemy URL"),
        ({"url": "sqlite:///x.db", "dbtable": "t"}, "not supported"),
        ({"url": URL, "dbtable": "a.b.c"}, "<schema>.<table>"),
        ({"url": URL, "dbtable": "t", "batchsize": "0"}, "batchsize"),
        ({"url": URL, "dbtable": "t", "markerTable": "a b"}, "markerTable"),
        (
            {"url": URL, "dbtable": "t", "badRecords": "twophase_sql_commits"},
            "badRecords=twophase_sql_commits names the marker table",
        ),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(TwoPhaseConfigError, match=message):
        SqlSettings.fromOptions(options)


def test_the_persisted_url_has_no_password_nor_secret_parameters() -> None:
    text = URL + "?charset=utf8mb4&passwd=zz&ssl_key=/k.pem"
    assert publicOptionValue("url", text) == "mysql+pymysql://app@db:3306/shop?charset=utf8mb4"
    assert publicOptionValue("url", "not a url") is None
    assert "password" not in SAFE_OPTIONS
    assert "badrecords" in SAFE_OPTIONS  # a table's name: kept, and shown unredacted in logs


def test_xids_leave_out_the_run_and_fit_a_64_byte_gtrid() -> None:
    ctx = TransactionContext("tp-0123456789ab", "q", 12, 3, 1, "run1")
    xid = xidFor(ctx, 64)
    assert xid.run is None and ":r" not in str(xid) and len(str(xid)) <= 64
    assert TransactionName.parse(str(xid)) == xid


def test_a_sink_id_too_long_for_a_64_byte_gtrid_is_refused_with_the_longest_allowed() -> None:
    checkXidRoom("s" * 24, 64)
    with pytest.raises(XidTooLongError, match="at most 24 characters"):
        checkXidRoom("s" * 25, 64)
    checkXidRoom("s" * 48, 199)  # PostgreSQL's gids are long enough for any sink id
    with pytest.raises(XidTooLongError):
        xidFor(TransactionContext("s" * 40, "q", 10**15, 0, 0), 64)


def test_insert_statements_per_family() -> None:
    m, p = mysql.dialect(), postgresql.dialect()
    assert insertStatement(m, "mysql", "`t`", ["id", "v"], "append", ()) == (
        "INSERT INTO `t` (id, v) VALUES (%s, %s)"
    )
    assert insertStatement(m, "mysql", "`t`", ["id", "v"], "upsert", ("id",)).endswith(
        "ON DUPLICATE KEY UPDATE v = VALUES(v)"
    )
    assert insertStatement(p, "postgresql", "t", ["id", "v"], "upsert", ("id",)).endswith(
        "ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v"
    )
    assert "`select` = VALUES(`select`)" in insertStatement(
        m, "mysql", "`t`", ["id", "select"], "upsert", ("id",)
    )  # a reserved word is quoted
    assert insertStatement(p, "postgresql", "t", ["id"], "upsert", ("id",)).endswith(
        "ON CONFLICT (id) DO NOTHING"
    )


def test_handles_carry_no_password_and_bad_ones_are_refused() -> None:
    s = SqlSettings.fromOptions({"url": URL, "dbtable": "t"})
    ctx = TransactionContext("tp-1", "q", 1, 0, 0)
    handle = taskHandle(ctx, s, str(xidFor(ctx, 64)), 5)
    assert "pw" not in str(handle) and checkHandle(handle) is handle
    with pytest.raises(ValueError, match="bad xid"):
        checkHandle({**handle, "xid": "x"})
    with pytest.raises(ValueError, match="not an sql handle"):
        checkHandle({**handle, "kind": "postgres"})
