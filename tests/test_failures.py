"""Failures as classes and codes: reading a query's error, and which a restart can help."""

from __future__ import annotations

import errno

import pytest

from twophase.coordinator.errors import (
    CommitFailedError,
    DecisionLogWriteError,
    DriverFencedError,
    RewritePendingError,
)
from twophase.failures import CODES, Classifier, failureOfPython, failureOfText
from twophase.failures.causes import javaCausesIn, pythonCausesIn
from twophase.failures.classify import FATAL_JAVA, UNCLASSIFIED
from twophase.protocol import SinkContractError, SinkFailure, SinkSystemError, TransientCommitError
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.systems import errorCodeOf
from twophase.spark.coded import markError

TASK_FAILURE = """[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: \
[PYTHON_EXCEPTION] An exception was thrown from the worker: Traceback (most recent call last):
  File "/work/twophase/spark/stream_writer.py", line 145, in write
    result = runTask(self.sink.createWriter, ctx, batches, alreadyDecided=decided)
             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/tmp/exp/expsink.py", line 17, in beginTransaction
    raise BoomError("task boom")
{error}
 SQLSTATE: 38000
	at org.apache.spark.sql.execution.streaming.StreamExecution.runStream(StreamExecution.scala:1)
Caused by: org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown
	at org.apache.spark.api.python.BasePythonRunner.read(PythonRunner.scala:1)
"""


def taskFailure(error: str) -> str:
    return TASK_FAILURE.format(error=error)


def test_python_and_java_causes_are_read_from_the_structure_of_the_text() -> None:
    text = taskFailure("expsink.BoomError: task boom: the server at x:1 did not answer")
    python = pythonCausesIn(text)
    assert [(c.className, c.message) for c in python] == [
        ("expsink.BoomError", "task boom: the server at x:1 did not answer")
    ]
    java = javaCausesIn(text)
    assert [c.className for c in java] == ["org.apache.spark.api.python.PythonException"]
    # words that look like classes in a message are not causes
    assert pythonCausesIn("the server said ValueError: nothing") == []


def test_a_twophase_code_decides_and_its_message_is_the_one_shown() -> None:
    message = (
        "[TWOPHASE_REWRITE_PENDING] twophase sink s: batch 3 is decided, ... restart the query."
    )
    verdict = Classifier().classify(
        failureOfText(taskFailure(f"twophase.x.RewritePendingError: {message}"))
    )
    assert verdict.recoverable and verdict.code == "TWOPHASE_REWRITE_PENDING"
    assert verdict.message == message
    assert verdict.errorClass == "twophase.x.RewritePendingError"


def test_a_fatal_code_wins_over_a_recoverable_one_anywhere_in_the_chain() -> None:
    text = taskFailure(
        "twophase.E: [TWOPHASE_UNREACHABLE] no answer\n"
        "Caused by: x.Y: [TWOPHASE_CREDENTIALS] refused"
    )
    verdict = Classifier().classify(failureOfText(text))
    assert not verdict.recoverable and verdict.code == "TWOPHASE_CREDENTIALS"


@pytest.mark.parametrize(
    ("error", "recoverable"),
    [
        ("ZeroDivisionError: division by zero", False),
        ("KeyError: 'id'", False),
        ("mymodule.FlakyError: try again", True),
        ("ConnectionResetError: [Errno 104] Connection reset by peer", True),
    ],
)
def test_python_programming_errors_are_fatal_and_the_rest_recoverable(
    error: str, recoverable: bool
) -> None:
    verdict = Classifier().classify(failureOfText(taskFailure(error)))
    assert verdict.recoverable is recoverable
    assert verdict.message == error


def test_java_classes_decide_only_without_a_python_cause() -> None:
    frame = "\tat a.B.c(B.java:1)\n"
    text = (
        f"org.apache.spark.SparkException: Job aborted\n{frame}"
        f"Caused by: java.lang.NullPointerException: x\n{frame}"
    )
    verdict = Classifier().classify(failureOfText(text))
    assert not verdict.recoverable and verdict.code == "java.lang.NullPointerException"
    lost = (
        f"org.apache.spark.SparkException: Job aborted: ExecutorLostFailure (executor 1)\n{frame}"
    )
    verdict = Classifier().classify(failureOfText(lost))
    assert verdict.recoverable and verdict.code == UNCLASSIFIED
    assert "org.apache.spark.sql.AnalysisException" in FATAL_JAVA


def test_the_users_rules_come_first_by_class_name_or_code() -> None:
    text = taskFailure("mymodule.FlakyError: try again")
    assert not Classifier(fatal=["mymodule.FlakyError"]).classify(failureOfText(text)).recoverable
    zero = failureOfText(taskFailure("ZeroDivisionError: division by zero"))
    assert Classifier(recoverable=[ZeroDivisionError]).classify(zero).recoverable
    coded = failureOfText(taskFailure("x.E: [TWOPHASE_UNREACHABLE] no answer"))
    assert not Classifier(fatal=["TWOPHASE_UNREACHABLE"]).classify(coded).recoverable
    with pytest.raises(TypeError, match="not an exception class"):
        Classifier(fatal=[42])  # type: ignore[list-item]


def test_a_python_error_raised_here_is_read_with_its_superclasses() -> None:
    class LocalError(ConnectionRefusedError):
        pass

    failure = failureOfPython(LocalError("nobody home"))
    assert failure.causes[0].isA("ConnectionError")
    assert Classifier(fatal=[ConnectionError]).classify(failure).recoverable is False
    assert Classifier().classify(failureOfPython(TypeError("bad"))).recoverable is False


class _Refused(SinkSystemError):
    system = "Test"
    reason = SinkFailure.CREDENTIALS


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (TwoPhaseConfigError("option x is wrong"), "TWOPHASE_BAD_OPTION"),
        (SinkContractError("commit returned 3"), "TWOPHASE_SINK_CONTRACT"),
        (TransientCommitError("later"), "TWOPHASE_UNREACHABLE"),
        (_Refused("no"), "TWOPHASE_CREDENTIALS"),
        (SinkSystemError("a row", reason=SinkFailure.REJECTED), "TWOPHASE_REJECTED"),
        (DriverFencedError("u", "s", 1, "run 2", "decides batch 3"), "TWOPHASE_DRIVER_FENCED"),
        (RewritePendingError("s", 3, [0], "timed out"), "TWOPHASE_REWRITE_PENDING"),
        (DecisionLogWriteError("u", "r", OSError(errno.ENOSPC, "full")), "TWOPHASE_LOG_WRITE"),
        (DecisionLogWriteError("u", "r", OSError(errno.EROFS, "ro")), "TWOPHASE_LOG_NOT_WRITABLE"),
        (ConnectionRefusedError("nobody"), "TWOPHASE_UNREACHABLE"),
        (RuntimeError("anything"), None),
    ],
)
def test_each_error_carries_its_code(error: BaseException, code: str | None) -> None:
    assert errorCodeOf(error) == code
    assert code is None or code in CODES


def test_a_commit_failure_takes_the_code_of_its_worst_failure() -> None:
    transient = CommitFailedError("s", 1, [("h", 3, TransientCommitError("later"))])
    assert errorCodeOf(transient) == "TWOPHASE_COMMIT_FAILED"
    refused = CommitFailedError(
        "s", 1, [("h", 1, TransientCommitError("x")), ("g", 1, _Refused("no"))]
    )
    assert errorCodeOf(refused) == "TWOPHASE_CREDENTIALS"


def test_an_error_leaving_for_spark_carries_its_code_once_and_keeps_its_type() -> None:
    error = TwoPhaseConfigError("option x is wrong")
    assert markError(error) == "TWOPHASE_BAD_OPTION"
    markError(error)
    assert str(error) == "[TWOPHASE_BAD_OPTION] option x is wrong"
    assert isinstance(error, TwoPhaseConfigError)
    opaque = ConnectionError(object())
    markError(opaque)
    assert any(n.startswith("[TWOPHASE_UNREACHABLE]") for n in opaque.__notes__)
    plain = RuntimeError("anything")
    assert markError(plain) is None and str(plain) == "anything"


def test_the_docs_table_lists_every_code_with_whether_it_is_restarted() -> None:
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "restarts.md").read_text()
    rows = dict(re.findall(r"^\| `(TWOPHASE_[A-Z_]+)` \| (yes|no) \|", page, re.MULTILINE))
    assert rows == {name: "yes" if c.recoverable else "no" for name, c in CODES.items()}
