"""``twophase.supervise`` and ``stopGracefully`` against the real servers, in one shared session.

- a PostgreSQL outage fails the query; supervision restarts it in the same session until the
  server is back, and the table holds every row once;
- refused credentials are fatal: no restart, the error says the fix, nothing is written;
- a strategy that runs out gives up with the failure's own message;
- a clean stop, in either path, of a query writing PostgreSQL, Kafka and files under one
  decision, leaves nothing in doubt: ``twophase status`` and ``twophase doctor`` exit 0, and
  the next start goes on exactly once;
- a stop whose timeout is too short interrupts the batch, says so, and the next start recovers;
- in a driver process of its own: Kafka transactions the broker aborted after their decision
  are written again by a supervised restart, and a SIGTERM to the driver JVM alone stops a
  query cleanly (a SIGTERM to the Python process is the chaos profile's ``stop`` event).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import twophase
from integration_tests.chaos.runner import batchesDone
from integration_tests.spark_processes import sessionProcesses, sharedSession
from integration_tests.test_kafka_participant import awaitState
from integration_tests.toxiproxy import Toxiproxy, proxiedUrl
from twophase import cli, restarts, verify
from twophase.coordinator import DecisionLog
from twophase.sinks.relational.naming import sinkPrefix

ROWS_PER_BATCH = 500


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from sharedSession("twophase-supervise")


def sequence(spark: Any, rows: int | None, partitions: int = 2) -> Any:
    reader = (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", ROWS_PER_BATCH)
        .option("numPartitions", partitions)
    )
    if rows is not None:
        reader = reader.option("totalRows", rows)
    return reader.load()


def waitFor(condition: Callable[[], bool], what: str, limit: float = 120.0) -> float:
    """Poll ``condition`` until true; returns when it became so (monotonic)."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic()


def preparedOf(pgUrl: str, sinkId: str) -> list[str]:
    with psycopg.connect(pgUrl, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (sinkPrefix(sinkId) + "%",)
        ).fetchall()
    return [r[0] for r in rows]


def postgresOptions(url: str, table: str, ckpt: Path, sinkId: str) -> dict[str, str]:
    return {
        "url": url,
        "table": table,
        "createTable": "true",
        "sinkId": sinkId,
        "connectTimeout": "2",
        "connectRetrySeconds": "1",
        "socketTimeout": "3",
        "commitTimeoutSeconds": "4",
        "checkpointLocation": str(ckpt),
    }


def test_an_outage_fails_the_query_and_supervision_restarts_it_until_the_server_is_back(
    spark: Any, pg_url: str, pg_table: str, proxies: Toxiproxy, tmp_path: Path
) -> None:
    proxy = proxies.proxy("postgres")
    ckpt = tmp_path / "ckpt"
    sinkId = f"sv-{uuid.uuid4().hex[:8]}"
    options = postgresOptions(proxiedUrl(pg_url, proxy), pg_table, ckpt, sinkId)
    rows = 8 * ROWS_PER_BATCH

    def start() -> Any:
        return (
            sequence(spark, rows)
            .writeStream.format("twophase.postgres")
            .options(**options)
            .trigger(availableNow=True)
            .start()
        )

    supervised = twophase.supervise(start, restarts.fixedDelay(30, 1.0))
    waitFor(lambda: batchesDone(ckpt) >= 2, "two batches")
    proxy.disable()
    waitFor(lambda: bool(supervised.restarts), "a supervised restart")
    time.sleep(3)  # restarts keep failing while it is down
    proxy.enable()
    healed = time.monotonic()
    before = batchesDone(ckpt)
    resumed = waitFor(lambda: batchesDone(ckpt) > before, "a batch after the outage", 90)
    supervised.awaitTermination(240)
    assert supervised.exception() is None
    assert supervised.restarts and supervised.query is not None
    codes = {r.code for r in supervised.restarts}
    assert codes <= {"TWOPHASE_UNREACHABLE", "TWOPHASE_COMMIT_FAILED"}, supervised.restarts
    assert all(r.firstLine.startswith("[TWOPHASE_") for r in supervised.restarts)
    report = verify.verify(
        "sequence", {"start": "0", "end": str(rows)}, "postgres", {"url": pg_url, "table": pg_table}
    )
    assert report.ok, report
    assert preparedOf(pg_url, sinkId) == []
    import prometheus_client

    counted = sum(
        prometheus_client.REGISTRY.get_sample_value(
            "twophase_restarts_total", {"query": supervised.id, "reason": code}
        )
        or 0
        for code in codes
    )
    assert counted == len(supervised.restarts)
    print(
        f"supervised restarts: {len(supervised.restarts)}; first batch {resumed - healed:.1f} s "
        "after the server was back"
    )


def test_refused_credentials_are_fatal_and_say_the_fix_without_a_restart(
    spark: Any, pg_url: str, pg_table: str, tmp_path: Path
) -> None:
    secret = "Wr0ng-Secret-of-supervise"
    ckpt = tmp_path / "ckpt"
    options = postgresOptions(pg_url, pg_table, ckpt, f"sv-{uuid.uuid4().hex[:8]}")
    options["password"] = secret

    def start() -> Any:
        return (
            sequence(spark, 2 * ROWS_PER_BATCH)
            .writeStream.format("twophase.postgres")
            .options(**options)
            .trigger(availableNow=True)
            .start()
        )

    supervised = twophase.supervise(start, restarts.fixedDelay(5, 0.2))
    with pytest.raises(twophase.QueryFailedError) as failed:
        supervised.awaitTermination(120)
    error = failed.value
    assert error.code == "TWOPHASE_CREDENTIALS" and not error.recoverable and not error.gaveUp
    assert "Fix:" in str(error) and "not recoverable" in str(error)
    assert secret not in str(error)
    assert supervised.restarts == [] and not supervised.isActive
    assert batchesDone(ckpt) == 0


def test_a_strategy_that_runs_out_gives_up_with_the_failures_own_message(
    spark: Any, pg_url: str, pg_table: str, proxies: Toxiproxy, tmp_path: Path
) -> None:
    proxy = proxies.proxy("postgres")
    proxy.disable()
    ckpt = tmp_path / "ckpt"
    options = postgresOptions(
        proxiedUrl(pg_url, proxy), pg_table, ckpt, f"sv-{uuid.uuid4().hex[:8]}"
    )

    def start() -> Any:
        return (
            sequence(spark, 2 * ROWS_PER_BATCH)
            .writeStream.format("twophase.postgres")
            .options(**options)
            .trigger(availableNow=True)
            .start()
        )

    supervised = twophase.supervise(start, restarts.fixedDelay(1, 0.2))
    with pytest.raises(twophase.QueryFailedError) as failed:
        supervised.awaitTermination(120)
    error = failed.value
    assert error.gaveUp and error.recoverable and error.code == "TWOPHASE_UNREACHABLE"
    assert "gave up after 1 restart" in str(error)
    assert str(error).startswith("[TWOPHASE_UNREACHABLE]")
    assert len(supervised.restarts) == 1


def multiStream(spark: Any, rows: int | None) -> Any:
    from pyspark.sql import functions as F

    return sequence(spark, rows).select(
        F.struct("id", "payload").alias("orders"),
        F.struct(F.col("id").cast("string").alias("key"), F.col("payload").alias("value")).alias(
            "events"
        ),
        F.struct("id", "payload").alias("archive"),
    )


def multiOptions(pgUrl: str, table: str, bootstrap: str, topic: str, out: Path) -> dict[str, str]:
    return {
        "targets": "orders=postgres,events=kafka,archive=files",
        "orders.url": pgUrl,
        "orders.table": table,
        "orders.createTable": "true",
        "events.kafka.bootstrap.servers": bootstrap,
        "events.topic": topic,
        "archive.path": str(out),
    }


def runCommand(*argv: str) -> int:
    return int(cli.main(list(argv)))


@pytest.mark.parametrize("path", ["format", "foreachBatch"])
def test_a_clean_stop_leaves_nothing_in_doubt_in_any_target_and_the_next_start_goes_on(
    spark: Any,
    pg_url: str,
    pg_table: str,
    kafka_bootstrap: str,
    tmp_path: Path,
    path: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ckpt = tmp_path / "ckpt"
    topic = f"it-supervise-{uuid.uuid4().hex[:8]}"
    options = multiOptions(pg_url, pg_table, kafka_bootstrap, topic, tmp_path / "out")
    options["checkpointLocation"] = str(ckpt)
    rows = 10 * ROWS_PER_BATCH

    def start(total: int | None) -> Any:
        stream = multiStream(spark, total)
        if path == "format":
            writer = stream.writeStream.format("twophase.multi").options(**options)
        else:
            writer = stream.writeStream.foreachBatch(
                twophase.foreachBatch("twophase.multi", options)
            )
        if total is not None:
            writer = writer.trigger(availableNow=True)
        return writer.option("checkpointLocation", str(ckpt)).start()

    supervised = twophase.supervise(lambda: start(None), restarts.none())
    waitFor(lambda: batchesDone(ckpt) >= 2, "two batches")
    waitFor(lambda: supervised.status["isTriggerActive"], "a batch running")
    assert supervised.stop(60) is True
    assert not supervised.isActive and supervised.exception() is None
    assert supervised.query.exception() is None
    stoppedAt = batchesDone(ckpt)

    secrets = ["--sink-option", f"orders.url={pg_url}"]
    assert runCommand("status", "--checkpoint", str(ckpt)) == 0, capsys.readouterr().out
    assert runCommand("doctor", "--checkpoint", str(ckpt), *secrets) == 0, capsys.readouterr().out
    capsys.readouterr()

    drained = start(rows)  # the same checkpoint, to the end of the source
    assert drained.awaitTermination(240)
    assert drained.exception() is None and batchesDone(ckpt) > stoppedAt
    report = verify.verify(
        "sequence", {"start": "0", "end": str(rows)}, "multi", {**options, "orders.url": pg_url}
    )
    assert report.ok, report


def test_a_stop_timeout_too_short_for_the_batch_stops_it_mid_batch_and_says_what_comes_next(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = tmp_path / "ckpt"
    out = tmp_path / "out"
    rows = 2 * ROWS_PER_BATCH

    def start(total: int | None) -> Any:
        from pyspark.sql import functions as F

        slow = F.udf(lambda v: (time.sleep(0.012), v)[1], "string")  # 3 s a task
        writer = (
            sequence(spark, total)
            .withColumn("payload", slow("payload"))
            .writeStream.format("twophase.files")
            .option("path", str(out))
            .option("checkpointLocation", str(ckpt))
        )
        return writer.start() if total is None else writer.trigger(availableNow=True).start()

    query = start(None)
    waitFor(lambda: batchesDone(ckpt) >= 1, "a batch")  # the next one has just begun
    waitFor(lambda: query.status["message"] == "Processing new data", "a batch running")
    time.sleep(2)  # past its planning: its tasks run
    with caplog.at_level(logging.WARNING, logger="twophase"):
        assert twophase.stopGracefully(query, timeout=1.0) is False
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "stopped mid-batch" in said and "the next start" in said
    assert "twophase status --checkpoint" in said
    with pytest.raises(Exception, match="timeout"):
        twophase.stopGracefully(query, timeout=0)
    drained = start(rows)
    assert drained.awaitTermination(240)
    report = verify.verify(
        "sequence", {"start": "0", "end": str(rows)}, "files", {"path": str(out)}
    )
    assert report.ok, report


CHILD = """
import sys, time
from pyspark.sql import SparkSession, functions as F
import twophase

work, bootstrap, topic = sys.argv[1:4]
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
twophase.register(spark)


def kafka():
    return (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", 500).option("totalRows", 2000).option("numPartitions", 2).load()
        .selectExpr("cast(id AS string) AS key", "payload AS value")
        .writeStream.format("twophase.kafka")
        .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
        .option("kafka.transaction.timeout.ms", "3000")
        .option("checkpointLocation", f"{work}/kafka-checkpoint")
        .trigger(availableNow=True).start()
    )


query = twophase.supervise(kafka, twophase.restarts.fixedDelay(3, 1.0))
query.awaitTermination()
print("RESTARTS " + ",".join(r.code for r in query.restarts), flush=True)

slow = F.udf(lambda v: (time.sleep(0.004), v)[1], "string")


def files():
    return (
        spark.readStream.format("twophase.sequence").option("rowsPerBatch", 500).load()
        .withColumn("payload", slow("payload"))
        .writeStream.format("twophase.files").option("path", f"{work}/out")
        .option("checkpointLocation", f"{work}/checkpoint").start()
    )


query = twophase.supervise(files)
while not query.lastProgress:
    time.sleep(0.2)
print("READY", flush=True)
query.awaitTermination()
print(f"ENDED stopped={query.stopped} restarts={len(query.restarts)}", flush=True)
"""


def decidedTransactions(checkpoint: Path) -> list[str]:
    """The transactional ids of the last decided batch of the one sink writing ``checkpoint``,
    from its decision log."""
    (location,) = (checkpoint / "twophase").iterdir()
    log = DecisionLog(str(location))
    batch = log.lastDecided()
    assert batch is not None, f"no decided batch in {location}"
    state = log.state(batch)
    assert state is not None and state.handles, f"batch {batch} names no transaction"
    return [str(h.handle["transactionalId"]) for h in state.handles]


def javaChildOf(pid: int, parent: int) -> bool:
    """Whether process ``pid`` is a JVM that ``parent`` started."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    return comm == "java" and int(stat[stat.rindex(")") + 2 :].split()[1]) == parent


def test_a_driver_rewrites_what_the_broker_aborted_and_stops_cleanly_on_a_sigterm_to_its_jvm(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """One supervised driver, two queries.

    The first stands still between batch 1's decision and its commit for longer than the
    transaction timeout (an outage of the driver's reach of the broker): the broker aborts the
    decided transactions, the commit fails with RewritePendingError, and supervision restarts
    the query, whose replay writes them again: every record once for a read_committed reader.

    Then, as under ``spark-submit``, where the JVM is the main process: a SIGTERM that reaches
    only the JVM stops the second query between batches, and the program ends of itself.
    """
    import os
    import signal
    import subprocess
    import sys

    import pyarrow as pa

    from integration_tests.sink_outputs import exactlyOnceReport
    from integration_tests.test_kafka_helpers import createTopic, readTopic

    topic = createTopic(kafka_bootstrap)
    paused = tmp_path / "paused"
    script = tmp_path / "supervised_child.py"
    script.write_text(CHILD)
    env = dict(
        os.environ,
        PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable),
        TWOPHASE_CRASH_AT="driver.afterDecision:1",
        TWOPHASE_CRASH_ACTION=f"pause:{paused}",
    )
    child = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), kafka_bootstrap, topic],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        waitFor(lambda: any(paused.glob("paused-*")), "the pause after batch 1's decision", 120)
        for transactionalId in decidedTransactions(tmp_path / "kafka-checkpoint"):
            # the timeout (3 s), then the broker's sweep of timed-out transactions
            awaitState(kafka_bootstrap, transactionalId, "CompleteAbort", 60)
        (paused / "release").touch()
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line)
            if line.startswith("READY"):
                break
        jvm = next(pid for pid in sessionProcesses(child.pid) if javaChildOf(pid, child.pid))
        os.kill(jvm, signal.SIGTERM)
        rest, _ = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    output = "".join(lines) + rest
    assert child.returncode == 0, output[-3000:]
    assert "RESTARTS TWOPHASE_REWRITE_PENDING" in output, output[-3000:]
    records = readTopic(kafka_bootstrap, topic)
    table = pa.table(
        {
            "id": pa.array([int(r.key) for r in records], pa.int64()),
            "payload": pa.array([(r.value or b"").decode() for r in records], pa.string()),
        }
    )
    report = exactlyOnceReport(table, 2000)
    assert report["missing"] == report["duplicates"] == 0, report
    assert "ENDED stopped=True restarts=0" in output, output[-3000:]
    assert cli.main(["status", "--checkpoint", str(tmp_path / "checkpoint")]) == 0
