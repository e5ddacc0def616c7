"""The servers started by services/*.sh (or docker compose) do what the sinks rely on.

Kafka: a transaction's records reach a read_committed consumer only when it commits, and they
survive a broker restart. PostgreSQL: a prepared transaction is invisible until another
connection commits it, outlives its session and a server crash, and
max_prepared_transactions leaves room for many tasks. Toxiproxy: each server's proxy reaches
it (Kafka's keeps its clients on the proxy), and a partition through one ends a query within
the client's own timeout.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from integration_tests.conftest import S3Service, ServiceControl
from integration_tests.toxiproxy import Toxiproxy, proxiedUrl
from twophase.clients.postgres import AnswerWatch, PostgresUnavailableError

# ---------------------------------------------------------------------------------------------
# Kafka


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def topic(kafka_bootstrap: str) -> str:
    name = unique("it-services")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
    futures[name].result(timeout=30)
    return name


def transactional_producer(bootstrap: str) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": unique("it-services-tx"),
            "transaction.timeout.ms": 60_000,
        }
    )
    producer.init_transactions(60)
    return producer


def write_transaction(producer: Producer, topic: str, values: list[str], *, commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value=value.encode())
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def read_partition(bootstrap: str, topic: str, isolation: str) -> list[str]:
    """Every record of partition 0 a consumer with this isolation level gets, up to the end.

    Call it when no transaction is open: the end is then the high watermark for both levels.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("it-services-group"),
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        values: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return values
                raise AssertionError(f"consumer error: {error}")
            value = message.value()
            assert value is not None
            values.append(value.decode())
        raise AssertionError(f"did not reach the end of {topic} within 30 s; got {values}")
    finally:
        consumer.close()


def test_kafka_read_committed_sees_committed_transactions_only(
    kafka_bootstrap: str, topic: str
) -> None:
    producer = transactional_producer(kafka_bootstrap)

    write_transaction(producer, topic, ["aborted-1", "aborted-2", "aborted-3"], commit=False)
    assert read_partition(kafka_bootstrap, topic, "read_committed") == []
    # The records did reach the log: only the transaction markers hide them.
    assert read_partition(kafka_bootstrap, topic, "read_uncommitted") == [
        "aborted-1",
        "aborted-2",
        "aborted-3",
    ]

    write_transaction(producer, topic, ["committed-1", "committed-2"], commit=True)
    assert read_partition(kafka_bootstrap, topic, "read_committed") == [
        "committed-1",
        "committed-2",
    ]


def test_kafka_broker_restart_keeps_data_and_address(
    kafka_bootstrap: str, topic: str, kafka_broker: ServiceControl
) -> None:
    producer = transactional_producer(kafka_bootstrap)
    write_transaction(producer, topic, ["before-restart"], commit=True)
    producer.flush(10)
    del producer

    kafka_broker.restart()

    # Same bootstrap address, same data, and the transaction coordinator works again.
    assert read_partition(kafka_bootstrap, topic, "read_committed") == ["before-restart"]
    producer = transactional_producer(kafka_bootstrap)
    write_transaction(producer, topic, ["after-restart"], commit=True)
    assert read_partition(kafka_bootstrap, topic, "read_committed") == [
        "before-restart",
        "after-restart",
    ]


# ---------------------------------------------------------------------------------------------
# PostgreSQL

FORMAT_ID = 0x7470  # "tp"


@pytest.fixture
def pg_table(pg_url: str) -> Iterator[sql.Identifier]:
    """A fresh table; afterwards prepared transactions left by the test are rolled back."""
    name = unique("it_services").replace("-", "_")
    table = sql.Identifier(name)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, payload text NOT NULL)").format(table)
        )
    yield table
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for xid in conn.tpc_recover():
            if xid.gtrid.startswith(name):
                conn.tpc_rollback(xid)
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))


def prepare_insert(pg_url: str, table: sql.Identifier, rows: list[tuple[int, str]]) -> psycopg.Xid:
    """Insert rows in a two-phase transaction, PREPARE it and close the session."""
    # No `with`: leaving a connection block commits, which a prepared connection refuses.
    conn = psycopg.connect(pg_url)
    try:
        xid = conn.xid(FORMAT_ID, f"{table.as_string()[1:-1]}-batch-1", "partition-0")
        conn.tpc_begin(xid)
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL("INSERT INTO {} (id, payload) VALUES (%s, %s)").format(table), rows
            )
        conn.tpc_prepare()  # PREPARE TRANSACTION
    finally:
        conn.close()
    return xid


def in_doubt(pg_url: str) -> set[tuple[int | None, str, str | None]]:
    """The prepared transactions the server holds, as (format_id, gtrid, bqual)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return {(x.format_id, x.gtrid, x.bqual) for x in conn.tpc_recover()}


def key(xid: psycopg.Xid) -> tuple[int | None, str, str | None]:
    return (xid.format_id, xid.gtrid, xid.bqual)


def visible_rows(pg_url: str, table: sql.Identifier) -> list[tuple[int, str]]:
    with psycopg.connect(pg_url) as conn:
        return conn.execute(
            sql.SQL("SELECT id, payload FROM {} ORDER BY id").format(table)
        ).fetchall()


def prepared_gids(pg_url: str) -> set[str]:
    with psycopg.connect(pg_url) as conn:
        return {gid for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()}


def test_pg_max_prepared_transactions_allows_many_tasks(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SHOW max_prepared_transactions").fetchone()
    assert row is not None
    assert int(row[0]) >= 64


def test_pg_prepared_transaction_is_committed_from_another_connection(
    pg_url: str, pg_table: sql.Identifier
) -> None:
    rows = [(1, "one"), (2, "two"), (3, "three")]
    xid = prepare_insert(pg_url, pg_table, rows)

    # Prepared, its session gone: nobody sees the rows, the server still holds the transaction.
    assert visible_rows(pg_url, pg_table) == []
    assert key(xid) in in_doubt(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as committer:
        committer.tpc_commit(xid)  # COMMIT PREPARED
    assert visible_rows(pg_url, pg_table) == rows
    assert key(xid) not in in_doubt(pg_url)


def test_pg_prepared_transaction_is_rolled_back_from_another_connection(
    pg_url: str, pg_table: sql.Identifier
) -> None:
    xid = prepare_insert(pg_url, pg_table, [(1, "one")])
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.tpc_rollback(xid)  # ROLLBACK PREPARED
    assert key(xid) not in in_doubt(pg_url)
    assert visible_rows(pg_url, pg_table) == []


def test_pg_prepared_transaction_survives_a_server_crash(
    pg_url: str, pg_table: sql.Identifier, postgres_server: ServiceControl
) -> None:
    rows = [(10, "ten"), (11, "eleven")]
    xid = prepare_insert(pg_url, pg_table, rows)
    gids_before = prepared_gids(pg_url)
    assert key(xid) in in_doubt(pg_url)

    postgres_server.kill()  # immediate shutdown: crash recovery on the next start
    postgres_server.start()

    assert prepared_gids(pg_url) == gids_before
    assert visible_rows(pg_url, pg_table) == []
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.tpc_commit(xid)
    assert visible_rows(pg_url, pg_table) == rows


# ---------------------------------------------------------------------------------------------
# Toxiproxy


def test_the_postgres_mariadb_and_s3_proxies_reach_their_servers(
    proxies: Toxiproxy, pg_url: str, mariadb_url: str, s3: S3Service
) -> None:
    import botocore.session
    import sqlalchemy as sa

    with psycopg.connect(proxiedUrl(pg_url, proxies.proxy("postgres")), connect_timeout=5) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    engine = sa.create_engine(
        proxiedUrl(mariadb_url, proxies.proxy("mariadb")), poolclass=sa.pool.NullPool
    )
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    client = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=proxiedUrl(s3.endpoint, proxies.proxy("s3")),
        aws_access_key_id=s3.accessKey,
        aws_secret_access_key=s3.secretKey,
        region_name="us-east-1",
    )
    assert s3.bucket in [b["Name"] for b in client.list_buckets()["Buckets"]]


def test_the_kafka_proxy_keeps_its_clients_on_the_proxy(
    proxies: Toxiproxy, kafka_bootstrap: str, topic: str
) -> None:
    """The broker's metadata names the proxy to a client that bootstrapped there (so its later
    connections go through the proxy too), and the broker itself to one that did not."""
    listen = proxies.proxy("kafka").listen
    through = AdminClient({"bootstrap.servers": listen}).list_topics(timeout=15)
    assert [f"{b.host}:{b.port}" for b in through.brokers.values()] == [listen]
    direct = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=15)
    assert [f"{b.host}:{b.port}" for b in direct.brokers.values()] == [kafka_bootstrap]
    producer = Producer({"bootstrap.servers": listen})
    producer.produce(topic, value=b"through the proxy")
    assert producer.flush(15) == 0
    assert read_partition(listen, topic, "read_committed") == ["through the proxy"]


def test_a_partition_ends_a_query_within_its_timeout_and_healing_lets_queries_through(
    proxies: Toxiproxy, pg_url: str
) -> None:
    """Packets dropped both ways, connections held open, nothing reset: only the client's own
    bounds end its waits (here 2 s for a query's answer and for a new connection)."""
    proxy = proxies.proxy("postgres")
    url = proxiedUrl(pg_url, proxy)
    conn = psycopg.connect(url, autocommit=True, connect_timeout=2)
    proxy.partition()
    started = time.monotonic()
    with pytest.raises(PostgresUnavailableError, match="socketTimeout=2"):
        with AnswerWatch(2, lambda: conn, "select 1 through a partition"):
            conn.execute("SELECT 1")
    assert time.monotonic() - started < 5
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2)
    assert time.monotonic() - started < 5
    conn.close()
    proxy.heal()
    with psycopg.connect(url, connect_timeout=5) as healed:
        assert healed.execute("SELECT 1").fetchone() == (1,)
