"""No secret reaches the checkpoint or a log line, and ``twophase recover`` still finishes.

Each test runs a real query (real Spark, real PostgreSQL, Kafka, MariaDB or S3) with options
that carry recognisable secrets (the ways of giving PostgreSQL's password, and the S3 sinks,
as targets of one ``twophase.multi`` query), SIGKILLs the driver right after it decided a
batch, finishes that batch with ``twophase recover`` (secrets from the environment or an
option file, never from the checkpoint), then
searches every file under the checkpoint location, the run's output (the driver's, Spark's and
the Python workers' log lines, at DEBUG) and recover's output for the secrets. What a restart
does after ``recover`` is the crash-window suites' business, not repeated here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg
import pytest
from psycopg import sql

from integration_tests.conftest import S3Service

PG_SECRET = "Tp-S3cret-pg-9f4e@x"
"""The role's password: with an '@', which a URL must percent-encode."""
PG_MARK = "S3cret-pg-9f4e"
"""What the password and its percent-encoded form share: never to be found."""
ROWS, ROWS_PER_BATCH = 400, 100


def _secretsIn(root: Path, marks: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        text = path.read_bytes().decode("utf-8", "replace")
        found += [f"{path}: {mark}" for mark in marks if mark in text]
    return found


def _recover(
    checkpoint: Path, env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "twophase", "recover", "--checkpoint", str(checkpoint), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


FORMS = (
    "password-without-user",
    "password-as-query-parameter",
    "password-with-an-at-sign",
    "password-option",
)
"""The ways a PostgreSQL password reaches the sink: one target of the one query each."""


@pytest.fixture
def secretRole(pg_url: str) -> Iterator[tuple[str, list[str]]]:
    """A login role with a recognisable password and one empty table per form it may write:
    (role, tables)."""
    role = f"tp_secret_{uuid.uuid4().hex[:8]}"
    tables = [f"it_secret_{uuid.uuid4().hex[:8]}" for _ in FORMS]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(PG_SECRET)
            )
        )
        for table in tables:
            conn.execute(
                sql.SQL("CREATE TABLE {} (id bigint, payload text)").format(sql.Identifier(table))
            )
            conn.execute(
                sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(
                    sql.Identifier(table), sql.Identifier(role)
                )
            )
    yield role, tables
    where = urlsplit(pg_url)
    asRole = {"host": where.hostname, "port": where.port, "dbname": where.path.lstrip("/")}
    with psycopg.connect(**asRole, user=role, password=PG_SECRET, autocommit=True) as conn:
        # Only the role that prepared a transaction (or a superuser) may roll it back.
        for (gid,) in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE owner = %s", (role,)
        ).fetchall():
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        for table in tables:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _multiQuery(workdir: Path, targets: dict[str, tuple[str, dict[str, str]]]) -> Any:
    """One ``twophase.multi`` query over ``targets`` (name -> kind, options), each target a
    struct of ``id`` and ``payload``: its ``Harness``."""
    from integration_tests.spark_harness import Harness

    options = {"targets": ",".join(f"{name}={kind}" for name, (kind, _) in targets.items())}
    for name, (_, own) in targets.items():
        options |= {f"{name}.{key}": value for key, value in own.items()}
    return Harness(
        workdir,
        "local",
        sink="twophase.spark.multi:MultiSink",
        rows=ROWS,
        rowsPerBatch=ROWS_PER_BATCH,
        columns={name: "struct(id, payload)" for name in targets},
        options=options,
    )


def _urlForms(pg_url: str, role: str) -> dict[str, dict[str, str]]:
    where = urlsplit(pg_url)
    place = f"{where.hostname}:{where.port}{where.path}"
    encoded = quote(PG_SECRET, safe="")
    return {
        "password-without-user": {"url": f"postgresql://:{encoded}@{place}", "user": role},
        "password-as-query-parameter": {
            "url": f"postgresql://{role}@{place}?password={encoded}&sslmode=disable"
        },
        "password-with-an-at-sign": {"url": f"postgresql://{role}:{encoded}@{place}"},
        "password-option": {"url": f"postgresql://{role}@{place}", "password": PG_SECRET},
    }


@pytest.mark.timeout(600)
def test_postgres_passwords_stay_out_of_the_checkpoint_and_the_logs(
    pg_url: str, secretRole: tuple[str, list[str]], tmp_path: Path
) -> None:
    """Every way of giving PostgreSQL's password, one target each of one query: none reaches
    ``sink.json``, a handle or a log line; recover takes it from ``PGPASSWORD``."""
    role, tables = secretRole
    forms = _urlForms(pg_url, role)
    targets = {
        f"t{i}": ("postgres", {**forms[form], "table": table})
        for i, (form, table) in enumerate(zip(FORMS, tables, strict=True))
    }
    query = _multiQuery(tmp_path / "query", targets)
    env = {"TWOPHASE_LOG_LEVEL": "DEBUG"}
    crashed = query.run("driver.afterDecision:1", env=env)
    assert crashed.killed, crashed.describe()

    environment = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    recovered = _recover(query.checkpoint, {**environment, **env, "PGPASSWORD": PG_SECRET})
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert "of 1 decided batches [1]" in recovered.stdout

    with psycopg.connect(pg_url, autocommit=True) as conn:
        for table in tables:
            ids = conn.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(table)))
            held = sorted(r[0] for r in ids)
            assert held == list(range(2 * ROWS_PER_BATCH)), table  # batches 0 and 1, once each

    leaks = _secretsIn(query.workdir, (PG_MARK,))
    output = recovered.stdout + recovered.stderr
    assert not leaks and PG_MARK not in output, leaks or output
    description = json.loads(next(query.checkpoint.glob("twophase/*/sink.json")).read_text())
    for name, (_, own) in targets.items():
        assert description["options"][f"{name}.table"] == own["table"]
    assert not {k for k in description["options"] if k.endswith(".password")}


KAFKA_SECRETS = {
    "oauthbearer-and-pem-key": {
        "kafka.sasl.oauthbearer.config": "clientId=tp-app clientSecret=Tp-S3cret-oauth-71c2",
        "kafka.ssl.key.pem": "-----BEGIN PRIVATE KEY-----\nTpS3cretPemKey5b2a\n"
        "-----END PRIVATE KEY-----",
    },
    "java-keystore-key-and-password": {
        "kafka.ssl.keystore.key": "-----BEGIN PRIVATE KEY-----\nTpS3cretKeystoreKey8d1e\n"
        "-----END PRIVATE KEY-----",
        "kafka.ssl.key.password": "Tp-S3cret-keypass-3a9b",
    },
}
KAFKA_MARKS = (
    "S3cret-oauth-71c2",
    "S3cretPemKey5b2a",
    "S3cretKeystoreKey8d1e",
    "S3cret-keypass-3a9b",
)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", sorted(KAFKA_SECRETS))
def test_kafka_client_secrets_stay_out_of_the_checkpoint_and_the_logs(
    kafka_bootstrap: str, tmp_path: Path, case: str
) -> None:
    from integration_tests.spark_harness import Harness
    from integration_tests.test_kafka_helpers import createTopic, readTopic

    topic = createTopic(kafka_bootstrap, partitions=2, prefix="it-secrets")
    secrets = KAFKA_SECRETS[case]
    query = Harness(
        tmp_path / "query",
        "local",
        sink="twophase.spark.kafka:KafkaSink",
        rows=ROWS,
        rowsPerBatch=ROWS_PER_BATCH,
        columns={"key": "CAST(id AS STRING)", "value": "payload"},
        options={"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic, **secrets},
    )
    env = {"TWOPHASE_LOG_LEVEL": "DEBUG"}
    crashed = query.run("driver.afterDecision:1", env=env)
    assert crashed.killed, crashed.describe()

    recoverEnv = {**os.environ, **env, "TWOPHASE_KAFKA_OPTIONS": json.dumps(secrets)}
    recovered = _recover(query.checkpoint, recoverEnv)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert "of 1 decided batches [1]" in recovered.stdout

    keys = sorted(int(r.key or b"-1") for r in readTopic(kafka_bootstrap, topic))
    assert keys == list(range(2 * ROWS_PER_BATCH))  # batches 0 and 1, once each

    leaks = _secretsIn(query.workdir, KAFKA_MARKS)
    output = recovered.stdout + recovered.stderr
    assert not leaks and not any(m in output for m in KAFKA_MARKS), leaks or output
    description = json.loads(next(query.checkpoint.glob("twophase/*/sink.json")).read_text())
    assert description["options"]["topic"] == topic
    assert not set(secrets) & {k.lower() for k in description["options"]}


@pytest.mark.timeout(600)
def test_s3_secret_key_stays_out_of_the_checkpoint_and_the_logs(
    s3: S3Service, tmp_path: Path
) -> None:
    """``twophase.files``, ``twophase.delta`` and ``twophase.iceberg`` on S3, one target each of
    one query: the ``fs.secret`` (and ``fs.key``) options reach neither ``sink.json``, nor a
    handle, nor a log line; recover takes them from an option file and finishes the decided
    batch (for the tables: completes the uploads, then makes the batch's table commit with the
    same credentials)."""
    from twophase import verify

    root = s3.url(f"it-secrets/{uuid.uuid4().hex[:10]}")
    lake = {
        "table": "secrets.out",
        "catalog.type": "sql",
        "catalog.uri": f"sqlite:///{tmp_path}/catalog.db",
        "catalog.warehouse": f"{root}/lake",
    }
    targets = {
        "plain": ("files", {"path": f"{root}/files", **s3.options()}),
        "ledger": ("delta", {"path": f"{root}/delta", **s3.options()}),
        "lake": ("iceberg", {**lake, **s3.options()}),
    }
    query = _multiQuery(tmp_path / "query", targets)

    def ids(name: str) -> list[int]:
        if name == "ledger":
            held = verify.actualFromDelta(f"{root}/delta", ["id"], s3.options())
        elif name == "lake":
            held = verify.actualFromIceberg("secrets.out", {**lake, **s3.options()}, ["id"])
        else:
            held = verify.actualFromFiles(f"{root}/files", "parquet", options=s3.options())
        return sorted(held.column("id").to_pylist())

    env = {"TWOPHASE_LOG_LEVEL": "DEBUG"}
    crashed = query.run("driver.afterDecision:1", env=env)
    assert crashed.killed, crashed.describe()
    for name in ("ledger", "lake"):  # files: read once, after recover (s3fs caches a listing)
        assert ids(name) == list(range(ROWS_PER_BATCH)), f"{name}: batch 1 decided, not in"

    optionFile = tmp_path / "s3.options"
    optionFile.write_text(
        "".join(f"{n}.fs.key={s3.accessKey}\n{n}.fs.secret={s3.secretKey}\n" for n in targets)
    )
    optionFile.chmod(0o600)
    recovered = _recover(
        query.checkpoint, {**os.environ, **env}, "--sink-option-file", str(optionFile)
    )
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert "of 1 decided batches [1]" in recovered.stdout
    for name in targets:
        assert ids(name) == list(range(2 * ROWS_PER_BATCH)), name  # batches 0 and 1, once each

    leaks = _secretsIn(query.workdir, (s3.secretKey,))
    output = recovered.stdout + recovered.stderr
    assert not leaks and s3.secretKey not in output, leaks or output
    description = json.loads(next(query.checkpoint.glob("twophase/*/sink.json")).read_text())
    assert description["options"]["plain.path"] == f"{root}/files"
    assert description["options"]["lake.catalog.warehouse"] == f"{root}/lake"
    kept = {k.lower() for k in description["options"]}
    assert not {f"{n}.fs.{k}" for n in targets for k in ("key", "secret")} & kept


SQL_SECRET = "Tp-S3cret-sql-6c1d@x"
"""The MariaDB user's password: with an '@', which the SQLAlchemy URL percent-encodes."""
SQL_MARK = "S3cret-sql-6c1d"


@pytest.mark.timeout(600)
def test_sql_password_stays_out_of_the_checkpoint_and_the_logs(
    mariadb_url: str, tmp_path: Path
) -> None:
    """``twophase.sql`` on MariaDB: the URL's password reaches neither ``sink.json``, nor a
    handle, nor a log line; recover takes it from an option file."""
    import sqlalchemy as sa

    from integration_tests.spark_harness import Harness

    user, table = f"tp_secret_{uuid.uuid4().hex[:8]}", f"it_secret_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(mariadb_url, poolclass=sa.pool.NullPool)
    where = sa.make_url(mariadb_url)
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{SQL_SECRET}'")
        conn.exec_driver_sql(f"GRANT ALL ON `{where.database}`.* TO '{user}'@'127.0.0.1'")
    url = f"mysql+pymysql://{user}:{quote(SQL_SECRET, safe='')}@{where.host}:{where.port}/"
    url += str(where.database)
    try:
        query = Harness(
            tmp_path / "query",
            "local",
            sink="twophase.spark.declared:SqlSink",
            rows=ROWS,
            rowsPerBatch=ROWS_PER_BATCH,
            options={"url": url, "dbtable": table, "createTable": "true"},
        )
        env = {"TWOPHASE_LOG_LEVEL": "DEBUG"}
        crashed = query.run("driver.afterDecision:1", env=env)
        assert crashed.killed, crashed.describe()

        optionFile = tmp_path / "sql.options"
        optionFile.write_text(f"password={SQL_SECRET}\n")
        optionFile.chmod(0o600)
        recovered = _recover(
            query.checkpoint, {**os.environ, **env}, "--sink-option-file", str(optionFile)
        )
        assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        assert "of 1 decided batches [1]" in recovered.stdout
        with admin.connect() as conn:
            ids = conn.exec_driver_sql(f"SELECT id FROM {table}").scalars().all()
        assert sorted(ids) == list(range(2 * ROWS_PER_BATCH))  # batches 0 and 1, once each

        leaks = _secretsIn(query.workdir, (SQL_MARK,))
        output = recovered.stdout + recovered.stderr
        assert not leaks and SQL_MARK not in output, leaks or output
        description = json.loads(next(query.checkpoint.glob("twophase/*/sink.json")).read_text())
        assert description["options"]["dbtable"] == table
        assert "password" not in {k.lower() for k in description["options"]}
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
            conn.exec_driver_sql(f"DROP USER IF EXISTS '{user}'@'127.0.0.1'")
        admin.dispose()
