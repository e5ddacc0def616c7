"""``twophase verify --sink multi`` against the real PostgreSQL and Kafka servers.

A sequence's rows are written the way a ``twophase.multi`` pipeline (``orders`` a PostgreSQL
table, ``events`` a Kafka topic) leaves them, with real transactions, then broken the ways a
dual write breaks: a batch in one system and not the other, a duplicate in one target. No Spark.
"""

from __future__ import annotations

import json

import psycopg
import pytest

from integration_tests import test_postgres_participant
from integration_tests.test_kafka_helpers import createTopic
from integration_tests.test_kafka_source import transactional
from integration_tests.test_verify import run, transaction
from twophase.verify import MultiVerifyReport, asKafkaRecords, expectedFromSequence, verify

pgTable = test_postgres_participant.table
"""A fresh table name, dropped afterwards (a fixture)."""

ROWS = 300


def writeOrders(pg_url: str, table: str, ids: list[int], *, create: bool = False) -> None:
    """Rows ``order_id, status`` of sequence ids, committed."""
    with psycopg.connect(pg_url, autocommit=True) as conn, conn.cursor() as cur:
        if create:
            cur.execute(f"CREATE TABLE {table} (order_id bigint, status text)")
        with cur.copy(f"COPY {table} (order_id, status) FROM STDIN") as copy:
            for i in ids:
                copy.write_row((i, f"row-{i}"))


def writeEvents(bootstrap: str, topic: str, ids: list[int], *, commit: bool = True) -> None:
    """Records ``key = CAST(id AS STRING), value = payload`` of sequence ids, in one transaction."""
    rows = asKafkaRecords(expectedFromSequence(0, ROWS)).to_pylist()
    producer = transactional(bootstrap)
    transaction(producer, topic, [(rows[i]["key"], rows[i]["value"]) for i in ids], commit=commit)


def multiArgs(pg_url: str, table: str, bootstrap: str, topic: str) -> list[str]:
    options = {
        "targets": "orders=postgres,events=kafka",
        "orders.url": pg_url,
        "orders.table": table,
        "orders.sinkColumns": "order_id,status",
        "events.kafka.bootstrap.servers": bootstrap,
        "events.topic": topic,
    }
    args = ["--source", "sequence", "--end", str(ROWS), "--sink", "multi"]
    for key, value in options.items():
        args += ["--sink-option", f"{key}={value}"]
    return args


def test_both_targets_exactly_once_and_a_one_sided_batch_is_named(
    pg_url: str, pgTable: str, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = createTopic(kafka_bootstrap, partitions=2, prefix="it-verify-multi")
    writeOrders(pg_url, pgTable, list(range(200)), create=True)
    writeEvents(kafka_bootstrap, topic, list(range(200)))
    writeEvents(kafka_bootstrap, topic, list(range(200, 250)), commit=False)  # aborted: unseen
    args = multiArgs(pg_url, pgTable, kafka_bootstrap, topic)

    # Batch [200, 250) committed in PostgreSQL only: the dual write the sink exists to prevent.
    writeOrders(pg_url, pgTable, list(range(200, 250)))
    code, out, err = run(args, capsys)
    assert code == 1, err
    assert "the targets disagree" in out and "one-sided   50 ids" in out
    assert "target events (kafka):" in out
    assert "ids held by another target and not here (key): 50" in out
    assert "first of them: 200, 201, 202" in out
    assert "ids held by another target and not here (order_id): 0" in out
    assert pg_url not in out + err

    # The rest of both: exactly once, the same ids in both targets.
    writeEvents(kafka_bootstrap, topic, list(range(200, ROWS)))
    writeOrders(pg_url, pgTable, list(range(250, ROWS)))
    code, out, err = run(args, capsys)
    assert code == 0, out + err
    assert out.startswith("OK: exactly once") and "one-sided   0 ids" in out

    # A duplicate in one target: that target's report, no one-sided id.
    writeOrders(pg_url, pgTable, [7])
    code, out, _ = run([*args, "--json"], capsys)
    assert code == 1
    data = json.loads(out)
    assert data["duplicated"] == 1 and data["oneSidedIds"] == 0
    byName = {t["name"]: t for t in data["targets"]}
    assert byName["orders"]["report"]["duplicated"] == 1 and byName["events"]["ok"]


def test_library_report_counts_each_target(pg_url: str, pgTable: str, kafka_bootstrap: str) -> None:
    topic = createTopic(kafka_bootstrap, partitions=2, prefix="it-verify-multi")
    writeOrders(pg_url, pgTable, list(range(0, ROWS, 2)), create=True)
    writeEvents(kafka_bootstrap, topic, list(range(1, ROWS, 2)))
    report = verify(
        "sequence",
        {"end": str(ROWS)},
        "multi",
        {
            "targets": "orders=postgres,events=kafka",
            "orders.url": pg_url,
            "orders.table": pgTable,
            "events.kafka.bootstrap.servers": kafka_bootstrap,
            "events.topic": topic,
        },
        sinkColumns=["order_id", "status"],
    )
    assert isinstance(report, MultiVerifyReport) and not report.ok
    assert report.missing == ROWS and report.oneSided == ROWS
    orders, events = report.targets
    assert (orders.report.missing, orders.absent) == (ROWS // 2, ROWS // 2)
    assert orders.absentExamples[:2] == ("1", "3") and events.absentExamples[:2] == ("0", "2")


def test_multi_input_errors_exit_2(
    pg_url: str, pgTable: str, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = createTopic(kafka_bootstrap, partitions=1, prefix="it-verify-multi")
    args = multiArgs(pg_url, pgTable, kafka_bootstrap, topic)
    code, _, err = run(args, capsys)  # the table does not exist
    assert code == 2 and "no such table" in err and pg_url not in err
    bad = [a.replace("events=kafka", "events=mq") for a in args]
    code, _, err = run(bad, capsys)
    assert code == 2 and "target 'events' has kind 'mq'" in err
    custom = [a.replace("events=kafka", "events=my.module:Sink") for a in args]
    code, _, err = run(custom, capsys)
    assert code == 2 and "cannot read events (my.module:Sink)" in err
    wrongKafka = [*args, "--sink-option", "events.sinkColumns=id"]
    code, _, err = run(wrongKafka, capsys)
    assert code == 2 and "events.sinkColumns" in err
