"""How ``twophase`` commands fail against the real servers: one paragraph, the fix, no secret.

No Spark session: a test builds a query's checkpoint as the driver does (``sink.json``, a
claimed log), prepares transactions with the sink's own writer and records a decision without
committing it, as a driver killed right after its decision leaves them. Then each command
meets a wrong or missing password, a server that does not answer, a missing checkpoint or a
checkpoint of another query, and a sink option file others may read. Each message must be
short (< 12 lines), name the fix, and hold none of the secrets (a temporary role's unique
password, and passwords given on the command line or in an option file).
"""

from __future__ import annotations

import json
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from integration_tests.checkpoints import SinkCheckpoint
from integration_tests.conftest import PgRole
from integration_tests.test_kafka_helpers import createTopic
from twophase import cli
from twophase.spark.declared import PostgresSink
from twophase.spark.kafka import KafkaSink

MAX_LINES = 12


@dataclass
class Outcome:
    """A command's exit status, its stdout and stderr, and stderr with its lines joined."""

    status: int
    out: str
    err: str

    @property
    def said(self) -> str:
        return " ".join(self.err.split())

    def shortAndClean(self, *secrets: str) -> None:
        assert len(self.err.splitlines()) < MAX_LINES, self.err
        assert "Traceback" not in self.err, self.err
        for secret in secrets:
            assert secret not in self.out + self.err


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> Outcome:
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return Outcome(status, captured.out, captured.err)


def closedPort() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def noAmbientPassword(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only what a test gives: no PGPASSWORD, no ~/.pgpass, no debug switch."""
    for name in ("PGPASSWORD", "TWOPHASE_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))


# -- PostgreSQL ---------------------------------------------------------------------------------


@pytest.fixture
def role(pg_role: PgRole) -> PgRole:
    """A role of the test's own with a password nothing else contains, and its table."""
    return pg_role


def pgSinkCheckpoint(
    role: PgRole, tmp_path: Path, partitions: int = 4, movedTo: int | None = None
) -> SinkCheckpoint:
    """Batch 2 decided with ``partitions`` prepared transactions, none committed.

    ``movedTo``: the decided handles name this port instead of the server's, as if the server
    had moved or were down when recovery runs.
    """
    sink = PostgresSink(
        {
            "url": role.url,
            "table": role.table,
            "checkpointLocation": str(tmp_path / "ckpt"),
            "sinkId": role.table.replace("_", "-"),
        }
    )
    crashed = SinkCheckpoint(sink, tmp_path / "ckpt")
    writer = sink.createWriter()
    handles = []
    for partition in range(partitions):
        txn = writer.beginTransaction(crashed.context(2, partition))
        batch = pa.record_batch({"id": [partition], "payload": [f"row-{partition}"]})
        writer.write(txn, batch)
        handle = dict(writer.preCommit(txn))
        if movedTo is not None:
            handle["connection"] = {**handle["connection"], "port": str(movedTo)}
        handles.append(handle)
    crashed.decide(2, handles)
    assert crashed.filesHolding(role.password) == []
    return crashed


def committedIds(role: PgRole) -> list[int]:
    with psycopg.connect(role.url) as conn:
        query = sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(role.table))
        return [r[0] for r in conn.execute(query).fetchall()]


def test_recover_without_or_with_a_wrong_password_says_it_once_with_the_ways_to_give_it(
    role: PgRole, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = pgSinkCheckpoint(role, tmp_path)
    ckpt = str(crashed.path)
    sinkJson = crashed.sinkJson.read_bytes()

    missing = run(capsys, "recover", "--checkpoint", ckpt)
    assert missing.status == 2, missing.err
    missing.shortAndClean(role.password)
    said = missing.said
    assert "4 transactions (batch 2 partitions 0-3)" in said
    assert said.count("no password supplied") == 1
    assert f"{role.table}@127.0.0.1:" in said  # the server as user@host:port/db
    assert "the decision for batch 2 is durable" in said
    assert "--sink-option password=" in said and "PGPASSWORD" in said and ".pgpass" in said

    wrong = "Wrong-Pass-" + uuid.uuid4().hex[:6]
    refused = run(capsys, "recover", "--checkpoint", ckpt, "--sink-option", f"password={wrong}")
    assert refused.status == 2
    refused.shortAndClean(role.password, wrong)
    assert "password authentication failed" in refused.said
    assert committedIds(role) == []

    optionFile = tmp_path / "recover.json"
    optionFile.write_text(json.dumps({"password": role.password}))
    optionFile.chmod(0o640)
    exposed = run(capsys, "recover", "--checkpoint", ckpt, "--sink-option-file", str(optionFile))
    assert exposed.status == 2
    exposed.shortAndClean(role.password)
    assert f"Fix: chmod 600 {optionFile}" in exposed.said and "mode 0640" in exposed.said
    assert committedIds(role) == []

    optionFile.chmod(0o600)
    done = run(capsys, "recover", "--checkpoint", ckpt, "--sink-option-file", str(optionFile))
    assert done.status == 0, done.err
    done.shortAndClean(role.password)
    assert "committed 4 transactions of 1 decided batches [2]" in done.out
    assert committedIds(role) == [0, 1, 2, 3]
    assert crashed.sinkJson.read_bytes() == sinkJson  # recover never writes sink.json
    assert crashed.filesHolding(role.password) == [] and crashed.filesHolding(wrong) == []

    status = run(capsys, "status", "--checkpoint", ckpt)
    assert status.status == 0 and "decided, unfinished   0 batches" in status.out


def test_recover_with_the_server_down_names_it_and_keeps_the_decision(
    role: PgRole, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = closedPort()
    crashed = pgSinkCheckpoint(role, tmp_path, partitions=2, movedTo=port)
    ckpt = str(crashed.path)
    down = run(
        capsys, "recover", "--checkpoint", ckpt,
        "--sink-option", f"password={role.password}",
        "--sink-option", "commitTimeoutSeconds=2", "--sink-option", "connectRetrySeconds=0",
    )  # fmt: skip
    assert down.status == 2, down.err
    down.shortAndClean(role.password)
    assert "2 transactions (batch 2 partitions 0-1)" in down.said
    assert f"127.0.0.1:{port}" in down.said
    assert "the decision for batch 2 is durable" in down.said
    assert "Fix: start the server" in down.said
    left = run(capsys, "status", "--checkpoint", ckpt, "--json")
    assert left.status == 1  # the decision waits in the log
    assert [b["batchId"] for b in json.loads(left.out)["outstanding"]] == [2]


def test_doctor_takes_the_password_from_a_private_file_or_pgpassword(
    role: PgRole,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crashed = pgSinkCheckpoint(role, tmp_path, partitions=1)
    ckpt = str(crashed.path)
    optionFile = tmp_path / "doctor.options"
    optionFile.write_text(f"password={role.password}\n")
    optionFile.chmod(0o604)
    exposed = run(capsys, "doctor", "--checkpoint", ckpt, "--sink-option-file", str(optionFile))
    assert exposed.status == 2
    exposed.shortAndClean(role.password)
    assert f"Fix: chmod 600 {optionFile}" in exposed.said

    optionFile.chmod(0o400)
    found = run(capsys, "doctor", "--checkpoint", ckpt, "--sink-option-file", str(optionFile))
    assert found.status == 1, found.out + found.err
    found.shortAndClean(role.password)
    assert "decided-unfinished" in found.out
    # The fix names the same file, not the password's option.
    assert f"--sink-option-file {optionFile}" in found.out and "--option" not in found.out

    monkeypatch.setenv("PGPASSWORD", role.password)
    viaEnv = run(capsys, "doctor", "--checkpoint", ckpt, "--json")
    assert viaEnv.status == 1, viaEnv.out
    [sink] = json.loads(viaEnv.out)["sinks"]
    assert [f["finding"] for f in sink["findings"]] == ["decided-unfinished"]
    assert crashed.filesHolding(role.password) == []


def test_status_recover_and_doctor_refuse_a_checkpoint_that_is_not_the_querys(
    role: PgRole, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = pgSinkCheckpoint(role, tmp_path, partitions=1)
    sinkId = crashed.settings.sinkId
    other = tmp_path / "other-query"
    (other / "offsets").mkdir(parents=True)  # a Spark checkpoint without a twophase sink
    for command in ("status", "recover", "doctor"):
        outcome = run(capsys, command, "--checkpoint", str(other))
        assert outcome.status == 2, (command, outcome)
        outcome.shortAndClean()
        assert "no twophase decision log under" in " ".join((outcome.out + outcome.err).split())
        wrongSink = run(capsys, command, "--checkpoint", str(crashed.path), "--sink-id", "other")
        assert wrongSink.status == 2
        if command != "doctor":
            assert f"this checkpoint's query has the sinks {sinkId}" in wrongSink.said
        missing = run(capsys, command, "--checkpoint", str(tmp_path / "gone"))
        assert missing.status == 2
        assert f"no checkpoint at {tmp_path / 'gone'}" in " ".join(
            (missing.out + missing.err).split()
        )
    assert committedIds(role) == []


def test_verify_with_a_wrong_password_or_the_server_down_says_so_in_one_paragraph(
    role: PgRole, capsys: pytest.CaptureFixture[str]
) -> None:
    params = conninfo_to_dict(role.url)
    wrong = "Verify-Wrong-" + uuid.uuid4().hex[:6]
    for port in (params["port"], str(closedPort())):
        url = f"postgresql://{role.table}:{wrong}@127.0.0.1:{port}/{params['dbname']}"
        outcome = run(
            capsys, "verify", "--source", "sequence", "--end", "3", "--sink", "postgres",
            "--url", url, "--table", role.table,
        )  # fmt: skip
        assert outcome.status == 2, outcome
        outcome.shortAndClean(wrong, role.password)
        assert f"127.0.0.1:{port}" in outcome.said


def test_debug_shows_the_traceback_without_the_password(
    role: PgRole, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = pgSinkCheckpoint(role, tmp_path, partitions=1)
    wrong = "Debug-Wrong-" + uuid.uuid4().hex[:6]
    outcome = run(
        capsys, "recover", "--checkpoint", str(crashed.path), "--debug",
        "--sink-option", f"password={wrong}",
    )  # fmt: skip
    assert outcome.status == 2
    assert "Traceback" in outcome.err and wrong not in outcome.err
    assert "password authentication failed" in outcome.err


# -- Kafka --------------------------------------------------------------------------------------


def test_kafka_recover_with_the_brokers_down_keeps_the_decision_and_names_the_fix(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = createTopic(kafka_bootstrap, partitions=2)
    sink = KafkaSink(
        {
            "kafka.bootstrap.servers": kafka_bootstrap,
            "topic": topic,
            "transactionalIdPrefix": f"it-cli-{uuid.uuid4().hex[:8]}",
            "checkpointLocation": str(tmp_path / "ckpt"),
        }
    )
    crashed = SinkCheckpoint(sink, tmp_path / "ckpt")
    writer = sink.createWriter()
    handles = []
    for partition in range(2):
        txn = writer.beginTransaction(crashed.context(0, partition))
        writer.write(txn, pa.RecordBatch.from_pydict({"value": ["v"], "partition": [partition]}))
        handles.append(writer.preCommit(txn))
    crashed.decide(0, handles)
    ckpt = str(crashed.path)
    secret = "Sasl-Cli-" + uuid.uuid4().hex[:6]
    down = f"127.0.0.1:{closedPort()}"
    outcome = run(
        capsys, "recover", "--checkpoint", ckpt,
        "--sink-option", f"kafka.bootstrap.servers={down}",
        "--sink-option", f"kafka.sasl.password={secret}",
        "--sink-option", "requestTimeoutSeconds=2", "--sink-option", "commitTimeoutSeconds=3",
    )  # fmt: skip
    assert outcome.status == 2, outcome.err
    outcome.shortAndClean(secret)
    assert "2 transactions (batch 0 partitions 0-1)" in outcome.said
    assert down in outcome.said and "the decision for batch 0 is durable" in outcome.said
    assert "Fix: start the brokers" in outcome.said
    assert crashed.filesHolding(secret) == []

    done = run(capsys, "recover", "--checkpoint", ckpt)
    assert done.status == 0, done.err
    assert "committed 2 transactions of 1 decided batches [0]" in done.out
