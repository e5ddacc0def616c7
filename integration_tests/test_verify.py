"""``twophase verify`` against the real PostgreSQL and Kafka servers.

Data is written the way a broken or a correct pipeline would leave it, with real transactions:
committed records (equal ones included) count, aborted, open and prepared-but-undecided ones do
not, because readers only see committed data.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from confluent_kafka import IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from psycopg.conninfo import conninfo_to_dict

from integration_tests import test_postgres_participant
from integration_tests.test_kafka_helpers import createTopic, unique
from integration_tests.test_kafka_source import transactional
from twophase import cli
from twophase.verify import (
    VerifyInputError,
    actualFromKafka,
    actualFromPostgres,
    asKafkaRecords,
    compare,
    expectedFromKafka,
    expectedFromSequence,
    verify,
)

Record = tuple[bytes | None, bytes | None]

pgTable = test_postgres_participant.table
"""A fresh table name, dropped afterwards with the prepared transactions naming it (a fixture)."""


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["verify", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- PostgreSQL -------------------------------------------------------------------------------


def assertNoSecret(url: str, text: str) -> None:
    """Neither the URL nor its ``user:password@`` part is shown (the test server's password
    equals its user name, so the bare word cannot be searched for)."""
    password = conninfo_to_dict(url).get("password")
    assert url not in text
    if password:
        assert f":{password}@" not in text and f"password={password}" not in text


def insertRows(pg_url: str, table: str, ids: list[int]) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY {table} (id, payload) FROM STDIN") as copy:
            for i in ids:
                copy.write_row((i, f"row-{i}"))


def prepareRows(pg_url: str, table: str, ids: list[int]) -> None:
    """Rows in a prepared transaction nobody decided: invisible to every reader."""
    conn = psycopg.connect(pg_url)
    try:
        conn.tpc_begin(f"{table}-undecided")  # a plain gid, found by the fixture
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {table} (id, payload) VALUES (%s, %s)", [(i, f"row-{i}") for i in ids]
            )
        conn.tpc_prepare()
    finally:
        conn.close()


def test_postgres_table_counts_committed_rows_only(
    pg_url: str, pgTable: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {pgTable} (id bigint, payload text)")
    insertRows(pg_url, pgTable, [i for i in range(1000) if i != 7] + [5])
    prepareRows(pg_url, pgTable, [7, 1000, 1001] + list(range(10)))

    report = verify("sequence", {"end": "1000"}, "postgres", {"url": pg_url, "table": pgTable})
    assert (report.missing, report.duplicated, report.unexpected) == (1, 1, 0)
    assert report.missingExamples[0].values == {"id": 7, "payload": "row-7"}
    assert report.duplicatedExamples[0].values == {"id": 5, "payload": "row-5"}

    args = ["--source", "sequence", "--end", "1000", "--sink", "postgres"]
    args += ["--url", pg_url, "--table", f"public.{pgTable}"]
    code, out, err = run([*args, "--json"], capsys)
    assert code == 1, err
    data = json.loads(out)
    assert (data["actualRows"], data["missing"], data["duplicated"]) == (1000, 1, 1)
    assert f"postgres table public.{pgTable} at " in data["sink"]
    assertNoSecret(pg_url, out + err)

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f"DELETE FROM {pgTable} WHERE ctid = (SELECT min(ctid) FROM {pgTable} WHERE id = 5)"
        )
        conn.execute(f"INSERT INTO {pgTable} VALUES (7, 'row-7')")
    code, out, err = run(args, capsys)
    assert code == 0, out + err
    assert out.startswith("OK: exactly once")


def test_postgres_types_are_read_as_the_source_offered_them(pg_url: str, pgTable: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {pgTable} (key bytea, value bytea, n int4, s text, b boolean, "
            "f float8, ts timestamptz, d numeric)"
        )
        conn.execute(
            f"INSERT INTO {pgTable} VALUES "
            "('\\x00ff', 'one', 1, '', true, 1.5, '2024-05-01 12:00:00+02', 1.25), "
            "(NULL, '', 2, NULL, false, -0.25, NULL, NULL), "
            "('k', 'line\n\"two\", quoted', NULL, 'a,b', NULL, 'NaN', "
            "'1999-12-31 23:59:59.5+00', 7)"
        )
    actual = actualFromPostgres(pg_url, pgTable)
    assert actual.schema.field("key").type == pa.binary()
    assert actual.schema.field("n").type == pa.int32()
    assert actual.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    got = actual.to_pylist()
    assert [r["key"] for r in got] == [b"\x00\xff", None, b"k"]
    assert [r["value"] for r in got] == [b"one", b"", b'line\n"two", quoted']
    assert [r["s"] for r in got] == ["", None, "a,b"]  # '' and NULL stay apart
    assert [r["b"] for r in got] == [True, False, None]
    assert got[0]["ts"].isoformat() == "2024-05-01T10:00:00+00:00"
    assert [r["d"] for r in got] == ["1.25", None, "7"]
    offered = pa.table(
        {
            "key": pa.array([b"k", b"\x00\xff", None], pa.binary()),
            "value": pa.array([b'line\n"two", quoted', b"one", b""], pa.binary()),
        }
    )
    assert compare(offered, actualFromPostgres(pg_url, pgTable, columns=["key", "value"])).ok


def test_postgres_input_errors_exit_2(
    pg_url: str, pgTable: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--source", "sequence", "--end", "10", "--sink", "postgres", "--url", pg_url]
    code, out, err = run([*args, "--table", f"public.{pgTable}"], capsys)
    assert code == 2 and out == ""
    assert f"postgres table public.{pgTable} at " in err and "no such table" in err
    assert "Traceback" not in err
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {pgTable} (n bigint)")
    code, _, err = run([*args, "--table", pgTable], capsys)
    assert code == 2 and "no column id, payload (it has n)" in err
    closed = psycopg.conninfo.make_conninfo(pg_url, host="127.0.0.1", port="1")
    code, out, err = run([*args[:-1], closed, "--table", pgTable], capsys)
    assert code == 2 and "unreachable" in err and "Traceback" not in err
    assertNoSecret(closed, out + err)


# -- Kafka ------------------------------------------------------------------------------------


def transaction(
    producer: Producer, topic: str, records: list[Record], *, commit: bool | None = True
) -> None:
    """One transaction of ``records`` spread over two partitions: committed, aborted, or
    (``commit=None``) left open."""
    producer.begin_transaction()
    for i, (key, value) in enumerate(records):
        producer.produce(topic, value, key=key, partition=i % 2)
    producer.flush(30)
    if commit is True:
        producer.commit_transaction(60)
    elif commit is False:
        producer.abort_transaction(60)


OFFERED: list[Record] = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(20)]
EQUAL: Record = (b"same", b"record")
NULL_KEY: Record = (None, b"no key")


@pytest.fixture
def inputTopic(kafka_bootstrap: str) -> str:
    """An input topic holding ``OFFERED``, ``EQUAL`` twice (committed), ``NULL_KEY``, and an
    aborted transaction that no reader sees."""
    topic = createTopic(kafka_bootstrap, partitions=2, prefix="it-verify-in")
    producer = transactional(kafka_bootstrap)
    transaction(producer, topic, OFFERED[:10] + [EQUAL])
    transaction(producer, topic, [(b"ghost", b"aborted")] * 3 + OFFERED[:5], commit=False)
    transaction(producer, topic, OFFERED[10:] + [EQUAL, NULL_KEY])
    return topic


def kafkaArgs(bootstrap: str, topic: str) -> list[str]:
    return ["--source", "kafka", "--source-option", f"kafka.bootstrap.servers={bootstrap}"] + [
        "--source-option",
        f"subscribe={topic}",
    ]


def test_committed_duplicates_of_the_source_count_and_aborted_records_do_not(
    kafka_bootstrap: str,
    inputTopic: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    offered = expectedFromKafka(
        {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": inputTopic}
    )
    assert offered.num_rows == 23
    assert sorted(offered.column("value").to_pylist()).count(b"record") == 2
    assert b"aborted" not in offered.column("value").to_pylist()

    output = createTopic(kafka_bootstrap, partitions=2, prefix="it-verify-out")
    producer = transactional(kafka_bootstrap)
    transaction(producer, output, OFFERED + [EQUAL, NULL_KEY])  # EQUAL only once
    transaction(producer, output, OFFERED + [EQUAL], commit=False)  # a failed attempt
    args = [*kafkaArgs(kafka_bootstrap, inputTopic), "--sink", "kafka", "--topic", output]
    code, out, err = run([*args, "--json"], capsys)
    assert code == 1, err
    data = json.loads(out)
    assert (data["expectedRows"], data["actualRows"]) == (23, 22)
    assert (data["missing"], data["duplicated"], data["unexpected"]) == (1, 0, 0)
    assert data["examples"]["missing"] == [
        {"values": {"key": "same", "value": "record"}, "expected": 2, "actual": 1}
    ]

    transaction(producer, output, [EQUAL])
    code, out, err = run(args, capsys)
    assert code == 0, out + err

    transaction(producer, output, [OFFERED[3], (b"stranger", b"x")])
    transaction(producer, output, [OFFERED[4]] * 5, commit=None)  # open: not yet visible
    with caplog.at_level(logging.WARNING, logger="twophase.verify"):
        code, out, _ = run([*args, "--json"], capsys)
    assert "open transactions hold back the last stable offset" in caplog.text
    data = json.loads(out)
    assert code == 1
    assert (data["missing"], data["duplicated"], data["unexpected"]) == (0, 1, 1)
    assert data["examples"]["duplicated"][0]["values"] == {"key": "k3", "value": "v3"}
    assert data["examples"]["unexpected"][0]["values"] == {"key": "stranger", "value": "x"}
    producer.abort_transaction(60)


def test_offset_ranges_limit_both_sides(kafka_bootstrap: str, inputTopic: str) -> None:
    options = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": inputTopic}
    whole = expectedFromKafka(options)
    # the first transaction: 6 records in partition 0, 5 in partition 1, then its markers
    first = {inputTopic: {"0": 6, "1": 5}}
    part = expectedFromKafka({**options, "endingOffsets": json.dumps(first)})
    assert sorted(part.column("value").to_pylist()) == sorted(
        [v for _, v in OFFERED[:10]] + [b"record"]
    )
    later = expectedFromKafka(
        {**options, "startingOffsets": json.dumps(first), "endingOffsets": "latest"}
    )
    assert later.num_rows == whole.num_rows - part.num_rows
    same = actualFromKafka({**options, "startingOffsets": "earliest", "endingOffsets": "latest"})
    assert compare(whole, same).ok
    with pytest.raises(VerifyInputError, match="endingOffsets must give an offset"):
        expectedFromKafka({**options, "endingOffsets": json.dumps({inputTopic: {"0": 1}})})


def test_kafka_input_errors_exit_2(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = unique("it-verify-missing")
    args = [*kafkaArgs(kafka_bootstrap, missing), "--sink", "kafka", "--topic", missing]
    code, out, err = run(args, capsys)
    assert code == 2 and out == ""
    assert f"no such topic or partition {missing}" in err and "Traceback" not in err
    down = ["--source-option", "kafka.bootstrap.servers=127.0.0.1:1"]
    down += ["--source-option", "requestTimeoutSeconds=3"]
    code, _, err = run([*kafkaArgs(kafka_bootstrap, missing), *down] + args[4:], capsys)
    assert code == 2 and "cannot read metadata from 127.0.0.1:1" in err


def test_a_sequence_written_to_kafka(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    output = createTopic(kafka_bootstrap, partitions=2, prefix="it-verify-seq")
    written = asKafkaRecords(expectedFromSequence(0, 300)).to_pylist()
    producer = transactional(kafka_bootstrap)
    transaction(producer, output, [(r["key"], r["value"]) for r in written[:200]])
    transaction(producer, output, [(r["key"], r["value"]) for r in written[100:]], commit=False)
    args = ["--source", "sequence", "--end", "300", "--sink", "kafka", "--topic", output]
    args += ["--sink-option", f"kafka.bootstrap.servers={kafka_bootstrap}"]
    code, out, _ = run(args, capsys)
    assert code == 1 and "missing     100" in out
    assert 'key="200", value="row-200": offered 1, found 0' in out
    transaction(producer, output, [(r["key"], r["value"]) for r in written[200:]])
    awaitStable(kafka_bootstrap, output, 2)
    assert run(args, capsys)[0] == 0
    # The sequence's id is the records' key here: --columns names what is compared.
    code, out, err = run([*args, "--columns", "id", "--sink-columns", "key"], capsys)
    assert code == 2 and out == ""
    assert "the sequence source, compared with a Kafka topic as its records (key, value)," in err
    assert "has no column id (it has key, value); name key (or key,value) with --columns" in err
    assert run([*args, "--columns", "key"], capsys)[0] == 0


def awaitStable(bootstrap: str, topic: str, partitions: int, seconds: float = 30) -> None:
    """Wait until the last stable offset reaches the end of every partition: a commit returns
    once the coordinator has logged it, and its markers reach the partitions just after."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}

    def ends(level: IsolationLevel) -> dict[int, int]:
        found = admin.list_offsets(wanted, isolation_level=level, request_timeout=10)
        return {tp.partition: f.result().offset for tp, f in found.items()}

    deadline = time.monotonic() + seconds
    while (stable := ends(IsolationLevel.READ_COMMITTED)) != ends(IsolationLevel.READ_UNCOMMITTED):
        assert time.monotonic() < deadline, f"{topic}: last stable offsets stay at {stable}"
        time.sleep(0.2)


def test_a_kafka_source_against_bytea_columns_in_postgres(
    kafka_bootstrap: str, inputTopic: str, pg_url: str, pgTable: str
) -> None:
    offered = expectedFromKafka(
        {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": inputTopic}
    )
    with psycopg.connect(pg_url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {pgTable} (key bytea, value bytea, extra int)")
        rows: list[Any] = [(r["key"], r["value"]) for r in offered.to_pylist()]
        cur.executemany(f"INSERT INTO {pgTable} (key, value) VALUES (%s, %s)", rows[1:])
    source = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": inputTopic}
    report = verify("kafka", source, "postgres", {"url": pg_url, "table": pgTable})
    assert (report.missing, report.duplicated, report.unexpected) == (1, 0, 0)
    assert report.missingExamples[0].values == {"key": rows[0][0], "value": rows[0][1]}
