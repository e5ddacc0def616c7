"""twophase.postgres end to end: Spark streaming queries SIGKILLed at every crash window.

The queries run in child processes (integration_tests/postgres_harness.py) against the real
PostgreSQL of `make services`; after each crash the test looks at what the crash left (rows
visible, prepared transactions), restarts the query from its checkpoint, and at the end checks
with SQL that every source row is in the table exactly once, with the right values, and that no
prepared transaction of the sink is left. Row counts are small: the cost is Spark's start-up.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from integration_tests.conftest import ServiceControl
from integration_tests.postgres_harness import QUERY_FAILED, QuerySpec, Run, runChild
from integration_tests.spark_processes import sharedSession

# Every Spark SQL primitive type, NULLs and awkward strings, as functions of the source's id.
TYPED_COLUMNS = {
    "id": "id",
    "payload": "payload",
    "tiny": "cast(id % 100 as tinyint)",
    "small": "cast(id % 30000 as smallint)",
    "i": "cast(id as int)",
    "f4": "cast(id as float) / 4",
    "f8": "CASE WHEN id % 7 = 0 THEN double('NaN') WHEN id % 7 = 1 THEN double('Infinity') "
    "ELSE id * 0.5 END",
    "dec": "cast(id as decimal(12,2)) / 100",
    "txt": "concat(payload, '\\n\\t\"\\\\,;''', char(9))",
    "maybe": "CASE WHEN id % 3 = 0 THEN NULL ELSE payload END",
    "bin": "encode(payload, 'utf-8')",
    "flag": "id % 2 = 0",
    "day": "date_add(date'2000-01-01', cast(id as int))",
    "ts": "timestamp_seconds(id * 1000)",
    "ntz": "cast(timestamp_seconds(id * 1000) as timestamp_ntz)",
}

# The same values computed by PostgreSQL: a row is right when every column matches.
TYPED_CHECK = """
    payload = 'row-' || id
    AND tiny = id % 100 AND small = id % 30000 AND i = id
    AND f4 = (id::real / 4)
    AND (f8 = CASE WHEN id % 7 = 0 THEN 'NaN'::float8 WHEN id % 7 = 1 THEN 'Infinity'::float8
                   ELSE id * 0.5 END)
    AND dec = (id::numeric / 100)::numeric(12,2)
    AND txt = payload || E'\\n\\t"\\\\,;''' || chr(9)
    AND maybe IS NOT DISTINCT FROM CASE WHEN id % 3 = 0 THEN NULL ELSE payload END
    AND bin = convert_to(payload, 'UTF8')
    AND flag = (id % 2 = 0)
    AND day = date '2000-01-01' + id::int
    AND ts = to_timestamp(id * 1000)
    AND ntz = to_timestamp(id * 1000) AT TIME ZONE 'UTC'
"""


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def table(pg_url: str) -> Iterator[str]:
    name = unique("it_pgspark")
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        for dropped in (name, f"{name}_twophase_staging", f"{name}_twophase_commits"):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(dropped)))


def query(pg_url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        cur = conn.execute(statement, params or None)
        return cur.fetchall() if cur.description else []


def stagedOf(pg_url: str, table: str) -> int:
    """Rows waiting in the staging table next to ``table`` (commitMode auto or staged)."""
    [(rows,)] = query(pg_url, f"SELECT count(*) FROM {table}_twophase_staging")
    return int(rows)


def preparedOf(pg_url: str, sinkId: str, batch: int | None = None) -> list[str]:
    prefix = f"tp1:{sinkId}:" + (f"b{batch}:" if batch is not None else "")
    rows = query(pg_url, "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", prefix + "%")
    return sorted(r[0] for r in rows)


def counts(pg_url: str, table: str) -> tuple[int, int]:
    [(rows, distinct)] = query(pg_url, f"SELECT count(*), count(DISTINCT id) FROM {table}")
    return int(rows), int(distinct)


def assertExactlyOnce(pg_url: str, table: str, sinkId: str, total: int) -> None:
    assert counts(pg_url, table) == (total, total)
    assert query(pg_url, f"SELECT min(id), max(id) FROM {table}") == [(0, total - 1)]
    assert preparedOf(pg_url, sinkId) == []


def assertCrashed(run: Run) -> None:
    assert run.killed, f"expected a SIGKILL, got exit {run.returncode}:\n{run.tail()}"


def assertDone(run: Run) -> None:
    assert run.returncode == 0, f"query failed (exit {run.returncode}):\n{run.tail()}"


# -- the driver at every crash window, and the server restarted ----------------------------------


@pytest.mark.windows
@pytest.mark.timeout(900)
def test_driver_sigkill_at_every_window_and_server_restarts_keep_exactly_once(
    pg_url: str, table: str, postgres_server: ServiceControl, tmp_path: Path
) -> None:
    sinkId = f"tp-{table[-10:]}"
    total, perBatch = 1000, 100
    spec = QuerySpec(
        checkpoint=str(tmp_path / "checkpoint"),
        options={
            "url": pg_url,
            "table": table,
            "createTable": "true",
            "sinkId": sinkId,
            "maxPreparedPartitions": "1",  # partition 0 prepares, partition 1 stages
        },
        rows=total,
        rowsPerBatch=perBatch,
        partitions=2,
        columns=TYPED_COLUMNS,
    )
    logs = tmp_path / "logs"

    # Tasks prepared (partition 0) and staged (partition 1) batch 0, nobody decided:
    # invisible, rolled back and swept on restart.
    assertCrashed(runChild(spec, logs, crashAt="driver.beforeDecision:0"))
    assert counts(pg_url, table) == (0, 0)
    assert len(preparedOf(pg_url, sinkId, 0)) == 1 and stagedOf(pg_url, table) == 50

    # Batch 1 decided, not committed; then PostgreSQL crashes too: its prepared transactions
    # survive the server's crash recovery, still invisible, and the next start commits them.
    assertCrashed(runChild(spec, logs, crashAt="driver.afterDecision:1"))
    assert counts(pg_url, table) == (100, 100)
    assert preparedOf(pg_url, sinkId, 0) == []  # recovery rolled back the undecided batch 0
    decided = preparedOf(pg_url, sinkId, 1)
    assert len(decided) == 1 and stagedOf(pg_url, table) == 50  # batch 0's staged rows swept
    postgres_server.kill()
    postgres_server.start()
    assert preparedOf(pg_url, sinkId, 1) == decided and stagedOf(pg_url, table) == 50
    assert counts(pg_url, table) == (100, 100)

    # Recovery itself killed after rolling batch 1 forward, before its sweep.
    assertCrashed(runChild(spec, logs, crashAt="driver.duringRecovery"))
    assert counts(pg_url, table) == (200, 200)
    # Killed once the first of batch 2's two commits returned (the coordinator commits in
    # parallel, so the other one may have finished too): committed rows are never duplicated.
    assertCrashed(runChild(spec, logs, crashAt="driver.betweenCommits:2"))
    rows, distinct = counts(pg_url, table)
    assert rows == distinct and 250 <= rows <= 300
    assert len(preparedOf(pg_url, sinkId, 2)) <= 1
    # Everything of batch 3 committed, not yet marked in the log; then marked, Spark unaware.
    assertCrashed(runChild(spec, logs, crashAt="driver.afterCommits:3"))
    assert counts(pg_url, table) == (400, 400)
    assertCrashed(runChild(spec, logs, crashAt="driver.afterCommitted:4"))
    assert counts(pg_url, table) == (500, 500)

    # The last run drains the source while PostgreSQL restarts under it (local[2,4]: Spark
    # retries a task that lost its connection). Should a retry meet a transaction prepared just
    # before the restart, the query fails loudly; then one more start finishes the job.
    stop = threading.Event()
    restarts: list[tuple[float, int]] = []  # when PostgreSQL's restart began, at how many rows

    def restartMidStream() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not stop.is_set():
            rows = counts(pg_url, table)[0]
            if rows >= 600:
                began = time.monotonic()
                postgres_server.restart()
                restarts.append((began, rows))  # only once the restart succeeded
                return
            time.sleep(0.2)

    restarter = threading.Thread(target=restartMidStream, daemon=True)
    restarter.start()
    final = runChild(QuerySpec(**{**spec.__dict__, "master": "local[2,4]"}), logs)
    finalEnded = time.monotonic()
    stop.set()
    restarter.join(timeout=200)
    assert not restarter.is_alive(), "PostgreSQL's restart did not finish within 200 s"
    # The restart happened, and under the running query: it began before the query's process
    # ended, with rows of the source still to write.
    assert restarts, f"PostgreSQL was never restarted under the last run:\n{final.tail()}"
    [(restartedAt, rowsAtRestart)] = restarts
    assert restartedAt < finalEnded and rowsAtRestart < total, (rowsAtRestart, final.tail())
    if final.returncode == QUERY_FAILED:
        final = runChild(spec, logs)
    assertDone(final)

    assertExactlyOnce(pg_url, table, sinkId, total)
    assert stagedOf(pg_url, table) == 0
    [(wrong,)] = query(pg_url, f"SELECT count(*) FROM {table} WHERE NOT ({TYPED_CHECK})")
    assert wrong == 0


# -- an executor killed mid-COPY ---------------------------------------------------------------


@pytest.mark.timeout(600)
def test_executor_python_worker_killed_mid_copy_is_retried_exactly_once(
    pg_url: str, table: str, tmp_path: Path
) -> None:
    sinkId = f"tp-{table[-10:]}"
    spec = QuerySpec(
        checkpoint=str(tmp_path / "checkpoint"),
        options={
            "url": pg_url,
            "table": table,
            "createTable": "true",
            "sinkId": sinkId,
            "maxPreparedPartitions": "1",  # partition 0 prepares, partition 1 stages
        },
        rows=400,
        rowsPerBatch=100,
        partitions=2,
        master="local-cluster[2,1,1024]",  # separate executor JVMs; tasks are retried
        sparkConf={"spark.sql.execution.arrow.maxRecordsPerBatch": "10"},  # many COPY chunks
    )
    run = runChild(spec, tmp_path / "logs", crashAt="task.afterWrite:1", timeout=400)
    assertDone(run)
    assert (tmp_path / "logs" / "crash-0.once").exists(), "the task was never killed"
    assertExactlyOnce(pg_url, table, sinkId, 400)
    assert stagedOf(pg_url, table) == 0


# -- upsert under replays ----------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_upsert_replayed_after_a_crash_keeps_the_latest_value_per_key(
    pg_url: str, table: str, tmp_path: Path
) -> None:
    sinkId = f"tp-{table[-10:]}"
    query(pg_url, f"CREATE TABLE {table} (k bigint PRIMARY KEY, v bigint, payload text)")
    spec = QuerySpec(
        checkpoint=str(tmp_path / "checkpoint"),
        options={
            "url": pg_url,
            "table": table,
            "mode": "upsert",
            "keyColumns": "k",
            "sinkId": sinkId,
            "maxPreparedPartitions": "1",  # partition 0 prepares, partition 1 stages
        },  # fmt: skip
        rows=500,
        rowsPerBatch=100,
        partitions=2,
        # each batch touches every key 0..99 once, with a newer value
        columns={"k": "id % 100", "v": "id", "payload": "payload"},
    )
    assertCrashed(runChild(spec, tmp_path / "logs", crashAt="driver.beforeDecision:2"))
    assert query(pg_url, f"SELECT count(*), min(v), max(v) FROM {table}") == [(100, 100, 199)]
    assert len(preparedOf(pg_url, sinkId, 2)) == 1 and stagedOf(pg_url, table) == 50
    assertDone(runChild(spec, tmp_path / "logs"))
    assert query(pg_url, f"SELECT count(*) FROM {table}") == [(100,)]
    [(wrong,)] = query(
        pg_url, f"SELECT count(*) FROM {table} WHERE v <> 400 + k OR payload <> 'row-' || v"
    )
    assert wrong == 0
    assert preparedOf(pg_url, sinkId) == [] and stagedOf(pg_url, table) == 0


# -- bad input at the Spark level --------------------------------------------------------------


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from sharedSession("twophase-postgres-bad-input")


def startQuery(
    spark: Any,
    options: dict[str, str],
    checkpoint: Path,
    columns: list[str],
    *,
    rowsPerBatch: int = 100,
    totalRows: int = 300,
    partitions: int = 2,
) -> Any:
    stream = (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", rowsPerBatch)
        .option("totalRows", totalRows)
        .option("numPartitions", partitions)
        .load()
        .selectExpr(*columns)
    )
    writer = stream.writeStream.format("twophase.postgres")
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()


def failureOf(query: Any) -> str:
    with pytest.raises(Exception) as info:  # noqa: B017 - Spark's StreamingQueryException
        query.awaitTermination(240)
    return str(info.value)


@pytest.mark.timeout(600)
def test_bad_input_fails_clearly_with_nothing_partly_visible_and_replays_after_the_fix(
    spark: Any, pg_url: str, table: str, tmp_path: Path
) -> None:
    sinkId = f"tp-{table[-10:]}"
    options = {"url": pg_url, "table": table, "sinkId": sinkId}
    # Batch 1 is ids 100-199, partition 1 ids 150-199: id 163 is that partition's row 13.
    columns = ["id", "CASE WHEN id = 163 THEN NULL ELSE payload END AS payload"]

    message = failureOf(startQuery(spark, options, tmp_path / "c1", columns))
    assert f"table public.{table} does not exist" in message and "createTable=true" in message
    assert pg_url not in message

    query(pg_url, f"CREATE TABLE {table} (id integer, payload text NOT NULL)")
    message = failureOf(startQuery(spark, options, tmp_path / "c2", columns))
    assert "column 'id' is a Spark bigint but the table column is integer" in message

    query(pg_url, f"ALTER TABLE {table} ALTER COLUMN id TYPE bigint")
    checkpoint = tmp_path / "c3"
    message = failureOf(startQuery(spark, options, checkpoint, columns))
    assert "PostgreSQL rejected row 13 of partition 1 (counting from 0)" in message, message
    assert "batch 1, partition 1" in message and "column payload" in message
    assert "not-null" in message and "df.na.drop(subset=['payload'])" in message
    assert "Failing row" not in message and "row-164" not in message  # no row's values
    assert counts(pg_url, table) == (100, 100)  # batch 0 only: nothing of batch 1
    assert preparedOf(pg_url, sinkId) == []
    assert pg_url not in message

    query(pg_url, f"ALTER TABLE {table} ALTER COLUMN payload DROP NOT NULL")
    startQuery(spark, options, checkpoint, columns).awaitTermination(240)
    assertExactlyOnce(pg_url, table, sinkId, 300)
    assert query(pg_url, f"SELECT id FROM {table} WHERE payload IS NULL") == [(163,)]


@pytest.mark.timeout(600)
def test_bad_records_set_aside_let_the_query_go_on_exactly_once_and_verify_counts_them(
    spark: Any, pg_url: str, table: str, tmp_path: Path
) -> None:
    """``badRecords``: the rows PostgreSQL rejects (a NULL, a CHECK) in three batches land in
    the dead-letter table the driver created, every other row in the target, each once over
    two starts; ``twophase verify`` with the option counts every source row once."""
    from twophase import verify

    dead = f"{table}_rejected"
    options = {"url": pg_url, "table": table, "badRecords": dead}
    columns = [
        "id",
        "CASE WHEN id IN (37, 250) THEN NULL WHEN id = 163 THEN 'no' ELSE payload END AS payload",
    ]
    query(
        pg_url,
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, payload text NOT NULL "
        "CHECK (payload <> 'no'))",
    )
    try:
        for _ in range(2):
            startQuery(spark, options, tmp_path / "ckpt", columns).awaitTermination(240)
            ids = [r[0] for r in query(pg_url, f"SELECT id FROM {table} ORDER BY id")]
            assert ids == [i for i in range(300) if i not in (37, 163, 250)]
            aside = query(
                pg_url,
                f"SELECT (record ->> 'id')::bigint, batch_id, error_column, error FROM {dead} "
                "ORDER BY 1",
            )
            assert [r[:2] for r in aside] == [(37, 0), (163, 1), (250, 2)]
            assert aside[0][2] == "payload" and "not-null" in aside[0][3]
            assert f"{table}_payload_check" in aside[1][3]
        assert query(pg_url, "SELECT to_regclass(%s)", f"{table}_twophase_staging") == [(None,)]
        source = {"start": "0", "end": "300"}
        report = verify.verify("sequence", source, "postgres", options, columns=["id"])
        assert report.ok and report.actualRows == 300, str(report)
        plain = {"url": pg_url, "table": table}
        report = verify.verify("sequence", source, "postgres", plain, columns=["id"])
        assert not report.ok and report.missing == 3, str(report)
    finally:
        query(pg_url, f"DROP TABLE IF EXISTS {dead}")


# -- more partitions than the server's max_prepared_transactions --------------------------------


@pytest.mark.timeout(600)
def test_twice_max_prepared_transactions_partitions_commit_exactly_once(
    spark: Any, pg_url: str, table: str, tmp_path: Path
) -> None:
    """commitMode=auto (the default): partitions below half the server's limit prepare, the
    others stage their rows; both kinds are committed by the driver in each batch."""
    [(limit,)] = query(pg_url, "SELECT current_setting('max_prepared_transactions')::int")
    partitions = 2 * limit
    sinkId = f"tp-{table[-10:]}"
    options = {"url": pg_url, "table": table, "createTable": "true", "sinkId": sinkId}
    total = 2 * partitions  # one batch, two rows per partition
    started = startQuery(
        spark,
        options,
        tmp_path / "checkpoint",
        ["id", "payload"],
        rowsPerBatch=total,
        totalRows=total,
        partitions=partitions,
    )
    started.awaitTermination(400)
    assert started.exception() is None, started.exception()
    assertExactlyOnce(pg_url, table, sinkId, total)
    assert query(pg_url, f"SELECT count(*) FROM {table}_twophase_staging") == [(0,)]
    # both paths ran: staged partitions left commit markers, prepared ones did not
    [(markers, batches)] = query(
        pg_url, f"SELECT count(*), count(DISTINCT batch_id) FROM {table}_twophase_commits"
    )
    assert batches == 1 and markers == partitions - limit // 2


# -- nothing of ours is left once the query stops --------------------------------------------------


def connectedPorts(remotePort: int) -> set[int]:
    """The local ports of this process's TCP sockets connected to ``remotePort``."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed while listing
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == remotePort:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def driverSessions(pg_url: str, applicationName: str) -> list[int]:
    """The PostgreSQL sessions named ``applicationName`` whose client is this (the driver's)
    process: pg_stat_activity's client ports among the driver's own sockets."""
    port = psycopg.conninfo.conninfo_to_dict(pg_url).get("port") or 5432
    mine = connectedPorts(int(port))
    rows = query(
        pg_url,
        "SELECT client_port FROM pg_stat_activity WHERE application_name = %s",
        applicationName,
    )
    return sorted(p for (p,) in rows if p in mine)


@pytest.mark.timeout(300)
def test_a_stopped_query_leaves_no_thread_or_connection_of_ours_in_the_driver(
    spark: Any, pg_url: str, table: str, tmp_path: Path
) -> None:
    """foreachBatch runs the coordinator in this process: while the query runs, its resources
    keep driver connections for the next batch (one batch here); once it stops, they are closed
    and no ``twophase-*`` thread is left."""
    import twophase
    from twophase.resources import Resources

    before = set(threading.enumerate())
    name = unique("tp_leak")
    checkpoint = str(tmp_path / "checkpoint")
    options = {"url": pg_url, "table": table, "createTable": "true", "applicationName": name}
    stream = (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", 40)
        .option("totalRows", 40)
        .option("numPartitions", 2)
        .load()
        .selectExpr("id", "payload")
    )
    write = twophase.foreachBatch(
        "twophase.postgres", {**options, "checkpointLocation": checkpoint}
    )
    running = (
        stream.writeStream.foreachBatch(write).option("checkpointLocation", checkpoint).start()
    )
    try:
        running.processAllAvailable()
        assert driverSessions(pg_url, name), "the driver kept no connection between batches"
    finally:
        running.stop()
    assert Resources.ofProcess().awaitReleased(60), "the query's end never reached the listener"
    assert counts(pg_url, table) == (40, 40)
    assert driverSessions(pg_url, name) == []
    ours = [t for t in threading.enumerate() if t.name.startswith("twophase-") and t not in before]
    for thread in ours:
        thread.join(10)  # a commit pool's threads end once their last job returned
    assert [t.name for t in ours if t.is_alive()] == []
