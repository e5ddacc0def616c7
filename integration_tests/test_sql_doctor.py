"""``twophase doctor`` and ``twophase recover`` on a ``twophase.sql`` sink on the real MariaDB.

No Spark: the checkpoint is built as the driver builds it (``sink.json``, a claimed decision
log), transactions are prepared with the sink's own writer, one batch is decided without its
commit, one prepared and never decided, and one xid with the sink's prefix is prepared by hand.
Doctor must find each, recover must settle them, and doctor must then say clean.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa

from integration_tests.checkpoints import SinkCheckpoint
from twophase import cli
from twophase.sinks.relational.naming import sinkPrefix
from twophase.sinks.sql import validateTarget
from twophase.spark.declared import SqlSink


def run(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def rows(*ids: int) -> pa.RecordBatch:
    return pa.record_batch(
        {"id": pa.array(ids, pa.int64()), "payload": pa.array([f"row-{i}" for i in ids])}
    )


def prepareOn(writer: Any, ctx: Any, batch: pa.RecordBatch) -> dict[str, Any]:
    txn = writer.beginTransaction(ctx)
    writer.write(txn, batch)
    handle: dict[str, Any] = writer.preCommit(txn)
    return handle


def test_sql_leftovers_are_found_and_recover_settles_them(
    mariadb_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = f"it_sqldoc_{uuid.uuid4().hex[:8]}"
    password = sa.make_url(mariadb_url).password or ""
    sink = SqlSink(
        {
            "url": mariadb_url,
            "dbtable": table,
            "createTable": "true",
            "checkpointLocation": str(tmp_path / "ckpt"),
            "sinkId": table.replace("_", "-"),
        }
    )
    query = SinkCheckpoint(sink, tmp_path / "ckpt")
    validateTarget(sink.settings(), rows(0).schema, query.sinkId)
    engine = sa.create_engine(mariadb_url, poolclass=sa.pool.NullPool)
    byHand = f"{sinkPrefix(query.sinkId)}by-hand"
    try:
        writer = sink.createWriter()
        decided = prepareOn(writer, query.context(0, 0), rows(1))
        query.log.decide(0, [query.result(0, 0, decided)])  # the driver died before committing
        undecided = prepareOn(writer, query.context(1, 0), rows(2))  # died before deciding
        conn = engine.connect()
        txn = conn.begin_twophase(byHand)
        conn.exec_driver_sql(f"INSERT INTO {table} VALUES (99, 'x')")
        txn.prepare()
        conn.invalidate()

        ckpt = str(query.path)
        auth = ("--sink-option", f"password={password}")
        status, text = run("doctor", "--checkpoint", ckpt, "--json", *auth, capsys=capsys)
        assert status == 1, text
        [report] = json.loads(text)["sinks"]
        kinds: dict[str, list[dict[str, Any]]] = {}
        for finding in report["findings"]:
            kinds.setdefault(finding["finding"], []).append(finding)
        assert sorted(kinds) == ["decided-unfinished", "undecided", "unknown-to-log"], text
        assert [h["id"] for h in kinds["decided-unfinished"][0]["held"]] == [decided["xid"]]
        assert [f["held"][0]["id"] for f in kinds["undecided"]] == [undecided["xid"]]
        assert kinds["unknown-to-log"][0]["held"][0]["id"] == byHand

        status, text = run(
            "recover", "--checkpoint", ckpt, "--sink-id", query.sinkId, *auth, capsys=capsys
        )
        assert status == 0, text
        status, text = run("doctor", "--checkpoint", ckpt, "--json", *auth, capsys=capsys)
        assert status == 0, text
        with engine.connect() as c:
            assert c.exec_driver_sql(f"SELECT id FROM {table}").scalars().all() == [1]
        # twophase verify reads the table: id 1 once (its payload column too), and nothing else.
        where = ("--sink", "sql", "--sink-option", f"url={mariadb_url}")
        status, text = run(
            "verify", "--source", "sequence", "--start", "1", "--end", "2", *where,
            "--sink-option", f"dbtable={table}", capsys=capsys,
        )  # fmt: skip
        assert status == 0, text
        status, text = run(
            "verify", "--source", "sequence", "--start", "0", "--end", "2", *where,
            "--sink-option", f"dbtable={table}", capsys=capsys,
        )  # fmt: skip
        assert status == 1 and "missing" in text, text
        status, text = run(
            "verify", "--source", "sequence", "--end", "2", *where,
            "--sink-option", "dbtable=no_such_table", capsys=capsys,
        )  # fmt: skip
        assert status == 2 and "no such table" in text, text
    finally:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            for row in c.exec_driver_sql("XA RECOVER").fetchall():
                xid = bytes(row[3]).decode()
                if xid.startswith(sinkPrefix(query.sinkId)):
                    c.exec_driver_sql(f"XA ROLLBACK '{xid}'")
            c.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        engine.dispose()
