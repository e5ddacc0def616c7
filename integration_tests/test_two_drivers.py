"""Two drivers on one checkpoint, on the S3 server and on local disk: never both commit.

1. Races without Spark, over many rounds: four processes creating one log record at once, and
   four drivers at once each claiming the log and deciding the same batch with its own
   transaction. Every round has one winner, and every driver that goes on to commit commits
   that winner's decision.
2. Under Spark, with the Kafka, PostgreSQL and files sinks (three queries in one application,
   ``integration_tests.driver_child``), the whole query on the store: Spark's checkpoint on
   ``s3a://``, the logs and the files sink's output on the S3 server. Driver A stands still at
   batch 1's decision with its transactions prepared (``TWOPHASE_CRASH_ACTION=pause``); driver
   B is started on the same checkpoints while A runs (a second driver mid-batch) and claims
   every log; A is then frozen by SIGSTOP while B drains the source, thawed, and let go on: it
   must stop, fenced, without committing anything of its own. Every row is then in every sink
   exactly once and nothing is left prepared. The same interleavings on local disk, without
   Spark, are tests/test_two_drivers.py.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from integration_tests.conftest import S3Service
from integration_tests.driver_child import hadoopVersion, s3aConf
from integration_tests.sink_outputs import FILES_SINK, exactlyOnceReport
from integration_tests.spark_processes import (
    QUERY_FAILED,
    REPO_ROOT,
    childEnvironment,
    killSession,
    makeSparkHome,
    resolvePackages,
    sessionProcesses,
)
from integration_tests.test_kafka_helpers import createTopic, readTopic
from integration_tests.test_kafka_spark import openTransactions, sequenceTable
from twophase.coordinator import DecisionLog, Driver, DriverFencedError
from twophase.coordinator.slots import SlotFenced
from twophase.coordinator.storage import LogStorage
from twophase.protocol import TaskResult
from twophase.verify.held import readSink

pytestmark = pytest.mark.timeout(900)

ROUNDS = 40
RACERS = 4
ROWS = 150
ROWS_PER_BATCH = 50
PAUSED_AT = "driver.beforeDecision:1"
"""Where driver A stands still: batch 1's transactions prepared, nothing decided."""
FENCED = "another driver took the decision log"
WANT = {"rows": ROWS, "duplicates": 0, "missing": 0, "unexpected": 0, "wrongPayloads": 0}


# ---------------------------------------------------------------------------- races


def _racer(
    kind: str, urls: list[str], env: dict[str, str], barrier: Any, out: Any, index: int
) -> None:
    """One process of a race: at each barrier, one attempt on the next round's log."""
    os.environ.update(env)
    for url in urls:
        barrier.wait(timeout=120)
        try:
            out.put((url, index, _attempt(kind, url, index)))
        except Exception as exc:  # the parent fails the round with it
            out.put((url, index, f"error {type(exc).__name__}: {exc}"))


def _attempt(kind: str, url: str, index: int) -> str:
    if kind == "publish":
        try:
            LogStorage(url, {}).publish("record.json", {"who": index}, exclusive=True, what="x")
            return "won"
        except FileExistsError:
            return "lost"
    from twophase.coordinator import Coordinator

    log = DecisionLog(url)
    driver = Driver(f"racer-{index}-{uuid.uuid4().hex[:6]}", "racer", os.getpid(), "racer")
    try:
        epoch = Coordinator(None, log, "race").holdLog(driver, None, 0)  # type: ignore[arg-type]
        result = TaskResult("race", "q", 0, 0, 0, {"who": index}, 1)
        state = log.decide(0, [result], queryId="q", epoch=epoch)
    except (DriverFencedError, SlotFenced):
        return "fenced"
    return f"commits {state.handles[0].handle['who']}"


def race(kind: str, base: str, env: dict[str, str]) -> list[dict[int, str]]:
    """``ROUNDS`` rounds of ``RACERS`` processes, each round on a log of its own."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(RACERS)
    out = context.Queue()
    urls = [f"{base}/round-{r:03d}" for r in range(ROUNDS)]
    racers = [
        context.Process(target=_racer, args=(kind, urls, env, barrier, out, i))
        for i in range(RACERS)
    ]
    for racer in racers:
        racer.start()
    rounds: dict[str, dict[int, str]] = {url: {} for url in urls}
    for _ in range(ROUNDS * RACERS):
        url, index, outcome = out.get(timeout=300)
        rounds[url][index] = outcome
    for racer in racers:
        racer.join(timeout=60)
    assert [r.exitcode for r in racers] == [0] * RACERS, "a racer failed or never ended"
    return [rounds[url] for url in urls]


def s3Environment(s3: S3Service) -> dict[str, str]:
    """How s3fs in another process (a racer, a Spark driver's Python) reaches the S3 server."""
    return {
        "AWS_ENDPOINT_URL": s3.endpoint,
        "AWS_ACCESS_KEY_ID": s3.accessKey,
        "AWS_SECRET_ACCESS_KEY": s3.secretKey,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    if request.param == "local":
        yield str(tmp_path / "race"), {}
        return
    s3: S3Service = request.getfixturevalue("s3")
    prefix = f"it-race/{uuid.uuid4().hex[:10]}"
    yield s3.url(prefix), s3Environment(s3)
    s3.filesystem().rm(f"{s3.bucket}/{prefix}", recursive=True)


def test_concurrent_exclusive_creates_have_one_winner_every_round(
    store: tuple[str, dict[str, str]],
) -> None:
    base, env = store
    rounds = race("publish", base, env)
    winners = [sorted(i for i, o in r.items() if o == "won") for r in rounds]
    assert all(len(w) == 1 for w in winners), winners
    assert all(set(r.values()) <= {"won", "lost"} for r in rounds), rounds


def test_concurrent_drivers_commit_one_decision_every_round(
    store: tuple[str, dict[str, str]],
) -> None:
    base, env = store
    rounds = race("decide", base, env)
    for number, outcomes in enumerate(rounds):
        commits = {o for o in outcomes.values() if o.startswith("commits ")}
        assert len(commits) == 1 and set(outcomes.values()) <= commits | {"fenced"}, (
            number,
            outcomes,
        )
        os.environ.update(env)
        state = DecisionLog(f"{base}/round-{number:03d}").state(0)
        assert state is not None and f"commits {state.handles[0].handle['who']}" in commits


# ---------------------------------------------------------------------------- under Spark


@dataclass
class Sink:
    """One sink of the drivers' application: how the child writes it, how the test reads it."""

    spec: str
    options: dict[str, str]
    read: Callable[[], pa.Table]
    leftovers: Callable[[], list[Any]]
    columns: dict[str, str] | None = None


@pytest.fixture
def kafkaSink(kafka_bootstrap: str) -> Sink:
    topic = createTopic(kafka_bootstrap, partitions=2, prefix="it-drivers")
    prefix = f"it-drivers-{uuid.uuid4().hex[:8]}"
    return Sink(
        "twophase.spark.kafka:KafkaSink",
        {
            "kafka.bootstrap.servers": kafka_bootstrap,
            "topic": topic,
            "transactionalIdPrefix": prefix,
        },
        lambda: sequenceTable(readTopic(kafka_bootstrap, topic)),
        lambda: openTransactions(kafka_bootstrap, prefix),
        {"key": "CAST(id AS STRING)", "value": "payload"},
    )


@pytest.fixture
def postgresSink(pg_url: str, pg_table: str) -> Sink:
    sinkId = f"it-drivers-{uuid.uuid4().hex[:8]}"

    def read() -> pa.Table:
        with psycopg.connect(pg_url) as conn:
            rows = conn.execute(f"SELECT id, payload FROM {pg_table}").fetchall()
        return pa.table(
            {"id": pa.array([r[0] for r in rows], pa.int64()), "payload": [r[1] for r in rows]}
        )

    def prepared() -> list[Any]:
        with psycopg.connect(pg_url) as conn:
            return conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"tp1:{sinkId}:%",)
            ).fetchall()

    options = {"url": pg_url, "table": pg_table, "createTable": "true", "sinkId": sinkId}
    return Sink("twophase.spark.declared:PostgresSink", options, read, prepared)


def s3FilesSink(s3: S3Service, prefix: str) -> Sink:
    from twophase.sinks.files.s3 import S3Calls

    options = {"path": s3.url(f"{prefix}/out"), **s3.options()}

    def read() -> pa.Table:
        table, _ = readSink("files", options, ("id", "payload"), pa.schema([("id", pa.int64())]))
        return table.select(["id", "payload"])

    calls = S3Calls(s3.filesystem())
    return Sink(
        FILES_SINK,
        options,
        read,
        lambda: [u.key for u in calls.pendingUploads(s3.bucket, prefix + "/")],
    )


class Drivers:
    """Driver processes of one application spec, each in a session of its own."""

    def __init__(self, workdir: Path, sinks: dict[str, Sink], root: str, env: dict[str, str]):
        self.workdir = workdir
        self.sinks = sinks
        self.root = root
        self.env = env
        self.pauses = workdir / "pauses"
        self.home = makeSparkHome(workdir / "spark-home")

    def start(
        self,
        name: str,
        *,
        paused: bool,
        s3a: dict[str, str] | None = None,
        startWhen: Path | None = None,
    ) -> Any:
        spec = {
            "startWhen": None if startWhen is None else str(startWhen),
            "checkpointRoot": self.root,
            "rows": ROWS,
            "rowsPerBatch": ROWS_PER_BATCH,
            "partitions": 2,
            "result": str(self.workdir / f"{name}.json"),
            "s3a": s3a,
            "sinks": {
                key: {"spec": s.spec, "options": s.options, "columns": s.columns}
                for key, s in self.sinks.items()
            },
        }
        specPath = self.workdir / f"{name}-spec.json"
        specPath.write_text(json.dumps(spec))
        crash = (
            {"TWOPHASE_CRASH_AT": PAUSED_AT, "TWOPHASE_CRASH_ACTION": f"pause:{self.pauses}"}
            if paused
            else {}
        )
        env = {**childEnvironment(self.workdir, self.home, crash), **self.env}
        log = (self.workdir / f"{name}.log").open("w")
        return subprocess.Popen(
            [sys.executable, "-m", "integration_tests.driver_child", str(specPath)],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def resolveS3a(self) -> None:
        """The S3A connector's packages in the shared cache before two drivers start at once
        (``spark_processes.resolvePackages``): the two drivers' own resolutions then only read
        the cache, since two Ivy resolutions downloading into one empty cache at once spoil
        each other's files."""
        jar = f"org.apache.hadoop_hadoop-aws-{hadoopVersion()}.jar"
        resolvePackages(s3aConf("http://127.0.0.1:1", "unused", "unused"), jar)

    def outcome(self, name: str) -> dict[str, str]:
        path = self.workdir / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def tail(self, name: str) -> str:
        lines = (self.workdir / f"{name}.log").read_text(errors="replace").splitlines()
        return "\n".join(lines[-60:])

    def awaitPaused(self, child: Any, timeout: float = 300.0) -> None:
        """Until every query of ``child`` stands still at its pause point."""
        deadline = time.monotonic() + timeout
        while len(list(self.pauses.glob("paused-*"))) < len(self.sinks):
            assert child.poll() is None, f"A ended before its pause:\n{self.tail('a')}"
            assert time.monotonic() < deadline, f"A never paused:\n{self.tail('a')}"
            time.sleep(0.3)

    def release(self) -> None:
        (self.pauses / "release").touch()

    def wait(self, child: Any, name: str, timeout: float = 400.0) -> int:
        try:
            return int(child.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} did not finish:\n{self.tail(name)}") from None
        finally:
            killSession(child.pid)

    def check(self, a: int, b: int) -> None:
        """B drained every query; every query of A stopped fenced; each sink holds every row
        once and nothing prepared."""
        outcome = self.outcome("b")
        assert b == 0 and set(outcome.values()) == {"ok"}, f"{outcome}\n{self.tail('b')}"
        fenced = self.outcome("a")
        assert a == QUERY_FAILED and len(fenced) == len(self.sinks), self.tail("a")
        assert all(FENCED in error for error in fenced.values()), fenced
        for name, sink in self.sinks.items():
            assert exactlyOnceReport(sink.read(), ROWS) == WANT, name
            assert sink.leftovers() == [], f"{name} left prepared work"


def signalSession(child: Any, signum: int) -> None:
    for pid in sessionProcesses(child.pid):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def test_a_second_driver_mid_batch_then_the_first_frozen_and_thawed_on_s3(
    tmp_path: Path, s3: S3Service, kafkaSink: Sink, postgresSink: Sink
) -> None:
    """The whole query on the store: Spark's checkpoint on ``s3a://``, the logs and the files
    sink's output on the S3 server. B starts while A is mid-batch and running; once B holds
    every log, A is frozen by SIGSTOP while B drains, then thawed and let go on."""
    prefix = f"it-drivers/{uuid.uuid4().hex[:10]}"
    sinks = {"kafka": kafkaSink, "postgres": postgresSink, "files": s3FilesSink(s3, prefix)}
    root = f"s3a://{s3.bucket}/{prefix}/checkpoints"
    drivers = Drivers(tmp_path, sinks, root, s3Environment(s3))
    s3a = {"endpoint": s3.endpoint, "key": s3.accessKey, "secret": s3.secretKey}
    fs = s3.filesystem()
    go = tmp_path / "b-go"
    drivers.resolveS3a()
    a = drivers.start("a", paused=True, s3a=s3a)
    b = drivers.start("b", paused=False, s3a=s3a, startWhen=go)  # its session only, for now
    try:
        drivers.awaitPaused(a)
        go.touch()  # B's queries start while A is mid-batch
        deadline = time.monotonic() + 300
        claims = f"{s3.bucket}/{prefix}/checkpoints/*/twophase/*/run-0000000002.json"
        while len(fs.glob(claims)) < len(sinks):  # B holds every log, A still running
            assert b.poll() is None, drivers.tail("b")
            assert time.monotonic() < deadline, drivers.tail("b")
            time.sleep(0.3)
            fs.invalidate_cache()
        signalSession(a, signal.SIGSTOP)  # the whole driver: JVM, workers, the paused commits
        codeB = drivers.wait(b, "b")
        signalSession(a, signal.SIGCONT)
        drivers.release()
        codeA = drivers.wait(a, "a")
    finally:
        signalSession(a, signal.SIGCONT)
        killSession(a.pid)
        killSession(b.pid)
    drivers.check(codeA, codeB)
    fs.rm(f"{s3.bucket}/{prefix}", recursive=True)
