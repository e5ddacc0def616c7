"""Task connections across tasks of one worker, against the real MariaDB and PostgreSQL.

A Python worker runs task after task. On PostgreSQL its session serves the next task once
``PREPARE TRANSACTION`` returned; on MariaDB the session must end after ``XA PREPARE`` (the
first tests prove why on the server), and only the engine and its TLS choice are kept. Either
way a prepared transaction stays committable by the driver from another connection, also after
the worker reused its session or was SIGKILLed, and a broken kept session is replaced before a
task writes.
"""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
import sqlalchemy as sa

from integration_tests.test_sql_participant import (
    REPO,
    Target,
    createSimple,
    simple,
    sqlalchemyPgUrl,
)
from twophase.protocol import Handle, RecoveryScope
from twophase.resources import Resources
from twophase.sinks.sql import SqlCommitter, SqlUnavailableError, SqlWriter
from twophase.sinks.sql.connections import engineFor
from twophase.sinks.sql.sessions import TASK_SESSIONS


@pytest.fixture(params=["mariadb", "postgresql"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """One test's table and sink id on each server."""
    if request.param == "mariadb":
        t = Target(str(request.getfixturevalue("mariadb_url")))
    else:
        t = Target(sqlalchemyPgUrl(str(request.getfixturevalue("pg_url"))))
    yield t
    t.cleanup()


@pytest.fixture
def mtarget(mariadb_url: str) -> Iterator[Target]:
    t = Target(mariadb_url)
    yield t
    t.cleanup()


@pytest.fixture
def pgtarget(pg_url: str) -> Iterator[Target]:
    t = Target(sqlalchemyPgUrl(pg_url))
    yield t
    t.cleanup()


def runTask(writer: SqlWriter, t: Target, partition: int, ids: range) -> tuple[Handle, int]:
    """One task attempt in this process; its handle and the server's id of its session."""
    txn = writer.beginTransaction(t.ctx(1, partition))
    writer.write(txn, simple(ids))
    assert txn.conn is not None
    query = "SELECT pg_backend_pid()" if t.family == "postgresql" else "SELECT CONNECTION_ID()"
    session = int(txn.conn.exec_driver_sql(query).scalar_one())
    return writer.preCommit(txn), session


def killSession(t: Target, session: int) -> None:
    if t.family == "postgresql":
        t.execute(f"SELECT pg_terminate_backend({session})")
    else:
        t.execute(f"KILL CONNECTION {session}")


def sessionExists(t: Target, session: int) -> bool:
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
        if t.family == "postgresql"
        else "SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID = %s"
    )
    with t.engine.connect() as conn:
        return bool(conn.exec_driver_sql(query, (session,)).scalar_one())


# -- what the server allows after XA PREPARE (why MariaDB sessions are not kept) ---------------


def xaPrepare(conn: Any, xid: str, table: str, value: int) -> None:
    with conn.cursor() as cur:
        for statement in (
            f"XA START '{xid}'",
            f"INSERT INTO {table} VALUES ({value}, 'x')",
            f"XA END '{xid}'",
            f"XA PREPARE '{xid}'",
        ):
            cur.execute(statement)


def rawMariadb(t: Target) -> Any:
    u = sa.make_url(t.url)
    return pymysql.connect(
        host=u.host, port=u.port or 3306, user=u.username, password=u.password or "",
        database=u.database, autocommit=True, connect_timeout=10, read_timeout=30,
        write_timeout=30,
    )  # fmt: skip


def test_a_mariadb_session_cannot_go_on_after_xa_prepare_until_it_ends(mtarget: Target) -> None:
    """After XA PREPARE the session can start no other XA transaction, and no other
    connection can commit the xid while it lives; once it ends, another connection can.

    Nor may the session be reset for reuse: on MariaDB 10.11 ``COM_RESET_CONNECTION`` after
    ``XA PREPARE`` detaches the xid from its InnoDB transaction; another connection's ``XA
    COMMIT`` then succeeds without committing anything, and the transaction stays prepared
    inside InnoDB, holding its locks, until a server restart lists it in ``XA RECOVER`` again
    (tried by hand; not repeated here, as each try leaves such a transaction on the server).
    docs/sql.md has the details."""
    t = mtarget
    createSimple(t)
    worker, driver = rawMariadb(t), rawMariadb(t)
    try:
        first = f"tp1:{t.sinkId}:b1:p0:a0:00000001"
        xaPrepare(worker, first, t.table, 1)
        with pytest.raises(pymysql.err.OperationalError) as refused, worker.cursor() as cur:
            cur.execute(f"XA START 'tp1:{t.sinkId}:b1:p1:a0:00000002'")
        assert refused.value.args[0] == 1399  # XAER_RMFAIL: the session is PREPARED
        with pytest.raises(pymysql.err.OperationalError) as unknown, driver.cursor() as cur:
            cur.execute(f"XA COMMIT '{first}'")
        assert unknown.value.args[0] == 1397  # XAER_NOTA while attached to its session
        worker.close()
        with t.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            t.engine.dialect.do_commit_twophase(conn, first, is_prepared=True, recover=True)
        assert t.rows() == [(1, "x")]
    finally:
        for conn in (worker, driver):
            if conn.open:
                conn.close()


# -- reuse across the tasks of one worker ------------------------------------------------------


def test_a_worker_keeps_its_postgresql_session_and_the_driver_commits_meanwhile(
    pgtarget: Target,
) -> None:
    t = pgtarget
    createSimple(t)
    writer = SqlWriter(t.settings())
    s = t.settings()
    engine = engineFor(
        s.url, pooled=False, connectTimeout=s.connectTimeout, socketTimeout=s.socketTimeout
    )
    first, session = runTask(writer, t, 0, range(0, 3))
    assert TASK_SESSIONS.idleCount(engine) == 1
    # The next task runs on the same session; the driver commits the first meanwhile.
    txn = writer.beginTransaction(t.ctx(1, 1))
    writer.write(txn, simple(range(3, 6)))
    assert txn.conn is not None
    assert txn.conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() == session
    SqlCommitter(t.settings()).commit(first)
    assert [r[0] for r in t.rows()] == [0, 1, 2]
    second = writer.preCommit(txn)
    third, again = runTask(writer, t, 2, range(6, 9))
    assert again == session
    for handle in (second, third):
        SqlCommitter(t.settings()).commit(handle)
    assert [r[0] for r in t.rows()] == list(range(9))
    assert t.prepared() == []


def test_a_writer_and_committer_keep_what_they_open_in_the_resources_they_were_given(
    target: Target,
) -> None:
    """Engines and kept sessions live in the ``Resources`` handed over, not the process's;
    closing it ends the worker's kept session on the server and the committer's pool."""
    t = target
    createSimple(t)
    mine = Resources()
    writer = SqlWriter(t.settings(), mine)
    handle, session = runTask(writer, t, 0, range(0, 3))
    SqlCommitter(t.settings(), mine).commit(handle)
    assert [r[0] for r in t.rows()] == [0, 1, 2]
    engines = [k for k in mine.keys() if isinstance(k, tuple) and k[0] == "sql.engine"]
    assert len(engines) == 2, mine.keys()  # the task's unpooled engine, the committer's pool
    for key in engines:
        assert mine.peek(key) is not Resources.ofProcess().peek(key)
    mine.close()
    assert mine.keys() == []
    deadline = time.monotonic() + 10
    while sessionExists(t, session):  # the server ends a closed session's backend shortly after
        assert time.monotonic() < deadline, "the kept session outlived its resources"
        time.sleep(0.1)


def test_a_mariadb_worker_keeps_its_engine_and_tls_choice_but_ends_each_session(
    mtarget: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = mtarget
    createSimple(t)
    made: list[ssl.SSLContext] = []
    real = ssl.create_default_context

    def spy(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(ssl, "create_default_context", spy)
    writer = SqlWriter(t.settings())
    s = t.settings()
    engine = engineFor(
        s.url, pooled=False, connectTimeout=s.connectTimeout, socketTimeout=s.socketTimeout
    )
    results = [runTask(writer, t, p, range(p * 2, p * 2 + 2)) for p in range(4)]
    assert len({session for _, session in results}) == 4  # a new session per task
    assert len(made) <= 1  # PyMySQL's default TLS context: at most once per engine
    assert TASK_SESSIONS.idleCount(engine) == 0
    committer = SqlCommitter(t.settings())
    for handle, _ in results:
        committer.commit(handle)
    assert [r[0] for r in t.rows()] == list(range(8))


def test_a_session_killed_between_tasks_is_replaced_before_the_next_task_writes(
    target: Target,
) -> None:
    t = target
    createSimple(t)
    writer = SqlWriter(t.settings())
    first, session = runTask(writer, t, 0, range(0, 2))
    if t.family == "postgresql":
        assert sessionExists(t, session)  # kept for the next task: break it
        killSession(t, session)
    else:
        assert not sessionExists(t, session)  # ended at XA PREPARE
    second, replacement = runTask(writer, t, 1, range(2, 4))
    assert replacement != session
    committer = SqlCommitter(t.settings())
    committer.commit(first)
    committer.commit(second)
    assert [r[0] for r in t.rows()] == [0, 1, 2, 3]


def test_a_session_killed_mid_task_fails_that_task_and_the_next_connects_again(
    target: Target,
) -> None:
    t = target
    createSimple(t)
    writer = SqlWriter(t.settings())
    txn = writer.beginTransaction(t.ctx(1, 0))
    writer.write(txn, simple(range(0, 2)))
    assert txn.conn is not None
    query = "SELECT pg_backend_pid()" if t.family == "postgresql" else "SELECT CONNECTION_ID()"
    killSession(t, int(txn.conn.exec_driver_sql(query).scalar_one()))
    with pytest.raises(SqlUnavailableError, match="lost the connection"):
        writer.write(txn, simple(range(2, 4)))
        writer.preCommit(txn)
    writer.abortTransaction(txn)
    handle, _ = runTask(writer, t, 1, range(10, 12))
    SqlCommitter(t.settings()).commit(handle)
    assert [r[0] for r in t.rows()] == [10, 11]
    assert t.prepared() == []


# -- crash windows with a reused session -------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    import pyarrow as pa
    from twophase.protocol import TransactionContext
    from twophase.sinks.sql import SqlSettings, SqlWriter
    url, table, sinkId = sys.argv[1:4]
    writer = SqlWriter(SqlSettings.fromOptions({"url": url, "dbtable": table}))

    def rows(ids):
        return pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"x{i}" for i in ids])],
                               names=["id", "v"])

    handles = []
    for partition, ids in ((0, [1, 2]), (1, [3, 4])):  # two tasks of one worker
        txn = writer.beginTransaction(TransactionContext(sinkId, "q", 1, partition, 0))
        writer.write(txn, rows(ids))
        handles.append(writer.preCommit(txn))
    txn = writer.beginTransaction(TransactionContext(sinkId, "q", 1, 2, 0))
    writer.write(txn, rows([5, 6]))  # a third task is writing when the worker dies
    print(json.dumps(handles), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_xids_prepared_by_a_worker_that_reused_its_session_survive_its_sigkill(
    target: Target,
) -> None:
    t = target
    createSimple(t)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, t.url, t.table, t.sinkId],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    child.wait(30)
    assert child.returncode == -signal.SIGKILL
    handles = json.loads(line)
    assert sorted(t.prepared()) == sorted(h["xid"] for h in handles)
    assert t.rows() == []
    committer = SqlCommitter(t.settings())
    for handle in handles:
        committer.commit(handle)
    assert [r[0] for r in t.rows()] == [1, 2, 3, 4]  # the third task's rows never appear
    assert committer.recoverAndAbort(RecoveryScope(t.sinkId)) == []
