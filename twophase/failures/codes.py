"""twophase's error codes: the stable name of each failure, and whether a restart can help.

An error raised in a Python worker reaches the driver as the text of a Java exception, so its
Python class is gone by the time a query has failed. Like Spark's own error classes, each of
twophase's errors therefore carries a code in its message, ``[TWOPHASE_UNREACHABLE] ...``, put
there where the error leaves twophase for Spark (``twophase.spark.coded``). An error class
declares its code as ``errorCode`` (a class attribute, or a property where the instance
decides: a ``SinkSystemError`` by its ``reason``). Supervision (``twophase.supervise``) reads
the codes back from a failed query's error and restarts only for the recoverable ones.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class ErrorCode:
    """One code: its name, whether a restart of the query can help, and what it means."""

    name: str
    recoverable: bool
    meaning: str


def _codes(*codes: ErrorCode) -> Mapping[str, ErrorCode]:
    return MappingProxyType({c.name: c for c in codes})


CODES: Mapping[str, ErrorCode] = _codes(
    ErrorCode("TWOPHASE_UNREACHABLE", True, "a system did not answer or dropped the connection"),
    ErrorCode(
        "TWOPHASE_COMMIT_FAILED",
        True,
        "a decided batch could not be committed yet; the decision is durable",
    ),
    ErrorCode(
        "TWOPHASE_REWRITE_PENDING",
        True,
        "the system aborted decided transactions; the restart writes them again",
    ),
    ErrorCode(
        "TWOPHASE_LOG_WRITE",
        True,
        "the decision log's filesystem refused a write (full, or an I/O error)",
    ),
    ErrorCode("TWOPHASE_BAD_OPTION", False, "an option is missing or wrong"),
    ErrorCode(
        "TWOPHASE_CREDENTIALS",
        False,
        "a system refused the credentials or the privileges the sink needs",
    ),
    ErrorCode(
        "TWOPHASE_REJECTED",
        False,
        "a system refused the work itself: a record, the schema, the table",
    ),
    ErrorCode("TWOPHASE_SINK_CONTRACT", False, "a sink returned what twophase cannot use"),
    ErrorCode(
        "TWOPHASE_REWRITE_MISMATCH",
        False,
        "the replay of a batch gave other records than its decision holds",
    ),
    ErrorCode(
        "TWOPHASE_TRANSACTION_LOST",
        False,
        "a decided transaction is gone and cannot be written again",
    ),
    ErrorCode(
        "TWOPHASE_DRIVER_FENCED",
        False,
        "another driver holds the decision log: this one must not run",
    ),
    ErrorCode("TWOPHASE_LOG_OWNERSHIP", False, "the decision log belongs to another query"),
    ErrorCode(
        "TWOPHASE_UNFENCED_LOG_STORE",
        False,
        "the decision log's store cannot fence a second driver",
    ),
    ErrorCode(
        "TWOPHASE_LOG_NOT_WRITABLE",
        False,
        "the decision log's filesystem is read-only or closed to this process",
    ),
    ErrorCode(
        "TWOPHASE_LOG_FORMAT",
        False,
        "a persisted record was written by a newer twophase than this one",
    ),
    ErrorCode(
        "TWOPHASE_LOG_CONFLICT",
        False,
        "a state change the decision log forbids (the log was edited or reset)",
    ),
    ErrorCode(
        "TWOPHASE_SOURCE_UNREADABLE",
        False,
        "the source cannot go on without losing or inventing records",
    ),
    ErrorCode("TWOPHASE_SPARK_VERSION", False, "this PySpark cannot run what the query asks"),
    ErrorCode(
        "TWOPHASE_CLUSTER_PYTHON",
        False,
        "the cluster's Python workers lack this twophase or have another version",
    ),
    ErrorCode(
        "TWOPHASE_CONNECT_SERVER",
        False,
        "the Spark Connect server's Python cannot import this twophase",
    ),
)
"""Every code twophase's errors carry."""

MARK = re.compile(r"\[(TWOPHASE_[A-Z0-9_]+)\]")
"""A code as it stands in a message: ``[TWOPHASE_UNREACHABLE]``."""


def marked(code: str, message: str) -> str:
    """``message`` with ``code`` in front, as it crosses into Spark (once)."""
    if message.startswith(f"[{code}]"):
        return message
    return f"[{code}] {message}"


def codesIn(text: str) -> list[str]:
    """The known codes ``text`` carries, in the order they stand, each once."""
    found: list[str] = []
    for match in MARK.finditer(text):
        name = match.group(1)
        if name in CODES and name not in found:
            found.append(name)
    return found


def declaredCode(exc: BaseException) -> str | None:
    """The code an exception's class (or the exception itself) declares, if it is a known one."""
    code = getattr(exc, "errorCode", None)
    return code if isinstance(code, str) and code in CODES else None


__all__ = ["CODES", "MARK", "ErrorCode", "codesIn", "declaredCode", "marked"]
