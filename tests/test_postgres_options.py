"""The postgres sink's pure logic, no server: gids, options, what sink.json keeps, Arrow ->
PostgreSQL text, types.

What needs a real PostgreSQL (COPY, PREPARE, COMMIT PREPARED, recovery, validation against the
catalog) is in integration_tests/test_postgres_participant.py.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import pickle
from pathlib import Path

import pyarrow as pa
import pytest
from psycopg import sql

import twophase
from twophase.clients.postgres import ConnectionTarget, publicConninfo
from twophase.protocol import TransactionContext
from twophase.redaction import publicOptions, redact
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.postgres import (
    SAFE_OPTIONS,
    PostgresCommitter,
    PostgresSettings,
    PostgresWriter,
    lastPerKey,
    parseTableName,
    publicOptionValue,
)
from twophase.sinks.postgres.dialect import MAX_GID_BYTES, gidFor
from twophase.sinks.postgres.encoding import arrayLiteral, byteaHex, csvChunk
from twophase.sinks.postgres.handles import checkHandle, stagedHandle
from twophase.sinks.postgres.staging import StagingNames, moveStatement
from twophase.sinks.postgres.types import ColumnInfo, columnProblem, unsupportedProblem
from twophase.sinks.relational.naming import TransactionName, runTag

URL = "postgresql://alice:s3cret-pw@db.example:5433/sales?sslmode=require"


def ctx(sinkId: str = "tp-0123456789ab", batch: int = 7, part: int = 3, attempt: int = 1,
        run: str = "9f8e7d6c") -> TransactionContext:  # fmt: skip
    return TransactionContext(sinkId, "query", batch, part, attempt, run)


# -- gids -------------------------------------------------------------------------------------


def test_gid_encodes_sink_batch_partition_attempt_and_run_and_parses_back() -> None:
    gid = gidFor(ctx())
    text = str(gid)
    assert text.startswith("tp1:tp-0123456789ab:b7:p3:a1:r9f8e7d6c:")
    assert TransactionName.parse(text) == gid


def test_longest_gid_stays_under_the_postgres_limit() -> None:
    longest = ctx(sinkId="s" * 48, batch=2**63 - 1, part=2**31 - 1, attempt=2**31 - 1, run="r" * 99)
    assert len(str(gidFor(longest)).encode()) <= MAX_GID_BYTES


def test_run_ids_that_are_long_or_unusual_are_hashed() -> None:
    assert runTag("abc123") == "abc123"
    assert runTag("") == ""
    tag = runTag("run id/with:odd chars")
    assert tag.isalnum() and len(tag) <= 16
    assert runTag("run id/with:odd chars") == tag


def test_gid_is_not_mistaken_for_psycopg_xa_format() -> None:
    import psycopg

    gid = str(gidFor(ctx(sinkId="1_2")))
    assert psycopg.Xid.from_string(gid).format_id is None


# -- options ----------------------------------------------------------------------------------


def test_url_is_split_into_a_target_without_password() -> None:
    settings = PostgresSettings.fromOptions({"url": URL, "table": "Sales.Orders"})
    target = settings.target.toJson()
    assert target["host"] == "db.example" and target["port"] == "5433"
    assert target["dbname"] == "sales" and target["user"] == "alice"
    assert target["sslmode"] == "require" and target["application_name"] == "twophase"
    assert "password" not in target
    assert dict(settings.secrets) == {"password": "s3cret-pw"}
    assert (settings.schema, settings.table) == ("sales", "orders")
    for text in (repr(settings), settings.target.describe(), repr(settings.target)):
        assert "s3cret" not in text


@pytest.mark.parametrize("cls", [PostgresWriter, PostgresCommitter])
def test_writer_and_committer_pickle_and_repr_without_the_password_in_text(
    cls: type[PostgresWriter] | type[PostgresCommitter],
) -> None:
    half = cls.fromOptions({"url": URL, "table": "t"})
    assert "s3cret" not in repr(half)
    clone = pickle.loads(pickle.dumps(half))
    assert clone.settings.target == half.settings.target


def test_options_override_the_url_and_pass_libpq_keywords() -> None:
    settings = PostgresSettings.fromOptions(
        {
            "url": "jdbc:postgresql://h/db",
            "table": "t",
            "user": "bob",
            "password": "pw",
            "sslmode": "verify-full",
            "connectTimeout": "3",
            "pg.keepalives_idle": "30",
        }
    )
    target = settings.target.toJson()
    assert target["user"] == "bob" and target["sslmode"] == "verify-full"
    assert target["connect_timeout"] == "3" and target["keepalives_idle"] == "30"
    assert dict(settings.secrets) == {"password": "pw"}


def test_conninfo_strings_work_too() -> None:
    settings = PostgresSettings.fromOptions(
        {"url": "host=h port=5 dbname=d user=u password=x", "table": "t"}
    )
    assert settings.target.describe() == "u@h:5/d"


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"table": "t"}, ["url"]),
        ({"url": "postgresql://h", "table": "t"}, ["database"]),
        ({"url": URL, "table": "a.b.c"}, ["dbtable", "3 parts"]),
        ({"url": URL, "table": "t", "createTable": "maybe"}, ["createTable"]),
        ({"url": URL, "table": "t", "connectTimeout": "0"}, ["connectTimeout"]),
        ({"url": URL, "table": "t", "upsertBatchRows": "x"}, ["upsertBatchRows"]),
        ({"url": URL, "table": "t", "commitMode": "xa"}, ["commitMode", "auto", "staged"]),
        ({"url": URL, "table": "t", "maxPreparedPartitions": "-1"}, ["maxPreparedPartitions"]),
        (
            {"url": URL, "table": "t", "commitMode": "staged", "maxPreparedPartitions": "1"},
            ["maxPreparedPartitions", "commitMode=auto"],
        ),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict[str, str], words: list[str]) -> None:
    with pytest.raises(TwoPhaseConfigError) as info:
        PostgresSettings.fromOptions(options)
    for word in words:
        assert word in str(info.value)
    assert "s3cret" not in str(info.value)


def test_a_malformed_url_error_does_not_echo_the_password() -> None:
    with pytest.raises(TwoPhaseConfigError) as info:
        PostgresSettings.fromOptions({"url": "postgresql://u:s3cret@h/db?nosuch=1", "table": "t"})
    assert "url" in str(info.value)
    assert "s3cret" not in str(info.value)


def test_redact_cuts_passwords_out_of_urls_and_conninfo() -> None:
    assert "s3cret" not in redact("bad postgresql://u:s3cret@h/db")
    assert "s3cret" not in redact("host=h password=s3cret user=u")


# -- what sink.json keeps ----------------------------------------------------------------------

PASSWORD_URLS = [
    "postgresql://:s3cret-pw@db.example/sales",
    "postgresql://alice@db.example/sales?password=s3cret-pw",
    "postgresql://alice:s3cret@hidden@db.example/sales",
    "host=db.example password=s3cret-pw dbname=sales user=alice",
]
SECRET_PIECES = ("s3cret", "hidden", "k3y-pass", "0pt-pw")


def sinkJson(options: dict[str, str]) -> dict[str, str]:
    """The options as the binding writes them to sink.json: the sink's public form, redacted."""
    from twophase.spark.declared import PostgresSink

    shown = {
        key: public
        for key, value in options.items()
        if (public := PostgresSink.publicOptionValue(key, value)) is not None
    }
    return publicOptions(shown, PostgresSink.safeOptions)


@pytest.mark.parametrize("url", PASSWORD_URLS)
def test_redacted_options_never_hold_a_url_password_in_any_form(url: str) -> None:
    from twophase.spark.declared import PostgresSink

    options = {
        "url": url,
        "table": "t",
        "password": "0pt-pw",
        "pg.sslpassword": "k3y-pass",
        "sslkey": "/keys/client.key",
    }
    public = publicOptions(options, PostgresSink.safeOptions)
    assert set(public) == {"url", "table"}
    for piece in SECRET_PIECES:
        assert piece not in public["url"], public["url"]


@pytest.mark.parametrize("url", PASSWORD_URLS)
def test_sink_json_keeps_the_url_without_its_password_and_pointing_at_the_same_database(
    url: str,
) -> None:
    public = sinkJson({"url": url, "table": "t", "password": "0pt-pw"})
    assert set(public) == {"url", "table"}
    for piece in (*SECRET_PIECES, "password", "***"):
        assert piece not in public["url"], public["url"]
    settings = PostgresSettings.fromOptions(public)
    assert settings.secrets == ()  # the password comes from PGPASSWORD or ~/.pgpass
    assert settings.target.get("host") == "db.example"
    assert settings.target.get("dbname") == "sales"


@pytest.mark.parametrize("url", PASSWORD_URLS)
def test_a_url_redacted_in_sink_json_reads_back_without_a_password(url: str) -> None:
    """Without the sink's public form, sink.json holds the url redacted: its ``***`` must not
    be sent as a password, so that libpq falls back to PGPASSWORD or ~/.pgpass."""
    from twophase.spark.declared import PostgresSink

    public = publicOptions({"url": url, "table": "t"}, PostgresSink.safeOptions)
    settings = PostgresSettings.fromOptions(public)
    assert settings.secrets == ()
    assert settings.target.get("host") == "db.example"


def test_public_url_drops_secrets_and_keeps_everything_else() -> None:
    public = publicConninfo(f"jdbc:{URL}&sslpassword=k3y-pass&keepalives_idle=30")
    assert public is not None and "s3cret" not in public and "k3y-pass" not in public
    assert PostgresSettings.fromOptions({"url": public, "table": "t"}).target == (
        PostgresSettings.fromOptions({"url": URL, "table": "t", "pg.keepalives_idle": "30"}).target
    )
    assert publicConninfo("host='h dbname=db") is None  # unreadable: left out
    assert publicOptionValue("table", "Sales.Orders") == "Sales.Orders"


def test_a_database_named_like_another_query_s_password_stays_in_the_public_url() -> None:
    """Another query of the process used the password ``ledger-db``; this sink's database of
    that name is still the one sink.json names (not ``***``, which would connect elsewhere)."""
    from twophase.redaction import rememberSecrets

    rememberSecrets({"password": "ledger-db"})
    public = publicConninfo("postgresql://app:pw-13@db.example/ledger-db")
    assert public is not None and "pw-13" not in public
    assert PostgresSettings.fromOptions({"url": public, "table": "t"}).target.get("dbname") == (
        "ledger-db"
    )


def test_a_committer_rebuilt_from_sink_json_reaches_the_same_table_the_same_way() -> None:
    options = {
        "url": URL,
        "table": '"Sales"."Order Lines"',
        "mode": "upsert",
        "keyColumns": "id,day",
        "createTable": "true",
        "user": "bob",
        "password": "0pt-pw",
        "sslmode": "verify-full",
        "sslrootcert": "/certs/root.crt",
        "sslcert": "/certs/client.crt",
        "sslcrl": "/certs/crl.pem",
        "sslpassword": "k3y-pass",
        "applicationName": "orders",
        "targetSessionAttrs": "read-write",
        "connectTimeout": "3",
        "connectRetrySeconds": "5",
        "lockTimeoutSeconds": "7",
        "socketTimeout": "9",
        "upsertBatchRows": "100",
        "pg.keepalives_idle": "30",
        "pg.options": "-c statement_timeout=0",
        "pg.passfile": "/secrets/pgpass",
        "checkpointLocation": "/tmp/ckpt",
    }
    public = sinkJson({key.lower(): value for key, value in options.items()})  # as Spark passes
    for value in public.values():
        for piece in SECRET_PIECES:
            assert piece not in value
    original = PostgresSettings.fromOptions(options)
    rebuilt = PostgresCommitter.fromOptions(public).settings
    assert rebuilt == original  # secrets are not compared
    assert (
        original.socketTimeout,
        PostgresSettings.fromOptions(options | {"socketTimeout": "0"}).socketTimeout,
    ) == (9.0, 0.0)
    assert rebuilt.secrets == () and original.secrets != ()
    assert rebuilt.target.describe() == "bob@db.example:5433/sales"


def test_safe_options_name_no_secret() -> None:
    for name in SAFE_OPTIONS:
        assert name == name.lower()
        for word in ("password", "secret", "sslkey", "token"):
            assert word not in name, name


def test_the_postgres_sink_and_client_import_no_pyspark() -> None:
    root = Path(twophase.__file__).parent
    files = [*(root / "sinks" / "postgres").glob("*.py"), root / "clients" / "postgres.py"]
    assert len(files) > 5
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n.split(".")[0] == "pyspark" for n in names), (path, names)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("orders", ("public", "orders")),
        ("Sales.Orders", ("sales", "orders")),
        ('"Sales"."Order Lines"', ("Sales", "Order Lines")),
        ('s."a.b"', ("s", "a.b")),
        ('s."say ""hi"""', ("s", 'say "hi"')),
    ],
)
def test_table_names_follow_postgres_identifier_rules(text: str, parsed: tuple[str, str]) -> None:
    assert parseTableName(text) == parsed


def test_connection_target_refuses_secrets_and_bad_json() -> None:
    with pytest.raises(ValueError):
        ConnectionTarget((("password", "x"),))
    assert "password" not in ConnectionTarget.fromJson({"host": "h", "password": "x"}).toJson()
    with pytest.raises(ValueError):
        ConnectionTarget.fromJson({"port": 5432})


# -- Arrow -> PostgreSQL text -----------------------------------------------------------------


def test_bytea_hex_is_vectorised_and_keeps_nulls_and_slices() -> None:
    values = pa.array([b"\x00\x01", None, b"", b"\xff\x10"], pa.binary())
    assert byteaHex(values).to_pylist() == ["\\x0001", None, "\\x", "\\xff10"]
    assert byteaHex(values.slice(2)).to_pylist() == ["\\x", "\\xff10"]
    assert byteaHex(pa.array([None, None], pa.binary())).to_pylist() == [None, None]


def test_csv_quotes_strings_so_empty_differs_from_null() -> None:
    batch = pa.record_batch(
        {
            "s": pa.array(['a,"b"\nc\\d\t', "", None]),
            "n": pa.array([1.5, float("nan"), None]),
            "b": pa.array([b"\x01", None, b""]),
        }
    )
    text = csvChunk(batch).to_pybytes().decode()
    assert text == '"a,""b""\nc\\d\t",1.5,"\\x01"\n"",nan,\n,,"\\x"\n'


def test_array_literal_escapes_quotes_and_backslashes_and_marks_nulls() -> None:
    assert arrayLiteral(pa.array(['q"\\', None, "", "NULL"])) == '{"q\\"\\\\",NULL,"","NULL"}'
    assert arrayLiteral(pa.array([1, None], pa.int64())) == '{"1",NULL}'
    assert arrayLiteral(pa.array([], pa.int64())) == "{}"
    stamp = pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 6)], pa.timestamp("us", tz="UTC"))
    assert arrayLiteral(stamp) == '{"2024-01-02 03:04:05.000006"}'  # UTC; the session is UTC
    assert arrayLiteral(pa.array([b"\x0a"])) == '{"\\\\x0a"}'


def test_last_row_of_a_key_wins_and_null_keys_are_kept() -> None:
    batch = pa.record_batch(
        {"k": pa.array([1, 2, 1, None, None, 2]), "v": pa.array(["a", "b", "c", "d", "e", "f"])}
    )
    assert lastPerKey(batch, ("k",)).column("v").to_pylist() == ["c", "d", "e", "f"]
    unique = pa.record_batch({"k": pa.array([1, 2]), "v": pa.array(["a", "b"])})
    assert lastPerKey(unique, ("k",)) is unique


# -- type compatibility -----------------------------------------------------------------------


def column(dataType: str, precision: int | None = None, scale: int | None = None) -> ColumnInfo:
    return ColumnInfo("c", dataType, dataType, True, False, False, precision, scale)


@pytest.mark.parametrize(
    ("arrow", "target", "ok"),
    [
        (pa.int32(), column("bigint"), True),
        (pa.int64(), column("integer"), False),
        (pa.int64(), column("numeric", 20, 0), True),
        (pa.int64(), column("numeric", 10, 0), False),
        (pa.float64(), column("real"), False),
        (pa.float32(), column("double precision"), True),
        (pa.decimal128(10, 2), column("numeric", 12, 2), True),
        (pa.decimal128(10, 2), column("numeric", 10, 1), False),
        (pa.decimal128(10, 2), column("numeric"), True),
        (pa.string(), column("jsonb"), True),
        (pa.string(), column("integer"), False),
        (pa.binary(), column("bytea"), True),
        (pa.bool_(), column("boolean"), True),
        (pa.date32(), column("date"), True),
        (pa.timestamp("us", tz="UTC"), column("timestamp with time zone"), True),
        (pa.timestamp("us", tz="UTC"), column("timestamp without time zone"), False),
        (pa.timestamp("us"), column("timestamp without time zone"), True),
    ],
)
def test_columns_accept_only_types_that_hold_every_value(
    arrow: pa.DataType, target: ColumnInfo, ok: bool
) -> None:
    problem = columnProblem("c", arrow, target)
    assert (problem is None) == ok, problem
    if problem:
        assert "'c'" in problem and ("alter" in problem or "cast" in problem)


def test_nested_types_are_refused_with_a_fix() -> None:
    problem = unsupportedProblem("tags", pa.list_(pa.string()))
    assert problem is not None and "tags" in problem and "to_json" in problem
    assert unsupportedProblem("d", pa.decimal128(5, 1)) is None


# -- commit paths: which partitions prepare, staging names, staged handles ---------------------


@pytest.mark.parametrize(
    ("options", "serverLimit", "budget"),
    [
        ({}, 100, 50),  # auto: half the server's limit
        ({}, 1, 0),
        ({}, 0, 0),  # no prepared transactions on the server: everything staged
        ({"maxPreparedPartitions": "1"}, 100, 1),
        ({"maxPreparedPartitions": "500"}, 100, 100),  # never beyond the server
        ({"commitMode": "prepared"}, 100, 100),
        ({"commitMode": "STAGED"}, 100, 0),
    ],
)
def test_prepared_budget_follows_commit_mode_and_the_servers_limit(
    options: dict[str, str], serverLimit: int, budget: int
) -> None:
    settings = PostgresSettings.fromOptions({"url": URL, "table": "t", **options})
    assert settings.preparedBudget(serverLimit) == budget


def test_commit_mode_options_are_kept_in_sink_json() -> None:
    assert {"commitmode", "maxpreparedpartitions"} <= SAFE_OPTIONS


def test_staging_tables_sit_next_to_the_target_and_long_names_stay_distinct() -> None:
    short = StagingNames.of(PostgresSettings.fromOptions({"url": URL, "table": 'S."Orders"'}))
    assert (short.schema, short.staging, short.markers) == (
        "s",
        "Orders_twophase_staging",
        "Orders_twophase_commits",
    )
    assert short.stagingText == 's."Orders_twophase_staging"'
    long1, long2 = (
        StagingNames.of(PostgresSettings.fromOptions({"url": URL, "table": "x" * 60 + end}))
        for end in ("a", "b")
    )
    for names in (long1, long2):
        assert len(names.staging.encode()) <= 63 and names.staging.endswith("_twophase_staging")
        assert len(names.markers.encode()) <= 63 and names.markers.endswith("_twophase_commits")
    assert long1.staging != long2.staging and long1.markers != long2.markers


def test_a_staged_handle_is_json_without_secrets_and_checked_before_use() -> None:
    settings = PostgresSettings.fromOptions({"url": URL, "table": "t", "commitMode": "staged"})
    names = StagingNames.of(settings)
    token = str(gidFor(ctx()))
    handle = stagedHandle(
        ctx(), settings, token, ([names.schema, names.staging], [names.schema, names.markers]),
        ["id", "payload"], 3,
    )  # fmt: skip
    assert checkHandle(handle) is handle and StagingNames.fromHandle(handle) == names
    assert "s3cret" not in json.dumps(handle) and handle["keys"] == []
    assert "staged as " + token in PostgresCommitter(settings).describe(handle)
    for broken in (
        {**handle, "token": "tp1:other"},
        {**handle, "path": "elsewhere"},
        {**handle, "columns": []},
        {**handle, "staging": ["public"]},
    ):
        with pytest.raises(ValueError):
            checkHandle(broken)
            StagingNames.fromHandle(broken)


def test_the_move_deletes_one_token_and_keeps_the_last_row_per_key_in_upsert() -> None:
    names = StagingNames("public", "t_twophase_staging", "t_twophase_commits")
    append = moveStatement(names, sql.Identifier("public", "t"), ["id", "v"], []).as_string()
    assert "DELETE FROM" in append and "ON CONFLICT" not in append
    upsert = moveStatement(names, sql.Identifier("public", "t"), ["id", "v"], ["id"]).as_string()
    assert "DISTINCT ON" in upsert and '"__tp_seq" DESC' in upsert
    assert 'ON CONFLICT ("id") DO UPDATE SET "v" = EXCLUDED."v"' in upsert


def test_bad_records_names_a_table_beside_the_target_and_needs_prepared_transactions() -> None:
    def settings(**options: str) -> PostgresSettings:
        return PostgresSettings.fromOptions(
            {"url": "postgresql://u@h/db", "table": "orders", **options}
        )

    assert settings().badRecords is None and settings(badRecords="FAIL").badRecords is None
    chosen = settings(badRecords="Orders_Rejected")
    assert chosen.badRecords == "orders_rejected" and chosen.preparedBudget(100) == 100
    with pytest.raises(TwoPhaseConfigError, match="names the target table"):
        settings(badRecords="ORDERS")  # folded as PostgreSQL folds it: the target itself
    with pytest.raises(TwoPhaseConfigError, match="commitMode=staged has none"):
        settings(badRecords="rejected", commitMode="staged")
    with pytest.raises(TwoPhaseConfigError, match="maxPreparedPartitions does not apply"):
        settings(badRecords="rejected", maxPreparedPartitions="4")
    assert "badrecords" in SAFE_OPTIONS
