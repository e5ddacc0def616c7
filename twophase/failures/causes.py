"""What a failed query's error says: its chain of causes by class, and the codes it carries.

A query's error is a Java exception whose causes may hold Python tracebacks as text (an error
in a task, in a data source's planning or commit worker, in a ``foreachBatch`` function). A
``Failure`` keeps, for each cause, its class and the first line of its message, from the Java
chain itself where the session gives it (``twophase.spark.supervise``) and from the structure
of the text otherwise: a Java cause is a ``Caused by:`` line, or a line followed by a stack
frame (``at ...``); a Python cause is the line that ends a traceback's frames. Classes are
read only where the text's structure puts a class, never guessed from free words.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field

from twophase.failures.codes import codesIn

JAVA = "java"
PYTHON = "python"

_TRACEBACK = re.compile(r"Traceback \(most recent call last\):\s*$")
_PYTHON_LINE = re.compile(r"^(?P<cls>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:: (?P<message>.*))?$")
_JAVA_NAME = r"(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*"
_CAUSED_BY = re.compile(
    rf"^\s*(?:Caused by|Suppressed): (?P<cls>{_JAVA_NAME})(?:: (?P<message>.*))?$"
)
_JAVA_LINE = re.compile(rf"^(?P<cls>{_JAVA_NAME})(?:: (?P<message>.*))?$")
_FRAME = re.compile(r"^\s+at [\w$.<>]+\(")


@dataclass(frozen=True)
class Cause:
    """One exception of a failure's chain: its class, the first line of its message, which
    side raised it (``java`` or ``python``) and the classes it is known to extend."""

    className: str
    message: str
    side: str
    superclasses: tuple[str, ...] = ()

    @property
    def shortName(self) -> str:
        return self.className.rsplit(".", 1)[-1]

    def isA(self, name: str) -> bool:
        """Whether this cause is of class ``name`` (qualified, or bare for Python's builtins
        and ``__main__``), itself or by a known superclass."""
        names = (self.className, *self.superclasses)
        if "." in name:
            return name in names
        return any(n == name or n.rsplit(".", 1)[-1] == name for n in names)

    def line(self) -> str:
        return f"{self.className}: {self.message}" if self.message else self.className


@dataclass(frozen=True)
class Failure:
    """A failed query's error as classes and text: ``causes`` outermost first, ``text`` whole."""

    causes: tuple[Cause, ...]
    text: str
    summary: str = ""
    """The error's own first line, as the query reported it."""
    codes: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "codes", tuple(codesIn(self.text)))

    def of(self, side: str) -> list[Cause]:
        return [c for c in self.causes if c.side == side]


def _first(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0].strip() if lines else ""


def pythonCausesIn(text: str) -> list[Cause]:
    """The Python exceptions whose tracebacks ``text`` holds, in the order they stand: the
    line that ends each traceback's frames, ``module.Class: message``."""
    found: list[Cause] = []
    inFrames = False
    for line in text.splitlines():
        if _TRACEBACK.search(line):
            inFrames = True
            continue
        if not inFrames or not line.strip():
            continue
        if line[:1].isspace():
            continue  # a frame, its code line, or the carets under it
        inFrames = False
        match = _PYTHON_LINE.match(line.strip())
        if match is not None:
            found.append(Cause(match.group("cls"), (match.group("message") or "").strip(), PYTHON))
    return found


def javaCausesIn(text: str) -> list[Cause]:
    """The Java exceptions ``text`` shows: its ``Caused by:`` lines, and a class line followed
    by a stack frame."""
    lines = text.splitlines()
    found: list[Cause] = []
    for index, line in enumerate(lines):
        match = _CAUSED_BY.match(line)
        if match is None:
            following = lines[index + 1] if index + 1 < len(lines) else ""
            match = _JAVA_LINE.match(line.strip()) if _FRAME.match(following) else None
        if match is not None:
            found.append(Cause(match.group("cls"), (match.group("message") or "").strip(), JAVA))
    return found


def failureOfText(text: str, java: Iterable[Cause] = ()) -> Failure:
    """A failure from an error's text, with the Java chain ``java`` when the session gave it
    (else the Java causes the text shows)."""
    javaCauses = list(java) or javaCausesIn(text)
    return Failure((*javaCauses, *pythonCausesIn(text)), text, _first(text))


def failureOfPython(exc: BaseException) -> Failure:
    """A failure from a Python exception raised in this process (a ``start`` that failed):
    each exception of its chain by class and superclasses, and its traceback's text."""
    causes: list[Cause] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        names = tuple(_qualified(t) for t in type(current).__mro__[1:] if t is not object)
        causes.append(Cause(_qualified(type(current)), _first(str(current)), PYTHON, names))
        current = current.__cause__ or current.__context__
    text = "".join(traceback.format_exception(exc))
    javaSide = javaCausesIn(text)
    return Failure((*causes, *javaSide), text, causes[0].line())


def _qualified(cls: type) -> str:
    module = cls.__module__
    if module in ("builtins", "__main__"):
        return cls.__qualname__
    return f"{module}.{cls.__qualname__}"


__all__ = [
    "JAVA",
    "PYTHON",
    "Cause",
    "Failure",
    "failureOfPython",
    "failureOfText",
    "javaCausesIn",
    "pythonCausesIn",
]
