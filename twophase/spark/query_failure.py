"""A failed streaming query's error as a ``twophase.failures.Failure``: its causes by class.

On a classic session the Java exception behind ``query.exception()`` is walked cause by
cause, each with its class and the classes it extends, and its whole text (messages with the
Python tracebacks they carry) is read for Python causes and twophase's codes. On Spark Connect
only the text reaches the client, and the causes are read from its structure.
"""

from __future__ import annotations

from typing import Any

from twophase.failures.causes import JAVA, Cause, Failure, failureOfText
from twophase.redaction import getLogger

log = getLogger(__name__)

MAX_CAUSES = 32
"""Causes read at most (a chain that loops ends there)."""


def failureOfQuery(query: Any, error: BaseException | None) -> Failure:
    """The failure that ended ``query``, whose Python error (``query.exception()``, or what
    ``awaitTermination`` raised) is ``error``."""
    jsq = getattr(query, "_jsq", None)
    if jsq is not None:
        try:
            return _ofJava(jsq)
        except Exception as exc:  # the JVM cannot say: read the text
            log.debug("could not read the Java error of query %s: %s", query, exc)
    return failureOfText(_textOf(error))


def _ofJava(jsq: Any) -> Failure:
    from pyspark import SparkContext

    found = jsq.exception()
    if not found.isDefined():
        raise LookupError("the query has no exception")
    throwable = found.get()
    jvm = SparkContext._jvm
    text = str(getattr(jvm, "org.apache.spark.util.Utils").exceptionString(throwable))
    causes: list[Cause] = []
    current = throwable
    while current is not None and len(causes) < MAX_CAUSES:
        cls = current.getClass()
        name = str(cls.getName())
        supers: list[str] = []
        parent = cls.getSuperclass()
        while parent is not None and str(parent.getName()) != "java.lang.Object":
            supers.append(str(parent.getName()))
            parent = parent.getSuperclass()
        message = str(current.getMessage() or "")
        first = message.strip().splitlines()[0] if message.strip() else ""
        causes.append(Cause(name, first, JAVA, tuple(supers)))
        following = current.getCause()
        current = None if following is None or following.equals(current) else following
    return failureOfText(text, causes)


def _textOf(error: BaseException | None) -> str:
    if error is None:
        return ""
    parts = [str(error)]
    trace = getattr(error, "_stackTrace", None) or getattr(error, "stackTrace", None)
    if isinstance(trace, str) and trace not in parts[0]:
        parts.append(trace)
    return "\n".join(parts)


__all__ = ["failureOfQuery"]
