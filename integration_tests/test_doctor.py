"""``twophase doctor`` against the real PostgreSQL and Kafka: each leftover left on purpose.

No Spark session: each test builds a query's checkpoint as the driver does (``sink.json``, a
claimed decision log), prepares transactions with the sink's own writer, records a decision
without committing it, prepares one without deciding, leaves one with the sink's prefix that
no log knows, and then checks what doctor finds, its exit status, its JSON, that the fix it
names settles the finding, and that a password given on the command line never shows.
"""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from integration_tests.checkpoints import SinkCheckpoint
from integration_tests.conftest import PgRole
from integration_tests.test_kafka_helpers import createTopic
from twophase import cli
from twophase.clients.kafka import brokerTransactionMaxTimeoutMs
from twophase.protocol import TransactionContext
from twophase.sinks.postgres import validateTarget
from twophase.sinks.relational.naming import sinkPrefix
from twophase.spark.declared import PostgresSink
from twophase.spark.kafka import KafkaSink


def run(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def findings(text: str) -> list[dict[str, Any]]:
    [sink] = json.loads(text)["sinks"]
    return list(sink["findings"])


def byKind(found: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for finding in found:
        kinds.setdefault(finding["finding"], []).append(finding)
    return kinds


def closedPort() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- PostgreSQL ---------------------------------------------------------------------------------


@pytest.fixture
def pgUser(pg_role: PgRole) -> PgRole:
    """A role of the test's own with a password nothing else contains, and its table."""
    return pg_role


def pgSinkCheckpoint(pg_url: str, table: str, tmp_path: Path) -> SinkCheckpoint:
    sink = PostgresSink(
        {
            "url": pg_url,
            "table": table,
            "checkpointLocation": str(tmp_path / "ckpt"),
            "sinkId": table.replace("_", "-"),
        }
    )
    return SinkCheckpoint(sink, tmp_path / "ckpt")


def rows(*ids: int) -> pa.RecordBatch:
    return pa.record_batch(
        {"id": pa.array(ids, pa.int64()), "payload": pa.array([f"row-{i}" for i in ids])}
    )


def prepareOn(writer: Any, ctx: TransactionContext, batch: pa.RecordBatch) -> dict[str, Any]:
    txn = writer.beginTransaction(ctx)
    writer.write(txn, batch)
    handle: dict[str, Any] = writer.preCommit(txn)
    return handle


def test_postgres_leftovers_are_found_with_their_fix_and_no_password_shows(
    pgUser: PgRole, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pg_url, pgTable, password = pgUser.url, pgUser.table, pgUser.password
    query = pgSinkCheckpoint(pg_url, pgTable, tmp_path)
    writer = query.sink.createWriter()
    decided = prepareOn(writer, query.context(0, 0), rows(1))
    query.log.decide(0, [query.result(0, 0, decided)])  # the driver died before committing
    undecided = prepareOn(writer, query.context(1, 0), rows(2))  # died before deciding
    stagedSink = PostgresSink({**query.sink.options, "commitMode": "staged"})
    validateTarget(stagedSink.settings(), rows(0).schema)  # creates the staging tables
    staged = prepareOn(stagedSink.createWriter(), query.context(1, 1), rows(3, 4))
    byHand = f"{sinkPrefix(query.sinkId)}by-hand"
    with psycopg.connect(pg_url) as conn:
        conn.execute(sql.SQL("INSERT INTO {} VALUES (99, 'x')").format(sql.Identifier(pgTable)))
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(byHand)))

    ckpt = str(query.path)
    status, text = run(
        "doctor", "--checkpoint", ckpt, "--json", "--option", f"password={password}",
        capsys=capsys,
    )  # fmt: skip
    assert status == 1, text
    assert password not in text
    kinds = byKind(findings(text))
    assert sorted(kinds) == ["decided-unfinished", "undecided", "unknown-to-log"]
    [unfinished] = kinds["decided-unfinished"]
    assert unfinished["batchId"] == 0 and unfinished["stillHeld"] == 1
    assert [h["id"] for h in unfinished["held"]] == [decided["gid"]]
    assert unfinished["fix"].startswith(
        f"twophase recover --checkpoint {ckpt} --sink-id {query.sinkId} --sink-option password=***"
    )
    orphans = {f["held"][0]["id"]: f for f in kinds["undecided"]}
    assert set(orphans) == {undecided["gid"], staged["token"]}
    assert orphans[undecided["gid"]]["held"][0]["what"] == "prepared transaction"
    assert 0 <= orphans[undecided["gid"]]["ageSeconds"] < 300
    assert orphans[staged["token"]]["held"][0]["detail"].startswith("2 row(s) in ")
    [unknown] = kinds["unknown-to-log"]
    assert unknown["held"][0]["id"] == byHand
    assert "not one the sink makes" in unknown["summary"]

    # The table for people, with the password in the url this time.
    status, text = run("doctor", "--checkpoint", ckpt, "--option", f"url={pg_url}", capsys=capsys)
    assert status == 1 and password not in text
    assert f"sink {query.sinkId}: postgres at " in text and "decided-unfinished" in text

    # The fix it names settles everything: commit the decided, roll back the rest.
    status, text = run(
        "recover", "--checkpoint", ckpt, "--sink-id", query.sinkId,
        "--option", f"password={password}",
        capsys=capsys,
    )  # fmt: skip
    assert status == 0, text
    status, text = run(
        "doctor", "--checkpoint", ckpt, "--json", "--option", f"password={password}",
        capsys=capsys,
    )  # fmt: skip
    assert status == 0 and [f["finding"] for f in findings(text)] == ["clean"], text
    with psycopg.connect(pg_url) as conn:
        ids = conn.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(pgTable)))
        assert [r[0] for r in ids.fetchall()] == [1]


def test_postgres_unreachable_or_refusing_cannot_be_checked_in_one_line(
    pgUser: PgRole, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    query = pgSinkCheckpoint(pgUser.url, pgUser.table, tmp_path)
    secret = "N0t-the-Passw0rd"
    params = conninfo_to_dict(pgUser.url)
    down = f"postgresql://{params['user']}:{secret}@127.0.0.1:{closedPort()}/{params['dbname']}"
    status, text = run(
        "doctor", "--checkpoint", str(query.path), "--option", f"url={down}", capsys=capsys
    )
    assert status == 2, text
    assert secret not in text and "Traceback" not in text
    [line] = [x for x in text.splitlines() if "cannot check" in x]
    assert "is unreachable" in line and "127.0.0.1" in line and "Fix: start the server" in line
    status, text = run(
        "doctor", "--checkpoint", str(query.path), "--json", "--option", f"password={secret}",
        capsys=capsys,
    )  # fmt: skip
    assert status == 2 and secret not in text and "Traceback" not in text
    [sink] = json.loads(text)["sinks"]
    assert (
        sink["status"] == "cannot-check"
        and "password authentication failed" in (sink["cannotCheck"])
    )


# -- Kafka --------------------------------------------------------------------------------------


def openTransaction(bootstrap: str, transactionalId: str, topic: str, partition: int) -> Producer:
    """A producer of someone else's, its transaction left open with one record in it."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactionalId, "log_level": 0}
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=partition)
    producer.flush(60)
    return producer


def test_kafka_leftovers_stalls_and_timeouts_are_found_and_recover_settles_ours(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = createTopic(kafka_bootstrap, partitions=4)
    prefix = f"it-doctor-{uuid.uuid4().hex[:8]}"
    secret = "Sasl-Secret-0f-doctor"
    # A bounded timeout the broker accepts (services may lower transaction.max.timeout.ms).
    timeoutMs = min(120_000, brokerTransactionMaxTimeoutMs({"bootstrap.servers": kafka_bootstrap}))
    sink = KafkaSink(
        {
            "kafka.bootstrap.servers": kafka_bootstrap,
            "topic": topic,
            "transactionalIdPrefix": prefix,
            "kafka.transaction.timeout.ms": str(timeoutMs),
            "checkpointLocation": str(tmp_path / "ckpt"),
        }
    )
    query = SinkCheckpoint(sink, tmp_path / "ckpt")
    writer = sink.createWriter()

    def prepare(batch: int, partition: int) -> dict[str, Any]:
        txn = writer.beginTransaction(query.context(batch, partition))
        writer.write(txn, pa.RecordBatch.from_pydict({"value": ["v"], "partition": [partition]}))
        handle: dict[str, Any] = writer.preCommit(txn)
        return handle

    decided = prepare(0, 0)
    # A second task of the batch whose result never reached the driver (batch N+1 would take
    # over this process's pooled producers, which only happens once N is committed).
    undecided = prepare(0, 1)
    query.log.decide(0, [query.result(0, 0, decided)])
    foreign = openTransaction(kafka_bootstrap, f"{prefix}-by-hand", topic, 2)
    other = openTransaction(kafka_bootstrap, f"other-{prefix}", topic, 3)
    try:
        ckpt = str(query.path)
        status, text = run(
            "doctor", "--checkpoint", ckpt, "--json",
            "--option", f"kafka.sasl.password={secret}",
            capsys=capsys,
        )  # fmt: skip
        assert status == 1, text
        assert secret not in text
        kinds = byKind(findings(text))
        assert sorted(kinds) == ["decided-unfinished", "foreign", "stalled-elsewhere", "undecided"]
        [unfinished] = kinds["decided-unfinished"]
        [held] = unfinished["held"]
        assert held["id"] == decided["transactionalId"] and held["state"] == "Ongoing"
        assert 0 < unfinished["abortsInSeconds"] <= timeoutMs / 1000
        assert [(s["topic"], s["partition"]) for s in held["stalledPartitions"]] == [(topic, 0)]
        [orphan] = kinds["undecided"]
        assert orphan["held"][0]["id"] == undecided["transactionalId"]
        assert orphan["held"][0]["since"] is not None
        assert 0 < orphan["abortsInSeconds"] <= timeoutMs / 1000
        stall = orphan["held"][0]["stalledPartitions"][0]
        assert (stall["partition"], stall["lastStableOffset"]) == (1, 0)
        assert stall["highWatermark"] >= 1
        assert "read_committed readers of" in orphan["summary"]
        [stranger] = kinds["foreign"]
        assert stranger["held"][0]["id"] == f"{prefix}-by-hand"
        assert "recovery never fences it" in stranger["summary"]
        [elsewhere] = kinds["stalled-elsewhere"]
        assert [s["partition"] for s in elsewhere["stalledPartitions"]] == [3]

        status, text = run("doctor", "--checkpoint", ckpt, capsys=capsys)
        assert status == 1 and "stalls read_committed readers of" in text

        status, text = run("recover", "--checkpoint", ckpt, capsys=capsys)
        assert status == 0, text
        status, text = run("doctor", "--checkpoint", ckpt, "--json", capsys=capsys)
        # Recovery never touches an id the sink does not make: still there, still exit 1.
        assert status == 1 and sorted(byKind(findings(text))) == ["foreign", "stalled-elsewhere"]
    finally:
        foreign.abort_transaction(60)
        other.abort_transaction(60)
    status, text = run("doctor", "--checkpoint", ckpt, "--json", capsys=capsys)
    assert status == 0 and [f["finding"] for f in findings(text)] == ["clean"], text


def test_kafka_unreachable_cannot_be_checked_in_one_line(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = KafkaSink(
        {
            "kafka.bootstrap.servers": kafka_bootstrap,
            "topic": "unused",
            "checkpointLocation": str(tmp_path / "ckpt"),
        }
    )
    query = SinkCheckpoint(sink, tmp_path / "ckpt")
    down = f"127.0.0.1:{closedPort()}"
    status, text = run(
        "doctor", "--checkpoint", str(query.path),
        "--option", f"kafka.bootstrap.servers={down}", "--option", "requestTimeoutSeconds=2",
        capsys=capsys,
    )  # fmt: skip
    assert status == 2, text
    assert "Traceback" not in text
    [line] = [x for x in text.splitlines() if "cannot check" in x]
    assert f"cannot reach the cluster at {down}" in line and "Fix: start the brokers" in line
