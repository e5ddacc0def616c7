"""twophase through Spark Connect: a server SIGKILLed mid-batch, and a server without twophase.

The server is the one pip's pyspark ships (``org.apache.spark.sql.connect.service.
SparkConnectServer``, what ``sbin/start-connect-server.sh`` starts), run in the foreground by
``spark-submit`` in a session of its own on a free loopback port, ``local[2]``, with the same
private ``SPARK_HOME``, C1-only JVM and loopback settings as every test child
(``integration_tests.spark_processes``). The client is this process: a Connect session, as a
user's thin client would be. Four queries, into files, PostgreSQL and Kafka through
``format()`` and into files through ``twophase.foreachBatch`` (run by the server's Python), run
side by side on one server, so one SIGKILL interrupts each at some point of its batch. The
restarted server's client also runs ``twophase.attachMetrics``: events reach the client's
listener, which reads the figures from the checkpoint.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

import twophase
from integration_tests.sink_outputs import FILES, exactlyOnceReport
from integration_tests.spark_processes import (
    FAST_JVM,
    childEnvironment,
    freePort,
    killSession,
    makeSparkHome,
    pythonWithoutTwophase,
)
from integration_tests.test_kafka_helpers import createTopic, readTopic
from integration_tests.test_multi import pgIds

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT = 120.0
QUERY_TIMEOUT = 180.0
ROWS = 6000
ROWS_PER_BATCH = 1500


@dataclass
class ConnectServer:
    """One Spark Connect server process (and its session), started and stopped by a test."""

    workdir: Path
    python: str
    env: Mapping[str, str] = field(default_factory=dict)
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self, name: str) -> ConnectServer:
        """Start and wait until the gRPC port accepts connections (the server is ready then)."""
        home = makeSparkHome(self.workdir / "spark-home")
        self.port = freePort()
        env = childEnvironment(self.workdir, home, {})
        env["PYSPARK_PYTHON"] = self.python
        env.update(self.env)
        args = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS]
        args += ["--master", "local[2]", "--driver-java-options", FAST_JVM]
        for key, value in {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
        }.items():
            args += ["--conf", f"{key}={value}"]
        # A driver.* crash point kills the process group named here: the server's session.
        shell = 'TWOPHASE_CRASH_PGID=$$; export TWOPHASE_CRASH_PGID; exec "$@"'
        self.log = self.workdir / f"{name}.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                ["/bin/sh", "-c", shell, "sh", *args, "spark-internal"],
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the Connect server exited at start; {self.tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.5)
        self.kill()
        raise AssertionError(f"the Connect server did not start in {START_TIMEOUT:.0f}s")

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL whatever is left of the server's session."""
        if self.process is not None:
            killSession(self.process.pid)
            self.process.wait()

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        return f"log {self.log}:\n" + "\n".join(text.splitlines()[-lines:])


@pytest.fixture(autouse=True)
def restoredEnvironment() -> Iterator[None]:
    """The environment as it was before the test: a Connect client sets ``SPARK_REMOTE`` and
    ``SPARK_CONNECT_MODE_ENABLED`` in it, which would turn every later test's (and child's)
    classic session into a Connect one."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture
def servers() -> Iterator[list[ConnectServer]]:
    """Servers a test starts; every one is killed afterwards, whatever happened."""
    started: list[ConnectServer] = []
    yield started
    for server in started:
        server.kill()


@pytest.fixture
def sessions() -> Iterator[list[Any]]:
    """Client sessions a test opens; each one's channel is closed afterwards, whatever happened.

    A client whose server is gone would otherwise retry its clean-up RPCs at interpreter exit
    for minutes (PySpark's default retry policy), holding up the end of the whole test run.
    """
    opened: list[Any] = []
    yield opened
    for session in opened:
        try:
            session.client.close()
        except Exception:  # already closed, or the channel is gone: nothing left to do
            pass


def _connect(server: ConnectServer, sessions: list[Any]) -> Any:
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(server.url).create()
    sessions.append(session)
    return session


@dataclass(frozen=True)
class Targets:
    """Where the three queries write: a files path, a PostgreSQL table, a Kafka topic."""

    workdir: Path
    pgUrl: str
    table: str
    bootstrap: str
    topic: str


def _sequence(spark: Any) -> Any:
    return (
        spark.readStream.format("twophase.sequence")
        .option("totalRows", ROWS)
        .option("rowsPerBatch", ROWS_PER_BATCH)
        .option("numPartitions", 2)
        .load()
    )


def _startQueries(spark: Any, to: Targets) -> list[Any]:
    """The files, PostgreSQL and Kafka queries, each with its own checkpoint."""
    files = (
        _sequence(spark)
        .writeStream.format("twophase.files")
        .option("path", str(to.workdir / "output"))
    )
    postgres = (
        _sequence(spark)
        .writeStream.format("twophase.postgres")
        .option("url", to.pgUrl)
        .option("dbtable", to.table)
        .option("createTable", "true")
        .option("sinkId", to.table.replace("_", "-"))
    )
    kafka = (
        _sequence(spark)
        .selectExpr("cast(id AS string) AS key", "payload AS value")
        .writeStream.format("twophase.kafka")
        .option("kafka.bootstrap.servers", to.bootstrap)
        .option("topic", to.topic)
    )
    wideCheckpoint = str(to.workdir / "checkpoint-wide")
    wide = (
        _sequence(spark)
        .repartition(8, "id")
        .writeStream.foreachBatch(
            twophase.foreachBatch(
                "twophase.files",
                {"path": str(to.workdir / "wide"), "checkpointLocation": wideCheckpoint},
            )
        )
    )
    # foreachBatch first: its start makes the server spawn a Python process that must connect
    # back within Spark's fixed ten seconds, easier before the other queries' tasks load the cores.
    return [
        _start(
            writer.option("checkpointLocation", str(to.workdir / f"checkpoint-{name}")).trigger(
                availableNow=True
            )
        )
        for name, writer in (
            ("wide", wide),
            ("files", files),
            ("postgres", postgres),
            ("kafka", kafka),
        )
    ]


CONNECT_BACK = "Python worker failed to connect back"
"""Spark's error when the server's foreachBatch process did not connect back within the ten
seconds Spark allows (a constant in PythonWorkerFactory, not a setting): nothing started."""


def _start(writer: Any, tries: int = 3) -> Any:
    """``writer.start()``, again when the server's foreachBatch process missed Spark's fixed
    connect-back window on a loaded machine; any other error, or the last try's, is raised."""
    for attempt in range(1, tries + 1):
        try:
            return writer.start()
        except Exception as error:
            if CONNECT_BACK not in str(error) or attempt == tries:
                raise
            time.sleep(2.0)
    raise AssertionError("unreachable")


def _kafkaTable(bootstrap: str, topic: str) -> pa.Table:
    records = readTopic(bootstrap, topic)
    return pa.table(
        {
            "id": pa.array([int(r.key or b"-1") for r in records], pa.int64()),
            "payload": pa.array([(r.value or b"").decode() for r in records], pa.string()),
        }
    )


def test_connect_files_postgres_kafka_exactly_once_across_a_server_sigkill(
    tmp_path: Path,
    servers: list[ConnectServer],
    sessions: list[Any],
    pg_url: str,
    pg_table: str,
    kafka_bootstrap: str,
) -> None:
    """register() on a Connect session, queries into twophase.files, twophase.postgres and
    twophase.kafka side by side, the server SIGKILLed (driver, workers and all) after the first
    commit decision of batch 1 in any of them; a restarted server and a new client session
    finish every query: each id once in each system, nothing left prepared or staged."""
    to = Targets(tmp_path, pg_url, pg_table, kafka_bootstrap, createTopic(kafka_bootstrap))
    once = tmp_path / "crashed"
    crash = {"TWOPHASE_CRASH_AT": "driver.afterDecision:1", "TWOPHASE_CRASH_ONCE_FILE": str(once)}
    first = ConnectServer(tmp_path, sys.executable, crash)
    servers.append(first)
    first.start("server-1")
    spark = _connect(first, sessions)
    twophase.register(spark)
    _startQueries(spark, to)
    returncode = first.wait(QUERY_TIMEOUT)
    assert once.exists() and once.read_text().strip() == "driver.afterDecision:1", (
        f"the crash point did not fire (exit {returncode}); {first.tail()}"
    )
    assert returncode == -9, f"expected the server to die by SIGKILL; {first.tail()}"

    second = ConnectServer(tmp_path, sys.executable)
    servers.append(second)
    second.start("server-2")
    spark = _connect(second, sessions)
    twophase.register(spark)
    # The metrics listener on a Connect client: Spark sends it the events, it reads the log.
    figures: list[Any] = []
    listener = twophase.attachMetrics(
        spark, str(tmp_path / "checkpoint-postgres"), callback=figures.append
    )
    for query in _startQueries(spark, to):
        assert query.awaitTermination(QUERY_TIMEOUT), f"a query did not drain; {second.tail()}"
        assert query.exception() is None, f"{query.exception()}; {second.tail()}"
    last = ROWS // ROWS_PER_BATCH - 1
    assert listener.awaitBatch(last, 60), f"no figures of batch {last} reached the client"
    spark.streams.removeListener(listener)
    assert listener.close(10)
    _superviseOnConnect(spark, tmp_path)
    spark.stop()
    rows = {m.batch.batchId: m.batch.rows for m in figures if m.batch is not None}
    assert rows.get(last) == ROWS_PER_BATCH, rows

    want = {"rows": ROWS, "duplicates": 0, "missing": 0, "unexpected": 0, "wrongPayloads": 0}
    assert exactlyOnceReport(FILES.read(tmp_path / "output"), ROWS) == want, second.tail()
    assert not FILES.prepared(tmp_path / "output", None)
    assert exactlyOnceReport(FILES.read(tmp_path / "wide"), ROWS) == want, second.tail()
    assert not FILES.prepared(tmp_path / "wide", None)
    # foreachBatch on the server: 8 partitions written by local[2]'s 2 slots, a file per task
    assert len(list((tmp_path / "wide").glob("*.parquet"))) == 2 * ROWS // ROWS_PER_BATCH
    assert pgIds(pg_url, to.table) == list(range(ROWS)), second.tail()
    assert exactlyOnceReport(_kafkaTable(kafka_bootstrap, to.topic), ROWS) == want
    with psycopg.connect(pg_url, autocommit=True) as conn:
        leftovers = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s",
            (f"tp1:{to.table.replace('_', '-')}:%",),
        ).fetchall()
    assert not leftovers, leftovers


def _superviseOnConnect(spark: Any, tmp_path: Path) -> None:
    """``twophase.supervise`` from a Connect client: a query that drains, and one whose bad
    option is classified fatal from the error's text alone (no Java chain reaches a Connect
    client), not restarted."""

    def start(options: dict[str, str], name: str) -> Any:
        writer = _sequence(spark).writeStream.format("twophase.files").options(**options)
        checkpoint = str(tmp_path / f"checkpoint-{name}")
        return _start(writer.option("checkpointLocation", checkpoint).trigger(availableNow=True))

    good = twophase.supervise(
        lambda: start({"path": str(tmp_path / "supervised")}, "supervised"),
        twophase.restarts.fixedDelay(2, 0.5),
    )
    assert good.awaitTermination(QUERY_TIMEOUT) and good.exception() is None
    assert good.restarts == []
    assert exactlyOnceReport(FILES.read(tmp_path / "supervised"), ROWS)["missing"] == 0
    bad = twophase.supervise(
        lambda: start({"path": str(tmp_path / "bad"), "format": "xml"}, "bad"),
        twophase.restarts.fixedDelay(2, 0.5),
    )
    with pytest.raises(twophase.QueryFailedError) as failed:
        bad.awaitTermination(QUERY_TIMEOUT)
    assert failed.value.code == "TWOPHASE_BAD_OPTION" and bad.restarts == []


def test_connect_register_says_what_to_install_when_the_server_lacks_twophase(
    tmp_path: Path, servers: list[ConnectServer], sessions: list[Any]
) -> None:
    """A server whose Python lacks twophase: register() fails at once, naming the client's
    version and where to install it, not later at writeStream.start()."""
    from twophase.spark.connect import ConnectServerError

    python = pythonWithoutTwophase(tmp_path / "bare")
    server = ConnectServer(tmp_path, str(python), {"PYTHONPATH": ""})
    servers.append(server)
    server.start("server")
    spark = _connect(server, sessions)
    with pytest.raises(ConnectServerError) as raised:
        twophase.register(spark)
    message = str(raised.value)
    assert f"install twophase=={twophase.__version__}" in message, message
    for where in ("server driver's Python", "executors' Python", "docs/spark-connect.md"):
        assert where in message, message
    assert raised.value.seen == {"client": twophase.__version__}
    spark.stop()
