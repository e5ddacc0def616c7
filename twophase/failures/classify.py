"""Which failures a restart can help: the classification of a failed query's error.

In order, the first that says something decides:

1. the user's own classes or codes (``fatal`` before ``recoverable``), anywhere in the chain;
2. twophase's codes (``twophase.failures.codes``): fatal if any code it carries is fatal;
3. the Python exceptions of its tracebacks: a programming error (``TypeError``, ``KeyError``,
   ``ZeroDivisionError``, ...) is fatal, since running the same code again fails the same way;
4. the Java exceptions of its chain, Python's ``foreachBatch`` and worker wrappers aside: an
   analysis error, an illegal argument, a missing class, an out-of-memory error are fatal;
5. anything else (an executor lost, a worker that crashed, an I/O error, a network error) is
   recoverable, as Flink restarts on any error it is not told is fatal.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from twophase.failures.causes import JAVA, PYTHON, Cause, Failure
from twophase.failures.codes import CODES, MARK

FATAL_PYTHON = frozenset(
    {
        "ArithmeticError",
        "AssertionError",
        "AttributeError",
        "ImportError",
        "IndexError",
        "KeyError",
        "LookupError",
        "ModuleNotFoundError",
        "NameError",
        "NotImplementedError",
        "OverflowError",
        "RecursionError",
        "SyntaxError",
        "TypeError",
        "UnboundLocalError",
        "UnicodeDecodeError",
        "UnicodeEncodeError",
        "ValueError",
        "ZeroDivisionError",
    }
)
"""Python's programming errors: a restart runs the same code into the same error."""

FATAL_JAVA = frozenset(
    {
        "java.lang.ArithmeticException",
        "java.lang.ArrayIndexOutOfBoundsException",
        "java.lang.ClassCastException",
        "java.lang.ClassNotFoundException",
        "java.lang.IllegalArgumentException",
        "java.lang.NoClassDefFoundError",
        "java.lang.NoSuchMethodError",
        "java.lang.NullPointerException",
        "java.lang.NumberFormatException",
        "java.lang.OutOfMemoryError",
        "java.lang.UnsupportedOperationException",
        "java.time.DateTimeException",
        "org.apache.spark.SparkIllegalArgumentException",
        "org.apache.spark.SparkUnsupportedOperationException",
        "org.apache.spark.SparkUpgradeException",
        "org.apache.spark.sql.AnalysisException",
        "org.apache.spark.sql.catalyst.parser.ParseException",
    }
)
"""Java's errors of a query that cannot run as written (or a driver out of memory)."""

WRAPPERS = frozenset(
    {
        "org.apache.spark.sql.streaming.StreamingQueryException",
        "org.apache.spark.SparkException",
        "org.apache.spark.api.python.PythonException",
        "org.apache.spark.sql.execution.streaming.sources.ForeachBatchUserFuncException",
        "py4j.Py4JException",
        "pyspark.errors.exceptions.captured.PythonException",
        "pyspark.errors.exceptions.captured.StreamingQueryException",
        "pyspark.errors.exceptions.base.PythonException",
        "py4j.protocol.Py4JJavaError",
    }
)
"""Classes that only carry another's error across a boundary: they never decide."""

UNCLASSIFIED = "UNCLASSIFIED"
"""The code of a failure nothing classified (recoverable)."""


@dataclass(frozen=True)
class Verdict:
    """What a failure is: recoverable or not, its code (twophase's, else the class that
    decided, else ``UNCLASSIFIED``), why, the class of the error and the line to show."""

    recoverable: bool
    code: str
    reason: str
    errorClass: str
    message: str


Rule = type[BaseException] | str
"""A user's rule: an exception class, or a class's name (Java or Python), or a code
(``TWOPHASE_...``, or a Spark error condition such as ``DATA_SOURCE_NOT_FOUND``)."""


class Classifier:
    """Classifies failures by the rules of the module's docstring; ``fatal`` and
    ``recoverable`` add the user's own classes and codes, which come first."""

    def __init__(self, recoverable: Iterable[Rule] = (), fatal: Iterable[Rule] = ()) -> None:
        self.recoverable = tuple(_checked(r, "recoverable") for r in recoverable)
        self.fatal = tuple(_checked(r, "fatal") for r in fatal)

    def classify(self, failure: Failure) -> Verdict:
        for rules, recoverable in ((self.fatal, False), (self.recoverable, True)):
            for rule in rules:
                hit = _matching(rule, failure)
                if hit is not None:
                    kind = "recoverable" if recoverable else "fatal"
                    return _verdict(failure, recoverable, hit, f"{kind} by the query's own rule")
        if failure.codes:
            fatal = [c for c in failure.codes if not CODES[c].recoverable]
            code = fatal[0] if fatal else failure.codes[0]
            return Verdict(
                CODES[code].recoverable,
                code,
                CODES[code].meaning,
                _classNear(failure, code),
                _codedLine(failure.text, code),
            )
        python = [c for c in failure.of(PYTHON) if c.className not in WRAPPERS]
        if python:
            return _byClass(failure, python, FATAL_PYTHON, "a programming error")
        java = [c for c in failure.of(JAVA) if c.className not in WRAPPERS]
        if java:
            return _byClass(failure, java, FATAL_JAVA, "a query that cannot run as written")
        return Verdict(True, UNCLASSIFIED, "not classified", "", failure.summary)


def _checked(rule: Rule, side: str) -> Rule:
    if isinstance(rule, str) and rule.strip():
        return rule.strip()
    if isinstance(rule, type) and issubclass(rule, BaseException):
        return rule
    raise TypeError(
        f"twophase.supervise({side}=...): {rule!r} is not an exception class, a class's name or "
        "an error code; give e.g. MyError, 'java.sql.SQLTransientException' or "
        "'TWOPHASE_UNREACHABLE'"
    )


def _matching(rule: Rule, failure: Failure) -> str | None:
    """What of ``failure`` the rule names (a code, or a cause's class), or ``None``."""
    if isinstance(rule, str) and rule.isupper() and "." not in rule:
        codes = {m.group(1) for m in MARK.finditer(failure.text)}
        if rule in codes or f"[{rule}]" in failure.text:
            return rule
        return None
    if isinstance(rule, type):
        module = rule.__module__
        names = [rule.__qualname__] if module in ("builtins", "__main__") else []
        names.append(f"{module}.{rule.__qualname__}")
    else:
        names = [rule]
    for cause in failure.causes:
        if any(cause.isA(name) for name in names):
            return cause.className
    return None


def _verdict(failure: Failure, recoverable: bool, hit: str, reason: str) -> Verdict:
    cause = next((c for c in failure.causes if c.className == hit), None)
    if cause is not None:
        return Verdict(recoverable, hit, reason, cause.className, cause.line())
    return Verdict(
        recoverable, hit, reason, _classNear(failure, hit), _codedLine(failure.text, hit)
    )


def _byClass(
    failure: Failure, causes: list[Cause], fatalClasses: frozenset[str], why: str
) -> Verdict:
    fatal = next((c for c in causes if any(c.isA(n) for n in fatalClasses)), None)
    if fatal is not None:
        return Verdict(False, fatal.className, why, fatal.className, fatal.line())
    last = causes[-1]
    return Verdict(True, UNCLASSIFIED, "not classified", last.className, last.line())


def _codedLine(text: str, code: str) -> str:
    """The message that carries ``code``, from the code to the end of its line."""
    at = text.find(f"[{code}]")
    if at < 0:
        return ""
    return text[at:].splitlines()[0].strip()


def _classNear(failure: Failure, code: str) -> str:
    """The class of the Python exception whose message carries ``code``, if the text shows it."""
    for cause in failure.of(PYTHON):
        if cause.message.startswith(f"[{code}]"):
            return cause.className
    return ""


__all__ = [
    "FATAL_JAVA",
    "FATAL_PYTHON",
    "UNCLASSIFIED",
    "WRAPPERS",
    "Classifier",
    "Rule",
    "Verdict",
]
