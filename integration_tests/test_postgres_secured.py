"""The postgres sink over TLS as an ordinary role: least privileges, and TLS's bad input.

A role with exactly the grants docs/security.md lists is made over TWOPHASE_PG_TLS_URL (a role
that is not a superuser, ``sslmode=verify-full``); a batch is prepared and committed by it;
then each grant is taken away in turn and the driver's check before a batch names it, the role
and the GRANT, with nothing written. ``COMMIT PREPARED`` by another role names both roles.
`twophase doctor` names a missing grant. A CA that did not sign the server, a host name the
certificate does not hold, an expired server certificate (the server's file swapped and
reloaded for a moment) and a wrong password each fail at once (never retried) with an error
naming the server, the CA and the fix. No Spark.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from integration_tests.checkpoints import SinkCheckpoint
from integration_tests.conftest import service_setting
from integration_tests.tls_files import expiredCertificate, otherCa
from twophase import cli
from twophase.clients.postgres import PostgresSinkError
from twophase.clients.postgres_tls import SSL_REQUEST
from twophase.clients.tlsverify import probe
from twophase.failures.codes import CODES, declaredCode
from twophase.protocol import TransactionContext
from twophase.resources import Resources
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.postgres import PostgresCommitter, PostgresSettings, PostgresWriter
from twophase.sinks.postgres.schema import validateTarget

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


@pytest.fixture(scope="module")
def tls_url() -> str:
    url = service_setting("TWOPHASE_PG_TLS_URL")
    if not url:
        pytest.fail(
            "TWOPHASE_PG_TLS_URL is unset: start the servers with services/services.sh up",
            pytrace=False,
        )
    return url


class Least:
    """A schema, a table and a role with exactly the documented grants, made over TLS."""

    def __init__(self, admin: psycopg.Connection, url: str) -> None:
        self.admin = admin
        tag = uuid.uuid4().hex[:8]
        self.schema, self.role, self.password = f"sec_{tag}", f"tp_least_{tag}", uuid.uuid4().hex
        params = conninfo_to_dict(url)
        params.update(user=self.role, password=self.password)
        self.url = make_conninfo(**params)

    def options(self, **more: str) -> dict[str, str]:
        return {"url": self.url, "dbtable": f"{self.schema}.t", "connectRetrySeconds": "2", **more}

    def sql(self, statement: str) -> None:
        self.admin.execute(statement.format(s=self.schema, r=self.role))


@contextmanager
def leastRole(tls_url: str) -> Iterator[Least]:
    """A ``Least`` made over ``tls_url``, dropped afterwards with what it prepared."""
    with psycopg.connect(tls_url, autocommit=True) as admin:
        row = admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        assert row[0] is False, "the TLS URL's role must not be a superuser"
        made = Least(admin, tls_url)
        made.sql(f"CREATE ROLE {{r}} LOGIN PASSWORD '{made.password}'")
        made.sql("CREATE SCHEMA {s}")
        made.sql("CREATE TABLE {s}.t (id bigint PRIMARY KEY, v text)")
        made.sql("GRANT USAGE ON SCHEMA {s} TO {r}")
        made.sql("GRANT INSERT, SELECT, UPDATE ON {s}.t TO {r}")
        yield made
        with psycopg.connect(made.url, autocommit=True) as own:  # only it may finish them
            for (gid,) in own.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE owner = current_user"
            ).fetchall():
                own.execute(f"ROLLBACK PREPARED '{gid}'")
        made.sql("DROP SCHEMA {s} CASCADE")
        made.sql("DROP ROLE {r}")


@pytest.fixture(scope="module")
def least(tls_url: str) -> Iterator[Least]:
    with leastRole(tls_url) as made:
        yield made


def refusal(options: dict[str, str]) -> str:
    """The error of the driver's check before a batch; it carries a fatal code."""
    with pytest.raises(PostgresSinkError) as caught:
        validateTarget(PostgresSettings.fromOptions(options), SCHEMA, "s")
    code = declaredCode(caught.value)
    assert code == "TWOPHASE_CREDENTIALS" and not CODES[code].recoverable
    return str(caught.value)


def test_least_role_prepares_and_commits_as_itself(least: Least, tls_url: str) -> None:
    options = least.options(commitMode="prepared", mode="upsert", keyColumns="id")
    settings = PostgresSettings.fromOptions(options)
    validateTarget(settings, SCHEMA, "s")
    writer = PostgresWriter(settings)
    txn = writer.beginTransaction(TransactionContext("s", "q", 1, 0, 0, "run1"))
    writer.write(txn, pa.record_batch([pa.array([1, 2]), pa.array(["a", "b"])], schema=SCHEMA))
    handle = writer.preCommit(txn)
    assert handle["connection"]["user"] == least.role  # the driver commits as the same role
    row = least.admin.execute(
        "SELECT owner FROM pg_prepared_xacts WHERE gid = %s", (handle["gid"],)
    )
    assert row.fetchone()[0] == least.role
    # Another role's COMMIT PREPARED is refused, naming both roles and the fix.
    other = PostgresCommitter(PostgresSettings.fromOptions({**options, "url": tls_url}))
    wrong = dict(handle, connection=dict(handle["connection"], user=least.admin.info.user))
    with pytest.raises(PostgresSinkError) as caught:
        other.commit(wrong)
    said = str(caught.value)
    assert least.role in said and least.admin.info.user in said and "same user" in said
    assert declaredCode(caught.value) == "TWOPHASE_CREDENTIALS"
    PostgresCommitter(settings).commit(handle)
    rows = least.admin.execute(f"SELECT id, v FROM {least.schema}.t ORDER BY id").fetchall()
    assert rows == [(1, "a"), (2, "b")]


@pytest.mark.parametrize(
    ("revoke", "options", "named"),
    [
        ("REVOKE USAGE ON SCHEMA {s} FROM {r}", {}, "USAGE on schema"),
        ("REVOKE INSERT ON {s}.t FROM {r}", {}, "INSERT on table"),
        ("REVOKE UPDATE ON {s}.t FROM {r}", {"mode": "upsert", "keyColumns": "id"}, "UPDATE on"),
        ("REVOKE SELECT ON {s}.t FROM {r}", {"mode": "upsert", "keyColumns": "id"}, "SELECT on"),
        ("", {"dbtable": "{s}.made", "createTable": "true"}, "CREATE on schema"),
    ],
)
def test_each_missing_grant_is_named(
    least: Least, revoke: str, options: dict[str, str], named: str
) -> None:
    if revoke:
        least.sql(revoke)
    try:
        given = {k: v.format(s=least.schema) for k, v in options.items()}
        said = refusal(least.options(**given))
        assert named in said and least.role in said and "GRANT " in said
        assert "Nothing was written" in said
    finally:
        least.sql("GRANT USAGE ON SCHEMA {s} TO {r}")
        least.sql("GRANT INSERT, SELECT, UPDATE ON {s}.t TO {r}")
    assert least.admin.execute(
        "SELECT to_regclass(%s)", (f"{least.schema}.t_twophase_staging",)
    ).fetchone() == (None,)


def test_staged_mode_with_its_tables_made_by_an_administrator(least: Least) -> None:
    def staged() -> PostgresSettings:
        return PostgresSettings.fromOptions(least.options(commitMode="staged"))

    said = str(pytest.raises(TwoPhaseConfigError, validateTarget, staged(), SCHEMA).value)
    assert "Grant CREATE on schema" in said and least.role in said  # then tried, with the DDL
    least.sql("CREATE TABLE {s}.t_twophase_staging (LIKE {s}.t, __tp_token text, __tp_seq bigint)")
    least.sql(
        "CREATE TABLE {s}.t_twophase_commits (token text PRIMARY KEY, sink_id text, "
        "batch_id bigint, rows bigint, committed_at timestamptz DEFAULT now())"
    )
    try:
        least.sql("GRANT SELECT, INSERT ON {s}.t_twophase_staging, {s}.t_twophase_commits TO {r}")
        said = refusal(least.options(commitMode="staged"))
        assert "DELETE on table" in said and "t_twophase_staging" in said
        least.sql("GRANT DELETE ON {s}.t_twophase_staging, {s}.t_twophase_commits TO {r}")
        validateTarget(staged(), SCHEMA)
    finally:
        least.sql("DROP TABLE {s}.t_twophase_staging, {s}.t_twophase_commits")


def test_tls_bad_input_fails_at_once_naming_server_and_ca(
    least: Least, tls_url: str, tmp_path: Path
) -> None:
    ca = otherCa(tmp_path)
    cases = [
        ({"sslrootcert": ca}, [ca, "did not verify", "127.0.0.1"]),
        ({"pg.host": "wrong.example", "pg.hostaddr": "127.0.0.1"}, ["wrong.example", "host name"]),
        ({"password": "not-the-password"}, ["password authentication failed", least.role]),
    ]
    for override, words in cases:
        options = least.options(connectRetrySeconds="30", **override)
        said = refusal(options)  # at once: no 30 s of retries (the test's time says so)
        for word in words:
            assert word in said, (word, said)
        assert "not-the-password" not in said


def doctorReport(
    sink: object, path: Path, password: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, Any]]:
    """``twophase doctor --json`` over a checkpoint the driver would leave: status, report."""
    query = SinkCheckpoint(sink, path)
    status = cli.main(
        [
            "doctor",
            "--checkpoint",
            str(query.path),
            "--json",
            "--sink-option",
            f"password={password}",
        ]
    )
    [report] = json.loads(capsys.readouterr().out)["sinks"]
    return status, report


def test_doctor_checks_the_grants(
    least: Least, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from twophase.spark.declared import PostgresSink

    options = {**least.options(), "checkpointLocation": str(tmp_path / "ckpt"), "sinkId": "secpg"}
    status, report = doctorReport(PostgresSink(options), tmp_path / "ckpt", least.password, capsys)
    assert status == 0 and report["grantsMissing"] is False, report
    assert "holds every grant" in report["grants"]
    least.sql("REVOKE INSERT ON {s}.t FROM {r}")
    try:
        status, report = doctorReport(
            PostgresSink(options), tmp_path / "ckpt", least.password, capsys
        )
    finally:
        least.sql("GRANT INSERT ON {s}.t TO {r}")
    assert status == 1 and report["grantsMissing"] is True, report
    assert f"GRANT INSERT ON {least.schema}.t TO {least.role}" in report["grants"]
    assert least.password not in json.dumps(report)


def test_an_expired_client_certificate_is_named(least: Least, tmp_path: Path) -> None:
    caFile = conninfo_to_dict(least.url)["sslrootcert"]
    cert, key = expiredCertificate(tmp_path, str(caFile), least.role)
    said = refusal(least.options(sslcert=cert, sslkey=key, connectRetrySeconds="30"))
    assert f"refused the client certificate sslcert={cert}: it has expired" in said, said
    assert str(caFile) in said and "127.0.0.1" in said


@contextmanager
def serverPresenting(certificate: str, caFile: str) -> Iterator[None]:
    """The server presents ``certificate`` (for its own key) to new TLS sessions, then its own
    again: its certificate file swapped and a reload (the project's role may run
    ``pg_reload_conf()``), each awaited by a handshake of our own."""
    with psycopg.connect(str(service_setting("TWOPHASE_PG_URL")), autocommit=True) as admin:
        info = admin.info
        path = Path(str(admin.execute("SHOW ssl_cert_file").fetchone()[0]))
        own = path.read_bytes()

        def present(content: bytes, shows: Any) -> None:
            path.write_bytes(content)
            admin.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 30
            hello = partial(probe, info.host, info.port, caFile, checkHostname=False)
            while not shows(hello(preamble=SSL_REQUEST)):
                assert time.monotonic() < deadline, "the server did not reload its certificate"
                time.sleep(0.1)

        present(Path(certificate).read_bytes(), lambda why: why and "expired" in why)
        try:
            yield
        finally:
            present(own, lambda why: why is None)


def test_an_expired_server_certificate_is_named(least: Least, tmp_path: Path) -> None:
    caFile = str(conninfo_to_dict(least.url)["sslrootcert"])
    with psycopg.connect(str(service_setting("TWOPHASE_PG_URL"))) as admin:
        key = str(admin.execute("SHOW ssl_key_file").fetchone()[0])
    cert, _ = expiredCertificate(tmp_path, caFile, "localhost", key)
    with serverPresenting(cert, caFile):
        Resources.ofProcess().close()  # a new process: no session pooled by the tests before
        started = time.monotonic()
        said = refusal(least.options(connectRetrySeconds="30"))
        assert time.monotonic() - started < 10  # once, not retried
    expired = (
        f"over TLS: the server's certificate has expired, though the CA in sslrootcert={caFile}"
    )
    assert expired in said and "127.0.0.1" in said, said
    assert "Fix: have the server's certificate renewed" in said
    validateTarget(PostgresSettings.fromOptions(least.options()), SCHEMA, "s")  # its own again
