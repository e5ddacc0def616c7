"""The command line maps an error by its type: a sink's declared system, failure and fix (a
built-in sink's or a user's), a client library's error by its code, never by its words."""

from __future__ import annotations

import pickle
import re
import socket
from pathlib import Path
from types import MappingProxyType

import psycopg
import pymysql
import pytest
import sqlalchemy as sa
from confluent_kafka import KafkaError, KafkaException
from kafka.errors import KafkaConnectionError

import twophase
from twophase.cli import errors
from twophase.clients.postgres import PostgresSinkError, PostgresUnavailableError
from twophase.coordinator import CommitFailedError
from twophase.protocol import SinkFailure, SinkSystemError, TransientCommitError
from twophase.sinks.registry import GENERIC_FIX, specOf


class AcmeStoreDown(SinkSystemError, ConnectionError):
    """A user's sink's error, declared as the docs show (docs/writing-a-sink.md)."""

    system = "AcmeStore"
    reason = SinkFailure.UNREACHABLE
    fix = "Fix: start acmestored, or give its address as the query did: --sink-option store=..."


class AcmeStoreError(SinkSystemError):
    """A user's error class raised for several failures, with a fix for each."""

    system = "AcmeStore"
    fixes = MappingProxyType(
        {
            SinkFailure.UNREACHABLE: "Fix: start acmestored.",
            SinkFailure.CREDENTIALS: "Fix: give the token the query used in ACME_TOKEN.",
        }
    )


def said(exc: BaseException, command: str = "recover") -> tuple[int, str]:
    explanation = errors.explain(exc)
    text = errors.paragraph(command, explanation.text, explanation.fix)
    return explanation.status, " ".join(text.split())


def raisedFrom(error: BaseException, cause: BaseException) -> BaseException:
    """``error`` raised ``from cause``, as a sink raises its own error around a library's."""
    try:
        raise error from cause
    except BaseException as raised:  # noqa: BLE001 - any error is the test's
        return raised


def test_a_users_own_error_says_its_system_and_its_fix() -> None:
    status, text = said(AcmeStoreDown("cannot open the store at acme.example:9000"))
    assert status == errors.EXIT_CANNOT
    assert "twophase recover: AcmeStore: cannot open the store at acme.example:9000." in text
    assert "Nothing was changed. Fix: start acmestored" in text
    assert GENERIC_FIX not in text


DOC = Path(__file__).resolve().parents[1] / "docs" / "writing-a-sink.md"


def test_the_documented_error_of_a_users_sink_says_what_the_doc_shows() -> None:
    text = DOC.read_text()
    [code] = [
        b
        for b in re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
        if "(twophase.SinkSystemError)" in b
    ]
    section = text[text.index("## Saying which system failed") :]
    shown = " ".join(re.findall(r"```text\n(.*?)```", section, flags=re.DOTALL)[0].split())
    namespace: dict[str, object] = {"__name__": "acme_sink"}
    exec(compile(code, "writing-a-sink.md", "exec"), namespace)  # noqa: S102
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(namespace["AcmeStoreError"]) as raised:  # type: ignore[call-overload]
        namespace["openStore"](f"127.0.0.1:{port}")  # type: ignore[operator]
    status, paragraph = said(raised.value)
    assert status == errors.EXIT_CANNOT
    assert paragraph.replace(f"127.0.0.1:{port}", "127.0.0.1:7070") == shown


def test_a_users_error_chooses_its_fix_by_the_reason_given_when_raised() -> None:
    refused = AcmeStoreError("acmestore refused token t-1", reason=SinkFailure.CREDENTIALS)
    status, text = said(refused)
    assert status == errors.EXIT_CANNOT and "Fix: give the token the query used" in text
    assert "AcmeStore:" not in text  # the message names the system already
    status, text = said(AcmeStoreError("row 3 has no key", fix="Fix: give every row a key."))
    assert status == errors.EXIT_LEFT_TO_DO  # the store answered and refused the work
    assert "failed: AcmeStoreError: row 3 has no key" in text and "Fix: give every row a" in text
    again = pickle.loads(pickle.dumps(refused))
    assert again.reason is SinkFailure.CREDENTIALS and again.fix == refused.fix


def test_a_users_error_behind_a_retried_commit_names_its_system_and_fix() -> None:
    cause = AcmeStoreDown("acme.example:9000 did not answer")
    retried = raisedFrom(TransientCommitError("commit of acme part 0: no answer"), cause)
    failed = CommitFailedError("s1", 4, [("acme batch 4 partition 0", 3, retried)])
    status, text = said(failed)
    assert status == errors.EXIT_CANNOT
    assert "1 transaction (batch 4 partition 0): AcmeStore: commit of acme part 0" in text
    assert "Fix: start acmestored" in text and "committing again is safe" in text


def test_the_protocols_names_are_the_packages() -> None:
    assert twophase.SinkSystemError is SinkSystemError
    assert twophase.SinkFailure is SinkFailure


def test_the_words_of_an_error_decide_nothing() -> None:
    status, text = said(RuntimeError("connection refused: password authentication failed"))
    assert status == errors.EXIT_LEFT_TO_DO and "Fix:" not in text
    status, text = said(PostgresSinkError("postgres: commit: server is unreachable"))
    assert status == errors.EXIT_LEFT_TO_DO  # declared: the server answered and refused


def test_a_postgresql_error_is_read_by_its_sqlstate() -> None:
    classify = PostgresSinkError.classify
    assert classify(psycopg.errors.InvalidPassword("refused")) is SinkFailure.CREDENTIALS
    assert classify(psycopg.errors.InvalidAuthorizationSpecification()) is SinkFailure.CREDENTIALS
    assert classify(psycopg.errors.AdminShutdown("terminating")) is SinkFailure.UNREACHABLE
    assert classify(psycopg.errors.UniqueViolation("a credentials word")) is SinkFailure.REJECTED
    assert classify(ValueError("password authentication failed")) is None
    assert PostgresUnavailableError("down").fix == PostgresSinkError.fixes[SinkFailure.UNREACHABLE]


@pytest.mark.parametrize(
    ("error", "kind", "reason"),
    [
        (psycopg.OperationalError("connection refused"), "postgres", SinkFailure.UNREACHABLE),
        (
            psycopg.OperationalError('FATAL: password authentication failed for user "app"'),
            "postgres",
            SinkFailure.CREDENTIALS,
        ),
        (
            sa.exc.OperationalError("SELECT 1", {}, pymysql.err.OperationalError(1045, "denied")),
            "sql",
            SinkFailure.CREDENTIALS,
        ),
        (
            sa.exc.OperationalError("SELECT 1", {}, pymysql.err.OperationalError(2003, "no")),
            "sql",
            SinkFailure.UNREACHABLE,
        ),
        (
            KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN, "password")),
            "kafka",
            SinkFailure.UNREACHABLE,
        ),
        (
            KafkaException(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED, "refused")),
            "kafka",
            SinkFailure.CREDENTIALS,
        ),
        (KafkaConnectionError("no answer"), "kafka", SinkFailure.UNREACHABLE),
    ],
    ids=["pg-down", "pg-password", "mysql-1045", "mysql-2003", "kafka-down", "sasl", "kafka-py"],
)
def test_a_client_librarys_own_error_is_read_by_type_and_code(
    error: BaseException, kind: str, reason: SinkFailure
) -> None:
    errorClass = specOf(kind).errorClass()
    failure = errors.systemFailure(error)
    assert failure is not None and failure.reason is reason
    assert failure.system == errorClass.system and failure.fix == errorClass.fixFor(reason)
    wrapped = raisedFrom(TransientCommitError("commit: no answer"), error)
    assert errors.systemFailure(wrapped) == failure
    status, text = said(error)
    assert status == errors.EXIT_CANNOT and errorClass.fixFor(reason) in text


def test_s3s_errors_are_read_by_type_and_error_code() -> None:
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    from twophase.sinks.files.errors import FilesSinkError

    refused = ClientError({"Error": {"Code": "InvalidAccessKeyId"}}, "PutObject")
    missing = ClientError({"Error": {"Code": "NoSuchBucket"}}, "PutObject")
    down = EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
    assert FilesSinkError.classify(refused) is SinkFailure.CREDENTIALS
    assert FilesSinkError.classify(NoCredentialsError()) is SinkFailure.CREDENTIALS
    assert FilesSinkError.classify(down) is SinkFailure.UNREACHABLE
    assert FilesSinkError.classify(missing) is None


def test_a_plain_connection_error_or_timeout_gets_the_generic_fix() -> None:
    for error in (ConnectionRefusedError("refused"), TimeoutError("timed out")):
        status, text = said(error)
        assert status == errors.EXIT_CANNOT and GENERIC_FIX in text
    assert errors.systemFailure(ValueError("timed out")) is None
