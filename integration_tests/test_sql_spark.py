"""twophase.sql in Spark: one shared session writes typed rows to MariaDB and PostgreSQL.

No crash here (the crash windows are participant tests, and the ``mariadb`` chaos pipeline
kills drivers, executors and the server): these tests check what only Spark shows, namely the
options as Spark passes them, the Spark types' round trip through the sink on both databases,
``twophase verify --sink sql``, the checkpoint without the password, and a clear error for a
missing table.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from integration_tests.spark_processes import sharedSession
from twophase import verify

COLUMNS = [
    "id",
    "payload",
    "cast(id as int) AS i",
    "cast(id % 30000 as smallint) AS small",
    "cast(id as decimal(12,2)) / 100 AS dec",
    "timestamp_seconds(id * 1000 + 0.123456) AS ts",
    "date_add(date'2000-01-01', cast(id as int)) AS day",
    "concat(payload, ' é''\\\\%s') AS txt",
    "CASE WHEN id % 3 = 0 THEN NULL ELSE payload END AS maybe",
    "encode(payload, 'utf-8') AS bin",
    "id % 2 = 0 AS flag",
    "id * 0.5 AS half",
]
ROWS = 300


def expected(i: int) -> tuple[Any, ...]:
    payload = f"row-{i}"
    return (
        i,
        payload,
        i,
        i % 30000,
        decimal.Decimal(i) / 100,
        dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        + dt.timedelta(seconds=i * 1000, microseconds=123456),
        dt.date(2000, 1, 1) + dt.timedelta(days=i),
        f"{payload} é'\\%s",
        None if i % 3 == 0 else payload,
        payload.encode(),
        i % 2 == 0,
        i * 0.5,
    )


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from sharedSession("twophase-sql", **{"spark.sql.session.timeZone": "UTC"})


def startQuery(
    spark: Any, options: dict[str, str], checkpoint: Path, columns: list[str] = COLUMNS
) -> Any:
    stream = (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", 100)
        .option("totalRows", ROWS)
        .option("numPartitions", 2)
        .load()
        .selectExpr(*columns)
    )
    writer = stream.writeStream.format("twophase.sql").options(**options)
    return writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()


def urls(mariadb_url: str, pg_url: str) -> dict[str, str]:
    return {
        "mariadb": mariadb_url,
        "postgresql": pg_url.replace("postgresql://", "postgresql+psycopg://", 1),
    }


def normalised(row: tuple[Any, ...]) -> tuple[Any, ...]:
    out = list(row)
    ts = out[5]
    if isinstance(ts, dt.datetime) and ts.tzinfo is None:  # MariaDB DATETIME holds UTC
        out[5] = ts.replace(tzinfo=dt.UTC)
    out[9] = bytes(out[9])
    out[10] = bool(out[10])
    return tuple(out)


@pytest.mark.timeout(600)
def test_spark_types_round_trip_exactly_once_on_mariadb_and_postgresql_and_verify_reads_them(
    spark: Any, mariadb_url: str, pg_url: str, tmp_path: Path
) -> None:
    for name, url in urls(mariadb_url, pg_url).items():
        table = f"it_sqlspark_{uuid.uuid4().hex[:8]}"
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        try:
            options = {"url": url, "dbtable": table, "createTable": "true", "batchsize": "64"}
            query = startQuery(spark, options, tmp_path / name)
            query.awaitTermination(300)
            assert query.exception() is None, f"{name}: {query.exception()}"
            names = "id payload i small dec ts day txt maybe bin flag half".split()
            # ``dec`` is a reserved word in MySQL: the sink quotes it, so must we.
            quoted = ", ".join(engine.dialect.identifier_preparer.quote(n) for n in names)
            with engine.connect() as conn:
                rows = conn.exec_driver_sql(f"SELECT {quoted} FROM {table} ORDER BY id").fetchall()
            got = [normalised(tuple(r)) for r in rows]
            assert len(got) == ROWS, name
            for row in got:
                assert row == expected(row[0]), (name, row)
            report = verify.verify(
                "sequence", {"start": "0", "end": str(ROWS)}, "sql", {"url": url, "dbtable": table}
            )
            assert report.ok and report.actualRows == ROWS, (name, str(report))
            password = sa.make_url(url).password
            for path in (tmp_path / name).rglob("*"):
                if path.is_file():
                    assert f":{password}@" not in path.read_text(errors="replace"), path
            sinkJson = next((tmp_path / name).rglob("sink.json"))
            assert json.loads(sinkJson.read_text())  # readable, and (above) password-free
        finally:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
            engine.dispose()


@pytest.mark.timeout(300)
def test_a_missing_table_fails_the_query_clearly_before_any_task(
    spark: Any, mariadb_url: str, tmp_path: Path
) -> None:
    table = f"it_sqlspark_{uuid.uuid4().hex[:8]}"
    query = startQuery(spark, {"url": mariadb_url, "dbtable": table}, tmp_path / "missing")
    with pytest.raises(Exception) as info:  # noqa: B017 - Spark's StreamingQueryException
        query.awaitTermination(240)
    assert f"table {table} does not exist" in str(info.value)
    assert "createTable=true" in str(info.value)


@pytest.mark.timeout(600)
def test_a_value_too_long_fails_the_query_naming_its_row_and_nothing_of_the_batch_is_visible(
    spark: Any, mariadb_url: str, tmp_path: Path
) -> None:
    """MariaDB (strict mode) refuses the value; the query stops with the row's position, the
    column, its type and the fix, holds batch 0 only, and writes the rest after the fix."""
    table = f"it_sqlspark_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(mariadb_url, poolclass=sa.pool.NullPool)
    # Batch 1 is ids 100-199, partition 1 ids 150-199: id 163 is that partition's row 13.
    columns = ["id", "CASE WHEN id = 163 THEN repeat('x', 25) ELSE payload END AS payload"]
    options = {"url": mariadb_url, "dbtable": table}
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, payload VARCHAR(10)) ENGINE=InnoDB"
            )
        query = startQuery(spark, options, tmp_path / "ckpt", columns)
        with pytest.raises(Exception) as info:  # noqa: B017 - Spark's StreamingQueryException
            query.awaitTermination(240)
        message = str(info.value)
        assert (
            "batch 1, partition 1 (attempt 0), table " + table in message
            and "the database rejected row 13 of partition 1 (counting from 0), column payload: "
            "Data too long for column 'payload' (error 1406; the value has 25 characters; the "
            "column is varchar(10))"
            in message
        ), message
        assert "widen payload" in message and "truncate the value upstream" in message
        assert "x" * 25 not in message and f":{sa.make_url(mariadb_url).password}@" not in message
        with engine.connect() as conn:
            ids = conn.exec_driver_sql(f"SELECT id FROM {table} ORDER BY id").scalars().all()
        assert ids == list(range(100))  # batch 0, nothing of batch 1

        with engine.begin() as conn:
            conn.exec_driver_sql(f"ALTER TABLE {table} MODIFY payload VARCHAR(50)")
        startQuery(spark, options, tmp_path / "ckpt", columns).awaitTermination(240)
        with engine.connect() as conn:
            ids = conn.exec_driver_sql(f"SELECT id FROM {table} ORDER BY id").scalars().all()
        assert ids == list(range(ROWS))
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        engine.dispose()


@pytest.mark.timeout(600)
def test_bad_records_set_aside_in_a_dead_letter_table_let_the_query_go_on_exactly_once(
    spark: Any, mariadb_url: str, pg_url: str, tmp_path: Path
) -> None:
    """With badRecords=<table> the rows each database refuses (values too long, in three
    batches and both partitions) land in the dead-letter table with their batch and
    position, every other row in the target, each once; a second start adds nothing, and
    ``twophase verify`` with the option finds every source row once."""
    bad = {37, 163, 250}
    columns = [
        "id",
        f"CASE WHEN id IN {tuple(sorted(bad))} THEN repeat('x', 25) ELSE payload END AS payload",
    ]
    for name, url in urls(mariadb_url, pg_url).items():
        table, dead = (f"it_sql{kind}_{uuid.uuid4().hex[:8]}" for kind in ("spark", "dead"))
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        options = {"url": url, "dbtable": table, "badRecords": dead}
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, payload VARCHAR(10))"
                )
            for _ in range(2):
                startQuery(spark, options, tmp_path / name, columns).awaitTermination(240)
                with engine.connect() as conn:
                    ids = conn.exec_driver_sql(f"SELECT id FROM {table} ORDER BY id")
                    aside = conn.exec_driver_sql(
                        f"SELECT batch_id, error, record FROM {dead} ORDER BY batch_id, "
                        "partition_id, row_position"
                    ).all()
                assert ids.scalars().all() == [i for i in range(ROWS) if i not in bad], name
                assert [json.loads(r[2])["id"] for r in aside] == sorted(bad), name
                assert [r[0] for r in aside] == [0, 1, 2], name
                assert all("too long" in r[1] for r in aside), (name, aside)
            # verify counts the rows set aside as held; without the option, as missing.
            source = {"start": "0", "end": str(ROWS)}
            report = verify.verify("sequence", source, "sql", options, columns=["id"])
            assert report.ok and report.actualRows == ROWS, (name, str(report))
            plain = {"url": url, "dbtable": table}
            report = verify.verify("sequence", source, "sql", plain, columns=["id"])
            assert not report.ok and report.missing == len(bad), (name, str(report))
        finally:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {dead}")
            engine.dispose()


@pytest.mark.timeout(300)
def test_the_example_of_docs_sql_md_runs(
    spark: Any, mariadb_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The document's example, run in this session with its own table and checkpoint."""
    import re

    doc = (Path(__file__).resolve().parents[1] / "docs" / "sql.md").read_text()
    [code] = re.findall(r"```python\n(.*?)```", doc, flags=re.DOTALL)
    table = f"it_sqldoc_{uuid.uuid4().hex[:8]}"
    assert '"events"' in code and "/tmp/twophase-sql-example/checkpoint" in code
    code = code.replace('"events"', f'"{table}"')
    code = code.replace("/tmp/twophase-sql-example/checkpoint", str(tmp_path / "ckpt"))
    monkeypatch.setenv("TWOPHASE_MARIADB_URL", mariadb_url)
    exec(compile(code, "docs/sql.md", "exec"), {"__name__": "docs_sql_example"})
    engine = sa.create_engine(mariadb_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            ids = conn.exec_driver_sql(f"SELECT id FROM {table} ORDER BY id").scalars().all()
        assert ids == list(range(3000))
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        engine.dispose()
