"""The sql sink's ``LOAD DATA LOCAL`` path against the real MariaDB (no Spark).

Each test writes the same record batches twice, once by ``LOAD DATA`` and once by today's
``INSERT`` path (``loaddata.MIN_ROWS`` set out of reach), and compares what the table holds or
which error the task raised. A spy on ``loadBatch`` tells which path a batch took.
"""

from __future__ import annotations

import datetime as dt
import decimal
import glob
import logging
import os
import tempfile
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest
import sqlalchemy as sa

import twophase.sinks.sql.loaddata as loaddata
import twophase.sinks.sql.writer as writerModule
from twophase.protocol import RecoveryScope, TransactionContext
from twophase.redaction import redact
from twophase.resources import Resources
from twophase.sinks.sql import SqlCommitter, SqlSettings, SqlWriter, validateTarget
from twophase.sinks.sql.connections import engineFor


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def tempFiles() -> set[str]:
    """The rows' files left behind: temporary files, and in-memory files still open."""
    left = set(glob.glob(os.path.join(tempfile.gettempdir(), "twophase-load-*")))
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:twophase-load"):
            left.add(target)
    return left


class Loads:
    """What each ``loadBatch`` call answered (True: the batch went by LOAD DATA)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answers: list[bool] = []
        real = loaddata.loadBatch

        def spy(*args: object) -> bool:
            answer = real(*args)  # type: ignore[arg-type]
            self.answers.append(answer)
            return answer

        monkeypatch.setattr(writerModule, "loadBatch", spy)


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Loads:
    monkeypatch.setattr(loaddata, "MIN_ROWS", 1)
    return Loads(monkeypatch)


class Tables:
    """Tables of one test (dropped after), a plain reader and the sink's writes to them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sinkId = unique("s")
        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self.names: list[str] = []

    def create(self, columns: str) -> str:
        name = unique("it_load")
        self.names.append(name)
        self.execute(f"CREATE TABLE {name} ({columns})")
        return name

    def execute(self, statement: str) -> None:
        with self.engine.begin() as conn:
            conn.exec_driver_sql(statement)

    def rows(self, table: str) -> list[tuple[object, ...]]:
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.exec_driver_sql(f"SELECT * FROM {table} ORDER BY id")]

    def loadStatements(self) -> int:
        """The server's count of LOAD DATA statements run (all sessions)."""
        with self.engine.connect() as conn:
            return int(conn.exec_driver_sql("SHOW GLOBAL STATUS LIKE 'Com_load'").one()[1])

    def write(
        self,
        table: str,
        batches: list[pa.RecordBatch],
        *,
        url: str | None = None,
        resources: Resources | None = None,
        **extra: str,
    ) -> Exception | None:
        """One task: write ``batches``, prepare and commit; the task's error, if any (the
        transaction then aborted)."""
        settings = SqlSettings.fromOptions({"url": url or self.url, "dbtable": table, **extra})
        validateTarget(settings, batches[0].schema, self.sinkId)
        writer = SqlWriter(settings, resources)
        txn = writer.beginTransaction(TransactionContext(self.sinkId, "q", 1, 0, 0))
        try:
            for batch in batches:
                writer.write(txn, batch)
            handle = writer.preCommit(txn)
        except Exception as exc:
            writer.abortTransaction(txn)
            return exc
        SqlCommitter(settings, resources).commit(handle)
        return None

    def cleanup(self) -> None:
        settings = SqlSettings.fromOptions({"url": self.url, "dbtable": "x"})
        SqlCommitter(settings).recoverAndAbort(RecoveryScope(self.sinkId))
        for name in self.names:
            self.execute(f"DROP TABLE IF EXISTS {name}")
        self.engine.dispose()


@pytest.fixture
def tables(mariadb_url: str) -> Iterator[Tables]:
    t = Tables(mariadb_url)
    yield t
    t.cleanup()


def insertOnly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loaddata, "MIN_ROWS", 10**12)


ALL_TYPES = (
    "id BIGINT PRIMARY KEY, i8 TINYINT, i32 INT, f FLOAT, d DOUBLE, amount DECIMAL(20,6), "
    "s LONGTEXT, flag BOOL, day DATE, ts DATETIME(6), tstz DATETIME(6), bin LONGBLOB"
)

STRINGS = [
    "plain",
    "",
    None,
    "tab\there",
    "new\nline",
    "cr\rlf\r\n",
    "back\\slash",
    "\\N",
    "NULL",
    "nul\x00byte",
    "quote ' and \" both",
    "unicode é ß 漢字 🎉",
    "\\t literally",
    "trailing backslash\\",
]
DOUBLES = [0.1, 1 / 3, 1e300, -0.0, 5e-324, 1.7976931348623157e308, -2.5e-10, 123456789.123]


def allTypes(start: int) -> pa.RecordBatch:
    n = len(STRINGS)
    ids = list(range(start, start + n))
    base = dt.datetime(2024, 2, 29, 23, 59, 58, 999999)
    return pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "i8": pa.array([(-128, 127, None, 0)[i % 4] for i in range(n)], pa.int8()),
            "i32": pa.array([-(2**31) + i if i % 2 else 2**31 - 1 - i for i in range(n)]),
            "f": pa.array([(0.1, 3.4e38, -1.5, None)[i % 4] for i in range(n)], pa.float32()),
            "d": pa.array([DOUBLES[i % len(DOUBLES)] for i in range(n)], pa.float64()),
            "amount": pa.array(
                [
                    decimal.Decimal(f"{(-1) ** i * (i + 1)}2345678901.12345{i % 10}")
                    for i in range(n)
                ],
                pa.decimal128(20, 6),
            ),
            "s": pa.array(STRINGS),
            "flag": pa.array([(True, False, None)[i % 3] for i in range(n)]),
            "day": pa.array([dt.date(1000 + 70 * i, 1 + i % 12, 28) for i in range(n)]),
            "ts": pa.array(
                [base + dt.timedelta(days=400 * i, microseconds=i) for i in range(n)],
                pa.timestamp("us"),
            ),
            "tstz": pa.array(
                [
                    None if i == 5 else base.replace(tzinfo=dt.UTC) - dt.timedelta(hours=7 * i)
                    for i in range(n)
                ],
                pa.timestamp("us", tz="Europe/Paris"),
            ),
            "bin": pa.array(
                [(b"", None, b"\x00\t\n\\\xff", bytes(range(256)))[i % 4] for i in range(n)]
            ),
        }
    )


def test_every_type_reads_back_as_the_insert_path_wrote_it(
    tables: Tables, loads: Loads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two record batches of every handled type, by LOAD DATA and by INSERT: the same rows."""
    before = tempFiles()
    loaded, inserted = tables.create(ALL_TYPES), tables.create(ALL_TYPES)
    batches = [allTypes(0), allTypes(100)]
    assert tables.write(loaded, batches) is None
    assert loads.answers == [True, True]
    insertOnly(monkeypatch)
    assert tables.write(inserted, batches) is None
    assert loads.answers[2:] == [False, False]
    got, want = tables.rows(loaded), tables.rows(inserted)
    assert got == want and len(got) == 2 * len(STRINGS)
    assert [r[6] for r in got[: len(STRINGS)]] == STRINGS  # empty and NULL kept apart
    assert got[3][11] == bytes(range(256)) and got[1][11] is None and got[0][11] == b""
    assert tempFiles() == before


def withoutName(text: str, table: str) -> str:
    """``text`` with the table's name as ``<table>``, also where redaction took a secret of
    this process out of it (a value of four digits in the random name, say)."""
    return text.replace(table, "<table>").replace(redact(table), "<table>")


@pytest.mark.parametrize(
    ("kind", "columns", "ids", "values"),
    [
        ("duplicate-key", "v VARCHAR(20)", [0, 1, 2, 1, 4], ["a", "b", "c", "d", "e"]),
        ("not-null", "v VARCHAR(20) NOT NULL", [0, 1, 2, 3, 4], ["a", "b", "c", None, "e"]),
        ("too-long", "v VARCHAR(5)", [0, 1, 2, 3, 4], ["a", "b", "c", "much too long", "e"]),
        ("out-of-range", "v TINYINT", [0, 1, 2, 3, 4], ["1", "2", "3", "300", "5"]),
        ("bad-number", "v INT", [0, 1, 2, 3, 4], ["1", "2", "3", "12abc", "5"]),
    ],
)
def test_a_refused_row_fails_or_is_set_aside_exactly_as_by_insert(
    tables: Tables,
    loads: Loads,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    columns: str,
    ids: list[int],
    values: list[str | None],
) -> None:
    """LOCAL turns these errors into warnings: the load is undone and the INSERT path raises
    the same error, or with badRecords sets the same row aside and writes the others (a
    malformed number, error 1265, is no refusal badRecords takes: it fails the task, as
    before)."""
    before = tempFiles()
    columns = f"id BIGINT PRIMARY KEY, {columns}"
    batch = pa.record_batch({"id": pa.array(ids, pa.int64()), "v": pa.array(values, pa.string())})
    outcomes: list[tuple[type[Exception] | None, str, list[tuple[object, ...]]]] = []
    for path in ("load", "insert"):
        if path == "insert":
            insertOnly(monkeypatch)
        table = tables.create(columns)
        loadsBefore = tables.loadStatements()
        error = tables.write(table, [batch])
        assert error is not None, f"{kind} by {path}"
        outcomes.append((type(error), withoutName(str(error), table), tables.rows(table)))
        dead = unique("rejected")
        tables.names.append(dead)
        table = tables.create(columns)
        error = tables.write(table, [batch], badRecords=dead)
        deadRows: list[tuple[object, ...]] = []
        if error is None:
            with tables.engine.connect() as conn:
                deadRows = [
                    tuple(r)
                    for r in conn.exec_driver_sql(
                        f"SELECT row_position, error_column, error, record FROM {dead}"
                    )
                ]
        seen = str(error) if error is not None else repr(deadRows)
        outcomes.append(
            (type(error) if error else None, withoutName(seen, table), tables.rows(table))
        )
        if kind != "bad-number":  # a refusal badRecords knows: the row set aside
            assert error is None and len(deadRows) == 1 and deadRows[0][0] == 3
            assert len(tables.rows(table)) == 4
        attempted = tables.loadStatements() - loadsBefore
        assert attempted >= 2 if path == "load" else attempted == 0
    assert loads.answers == [False] * 4  # the loads tried, undone by their warning
    assert outcomes[0] == outcomes[2] and outcomes[1] == outcomes[3]
    assert outcomes[0][2] == []
    assert tempFiles() == before


def test_a_large_batch_goes_by_load_data(tables: Tables, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the real threshold: a batch of MIN_ROWS rows loads, one row fewer does not."""
    answers = Loads(monkeypatch).answers
    table = tables.create("id BIGINT PRIMARY KEY, v VARCHAR(20)")
    n = loaddata.MIN_ROWS

    def batch(start: int, count: int) -> pa.RecordBatch:
        ids = pa.array(range(start, start + count), pa.int64())
        return pa.record_batch({"id": ids, "v": pa.array([f"v{i}" for i in range(count)])})

    assert tables.write(table, [batch(0, n), batch(n, n - 1)]) is None
    assert answers == [True, False]
    assert len(tables.rows(table)) == 2 * n - 1


def test_a_server_that_refuses_local_gets_insert_for_good(
    tables: Tables, loads: Loads, caplog: pytest.LogCaptureFixture
) -> None:
    """A session that logged in without the LOCAL capability (PyMySQL's local_infile=0 in
    the URL) is refused with error 4166: the batch goes by INSERT, and the engine never
    tries LOAD DATA again (one debug line says why)."""
    before = tempFiles()
    resources = Resources()
    table = tables.create("id BIGINT PRIMARY KEY, v VARCHAR(20)")
    url = tables.url + ("&" if "?" in tables.url else "?") + "local_infile=0"
    batch = pa.record_batch({"id": pa.array([1, 2], pa.int64()), "v": pa.array(["a", None])})
    with caplog.at_level(logging.DEBUG, logger=loaddata.log.name):
        assert tables.write(table, [batch], url=url, resources=resources) is None
        later = pa.record_batch({"id": pa.array([3], pa.int64()), "v": pa.array(["c"])})
        assert tables.write(table, [later], url=url, resources=resources) is None
    try:
        assert tables.rows(table) == [(1, "a"), (2, None), (3, "c")]
        assert loads.answers == [False, False]
        refusals = [r for r in caplog.records if "refuses LOAD DATA LOCAL" in r.getMessage()]
        assert len(refusals) == 1 and "4166" in refusals[0].getMessage()
        settings = SqlSettings.fromOptions({"url": url, "dbtable": table})
        engine = engineFor(
            settings.url,
            pooled=False,
            connectTimeout=settings.connectTimeout,
            socketTimeout=settings.socketTimeout,
            resources=resources,
        )
        assert loaddata.enable(engine, resources).usable is False
        assert tempFiles() == before
    finally:
        resources.close()
