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


def startQuery(spark: Any, options: dict[str, str], checkpoint: Path) -> Any:
    stream = (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", 100)
        .option("totalRows", ROWS)
        .option("numPartitions", 2)
        .load()
        .selectExpr(*COLUMNS)
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
