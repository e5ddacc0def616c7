"""The sql sink on MariaDB over TLS as an ordinary user: least privileges, and TLS's bad input.

A user with exactly the grants docs/security.md lists is made over TWOPHASE_MARIADB_TLS_URL; a
task prepares an XA transaction and the driver, connected apart, lists (``XA RECOVER``) and
commits it; then each grant is taken away in turn and the driver's check before a batch names
it, the user and the GRANT, with nothing written. A CA that did not sign the server, an expired
server certificate (its file swapped and ``FLUSH SSL``), another host name and a wrong password
fail at once (never retried), naming the server, the CA and the fix. ``twophase doctor`` names
a missing grant. No Spark.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa

from integration_tests.checkpoints import SinkCheckpoint
from integration_tests.conftest import service_setting
from integration_tests.tls_files import expiredCertificate, otherCa, resolvesHere
from twophase import cli
from twophase.failures.codes import CODES, declaredCode
from twophase.protocol import RecoveryScope, TransactionContext
from twophase.resources import Resources
from twophase.sinks.relational.naming import sinkPrefix
from twophase.sinks.sql.committer import SqlCommitter
from twophase.sinks.sql.dialect import markerTable
from twophase.sinks.sql.errors import SqlSinkError
from twophase.sinks.sql.schema import validateTarget
from twophase.sinks.sql.settings import SqlSettings
from twophase.sinks.sql.writer import SqlWriter

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
SINK = f"sec{uuid.uuid4().hex[:6]}"


class Least:
    """A table and a user with exactly the documented grants, made over TLS."""

    def __init__(self, admin: sa.Connection, url: sa.URL) -> None:
        self.admin = admin
        tag = uuid.uuid4().hex[:8]
        self.table, self.user, self.password = f"sec_{tag}", f"tpl_{tag}", uuid.uuid4().hex
        self.db = str(url.database)
        self.url = url.set(username=self.user, password=self.password)

    def options(self, **more: str) -> dict[str, str]:
        return {
            "url": self.url.render_as_string(hide_password=False),
            "dbtable": self.table,
            "markerTable": f"{self.table}_commits",
            "connectRetrySeconds": "30",
            **more,
        }

    def sql(self, statement: str) -> None:
        self.admin.exec_driver_sql(
            statement.format(d=self.db, t=self.table, u=f"'{self.user}'@'127.0.0.1'")
        )


@pytest.fixture(scope="module")
def least() -> Iterator[Least]:
    text = service_setting("TWOPHASE_MARIADB_TLS_URL")
    if not text:
        pytest.fail("TWOPHASE_MARIADB_TLS_URL is unset: run services/services.sh up", pytrace=False)
    url = sa.make_url(text)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as admin:
        made = Least(admin, url)
        made.sql(f"CREATE USER {{u}} IDENTIFIED BY '{made.password}' REQUIRE SSL")
        made.sql("CREATE TABLE `{d}`.`{t}` (id BIGINT PRIMARY KEY, v TEXT) ENGINE=InnoDB")
        # MariaDB gives the creator of a table no privilege on it: an administrator makes the
        # marker table (the sink's own definition) and grants on it.
        markerTable(f"{made.table}_commits").create(admin)
        made.sql("GRANT INSERT, SELECT, UPDATE ON `{d}`.`{t}` TO {u}")
        made.sql("GRANT INSERT, SELECT, DELETE ON `{d}`.`{t}_commits` TO {u}")
        admin.exec_driver_sql("SET SESSION lock_wait_timeout = 10")
        yield made
        # A prepared XA transaction of a failed test would hold the tables' metadata locks.
        for row in admin.exec_driver_sql("XA RECOVER").mappings():
            gtrid = bytes(row["data"][: int(row["gtrid_length"])]).decode()
            if gtrid.startswith(sinkPrefix(SINK)):
                admin.exec_driver_sql(f"XA ROLLBACK '{gtrid}'")
        made.sql("DROP TABLE IF EXISTS `{d}`.`{t}`, `{d}`.`{t}_commits`, `{d}`.`{t}_events`")
        made.sql("DROP USER {u}")


def refusal(options: dict[str, str]) -> str:
    with pytest.raises(SqlSinkError) as caught:
        validateTarget(SqlSettings.fromOptions(options), SCHEMA, SINK)
    code = declaredCode(caught.value)
    assert code == "TWOPHASE_CREDENTIALS" and not CODES[code].recoverable
    return str(caught.value)


def test_least_user_prepares_and_the_driver_commits(least: Least) -> None:
    settings = SqlSettings.fromOptions(least.options(mode="upsert", keyColumns="id"))
    validateTarget(settings, SCHEMA, SINK)
    writer = SqlWriter(settings)
    txn = writer.beginTransaction(TransactionContext(SINK, "q", 1, 0, 0, "run1"))
    try:
        writer.write(txn, pa.record_batch([pa.array([1, 2]), pa.array(["a", "b"])], SCHEMA))
        handle = writer.preCommit(txn)
    except Exception:
        writer.abortTransaction(txn)  # its open XA transaction would lock the table
        raise
    committer = SqlCommitter(settings)
    listed = [p.name for p in committer.listPrepared(RecoveryScope(SINK, None))]
    assert handle["xid"] in listed  # XA RECOVER needs no privilege on MariaDB 10.11
    committer.commit(handle)
    rows = least.admin.exec_driver_sql(f"SELECT id, v FROM `{least.table}` ORDER BY id").all()
    assert [tuple(r) for r in rows] == [(1, "a"), (2, "b")]


@pytest.mark.parametrize(
    ("privilege", "on", "options"),
    [
        ("INSERT", "`{d}`.`{t}`", {}),
        ("UPDATE", "`{d}`.`{t}`", {"mode": "upsert", "keyColumns": "id"}),
        ("SELECT", "`{d}`.`{t}`", {"mode": "upsert", "keyColumns": "id"}),
        ("INSERT", "`{d}`.`{t}_commits`", {}),
        ("SELECT", "`{d}`.`{t}_commits`", {}),
        ("DELETE", "`{d}`.`{t}_commits`", {}),
    ],
)
def test_each_missing_grant_is_named(
    least: Least, privilege: str, on: str, options: dict[str, str]
) -> None:
    least.sql(f"REVOKE {privilege} ON {on} FROM {{u}}")
    try:
        said = refusal(least.options(**options))
        assert f"lacks {privilege} on table" in said and least.user in said
        assert f"GRANT {privilege} ON " in said and "Nothing was written" in said
    finally:
        least.sql(f"GRANT {privilege} ON {on} TO {{u}}")


def test_create_table_needs_create(least: Least) -> None:
    said = refusal(least.options(dbtable=f"{least.table}_new", createTable="true"))
    # the database's name may be masked: the project's test user has it as its password
    assert "CREATE on database" in said and "GRANT CREATE ON `" in said and "`.* TO" in said


def test_tls_bad_input_fails_at_once_naming_server_and_ca(least: Least, tmp_path: Path) -> None:
    ca = otherCa(tmp_path)
    wrongCa = least.url.update_query_dict({"ssl_ca": str(ca)})
    said = refusal(least.options(url=wrongCa.render_as_string(hide_password=False)))
    assert str(ca) in said and "127.0.0.1" in said and "over TLS" in said
    said = refusal(least.options(password="not-the-password"))
    assert "refused the login" in said and least.user in said and "not-the-password" not in said


@contextmanager
def serverPresenting(certificate: str) -> Iterator[None]:
    """The MariaDB server presents ``certificate`` (for its own key) to new TLS sessions, then
    its own again: its certificate file swapped and ``FLUSH SSL`` (RELOAD, which the project's
    own user has)."""
    admin = sa.create_engine(
        str(service_setting("TWOPHASE_MARIADB_URL")), poolclass=sa.pool.NullPool
    )
    with admin.connect() as conn:
        path = Path(str(conn.exec_driver_sql("SELECT @@ssl_cert").scalar()))
        own = path.read_bytes()
        path.write_bytes(Path(certificate).read_bytes())
        try:
            conn.exec_driver_sql("FLUSH SSL")
            yield
        finally:
            path.write_bytes(own)
            conn.exec_driver_sql("FLUSH SSL")


def test_an_expired_server_certificate_and_another_host_name_are_named(
    least: Least, tmp_path: Path
) -> None:
    ca = str(least.url.query["ssl_ca"])
    admin = sa.create_engine(
        str(service_setting("TWOPHASE_MARIADB_URL")), poolclass=sa.pool.NullPool
    )
    with admin.connect() as conn:
        key = str(conn.exec_driver_sql("SELECT @@ssl_key").scalar())
    cert, _ = expiredCertificate(tmp_path, ca, "localhost", key)
    with serverPresenting(cert):
        Resources.ofProcess().close()  # a new process: no session pooled by the tests before
        started = time.monotonic()
        said = refusal(least.options())
        assert time.monotonic() - started < 10  # once, not retried
    assert f"over TLS: the server's certificate has expired, though the CA in {ca}" in said, said
    assert "Fix: have the server's certificate renewed" in said
    validateTarget(SqlSettings.fromOptions(least.options()), SCHEMA, SINK)  # its own again
    elsewhere = resolvesHere()
    if elsewhere is None:
        pytest.skip("this machine's host name does not resolve to 127.0.0.1")
    other = least.url.set(host=elsewhere).render_as_string(hide_password=False)
    said = refusal(least.options(url=other))
    assert f"is not for the name '{elsewhere}'" in said and "Hostname mismatch" in said, said
    assert "Fix: connect by a name the certificate holds" in said


def test_doctor_checks_the_grants(
    least: Least, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from twophase.spark.declared import SqlSink

    def doctor() -> tuple[int, dict[str, Any]]:
        query = SinkCheckpoint(SqlSink(options), tmp_path / "ckpt")
        status = cli.main(
            ["doctor", "--checkpoint", str(query.path), "--json"]
            + ["--sink-option", f"password={least.password}"]
        )
        [report] = json.loads(capsys.readouterr().out)["sinks"]
        return status, report

    options = {**least.options(), "checkpointLocation": str(tmp_path / "ckpt"), "sinkId": SINK}
    options["url"] = least.url.render_as_string(hide_password=True).replace(":***@", "@")
    status, report = doctor()
    assert status == 0 and report["grantsMissing"] is False, report
    least.sql("REVOKE DELETE ON `{d}`.`{t}_commits` FROM {u}")
    try:
        status, report = doctor()
    finally:
        least.sql("GRANT DELETE ON `{d}`.`{t}_commits` TO {u}")
    assert status == 1 and report["grantsMissing"] is True, report
    # the database's name may be masked: the project's test user has it as its password
    assert "GRANT DELETE ON `" in report["grants"]
    assert f"`.`{least.table}_commits` TO" in report["grants"]
    assert least.password not in json.dumps(report)


ROWS, ROWS_PER_BATCH = 40, 10


@pytest.mark.timeout(600)
def test_postgres_and_mariadb_exactly_once_through_a_driver_kill(
    least: Least, tmp_path: Path
) -> None:
    """One ``twophase.multi`` query into both servers over TLS, each as its least-privileged
    role: the driver is SIGKILLed after deciding batch 1, the restart commits it as the same
    role (PostgreSQL's COMMIT PREPARED takes no other) and writes the rest, every row once."""
    from integration_tests.spark_harness import Harness
    from integration_tests.test_postgres_secured import leastRole

    pgUrl = service_setting("TWOPHASE_PG_TLS_URL")
    assert pgUrl, "TWOPHASE_PG_TLS_URL is unset: run services/services.sh up"
    least.sql("CREATE TABLE `{d}`.`{t}_events` (id BIGINT, payload TEXT) ENGINE=InnoDB")
    least.sql("GRANT INSERT ON `{d}`.`{t}_events` TO {u}")
    with leastRole(pgUrl) as pg:
        pg.sql("CREATE TABLE {s}.events (id bigint, payload text)")
        pg.sql("GRANT INSERT ON {s}.events TO {r}")
        targets = {
            "pg": ("postgres", {**pg.options(), "dbtable": f"{pg.schema}.events"}),
            "maria": (
                "twophase.spark.declared:SqlSink",
                {**least.options(), "dbtable": f"{least.table}_events"},
            ),
        }
        options = {"targets": ",".join(f"{n}={kind}" for n, (kind, _) in targets.items())}
        for name, (_, own) in targets.items():
            options |= {f"{name}.{key}": value for key, value in own.items()}
        options["pg.commitMode"] = "prepared"
        query = Harness(
            tmp_path / "query",
            "local",
            sink="twophase.spark.multi:MultiSink",
            rows=ROWS,
            rowsPerBatch=ROWS_PER_BATCH,
            columns={name: "struct(id, payload)" for name in targets},
            options=options,
        )
        query.crashRun("driver.afterDecision:1")
        query.restartUntilExhausted()
        pgIds = pg.admin.execute(f"SELECT id FROM {pg.schema}.events ORDER BY id").fetchall()
        mariaIds = least.admin.exec_driver_sql(
            f"SELECT id FROM `{least.table}_events` ORDER BY id"
        ).all()
        assert [r[0] for r in pgIds] == list(range(ROWS))
        assert [r[0] for r in mariaIds] == list(range(ROWS))
        for secret in (pg.password, least.password):
            assert not [p for p in query.workdir.rglob("*.json") if secret in p.read_text()]
