"""The outcome of one verification: ``VerifyReport`` with its counts and first examples.

Library code never prints: :meth:`VerifyReport.describe` renders the report as text for the
``twophase verify`` command, :meth:`VerifyReport.toJson` as JSON-ready data for ``--json``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Example:
    """One identity whose counts differ: its column values, copies offered and copies held."""

    values: dict[str, Any]
    expected: int
    actual: int

    def toJson(self) -> dict[str, Any]:
        return {
            "values": {k: jsonValue(v) for k, v in self.values.items()},
            "expected": self.expected,
            "actual": self.actual,
        }

    def describe(self) -> str:
        shown = ", ".join(
            f"{k}={json.dumps(jsonValue(v), ensure_ascii=False)}" for k, v in self.values.items()
        )
        return f"{shown}: offered {self.expected}, found {self.actual}"


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of one comparison; ``ok`` is true exactly when delivery was exactly-once.

    Counts are in records: ``missing`` copies the sink lacks, ``duplicated`` extra copies of
    offered identities, ``unexpected`` records whose identity was never offered. Examples are
    the first identities of each kind in source order (sink order for ``unexpected``).
    """

    columns: tuple[str, ...]
    expectedRows: int
    actualRows: int
    missing: int
    duplicated: int
    unexpected: int
    missingExamples: tuple[Example, ...] = ()
    duplicatedExamples: tuple[Example, ...] = ()
    unexpectedExamples: tuple[Example, ...] = ()
    source: str = ""
    sink: str = ""
    seconds: float | None = field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.duplicated == 0 and self.unexpected == 0

    def toJson(self) -> dict[str, Any]:
        """The report as JSON-ready data (bytes become text, or ``0x``-hex when not UTF-8)."""
        return {
            "ok": self.ok,
            "source": self.source,
            "sink": self.sink,
            "columns": list(self.columns),
            "expectedRows": self.expectedRows,
            "actualRows": self.actualRows,
            "missing": self.missing,
            "duplicated": self.duplicated,
            "unexpected": self.unexpected,
            "examples": {
                "missing": [e.toJson() for e in self.missingExamples],
                "duplicated": [e.toJson() for e in self.duplicatedExamples],
                "unexpected": [e.toJson() for e in self.unexpectedExamples],
            },
            "seconds": self.seconds,
        }

    def describe(self) -> str:
        """A short human-readable report: the verdict, the counts, then the first examples."""
        verdict = "OK: exactly once" if self.ok else "VIOLATED: not exactly once"
        lines = [f"{verdict}"]
        if self.source:
            lines.append(f"  source      {self.source}")
        if self.sink:
            lines.append(f"  sink        {self.sink}")
        lines += [
            f"  identity    {', '.join(self.columns)}",
            f"  offered     {self.expectedRows} records",
            f"  found       {self.actualRows} records",
            f"  missing     {self.missing}",
            f"  duplicated  {self.duplicated} (extra copies)",
            f"  unexpected  {self.unexpected}",
        ]
        if self.seconds is not None:
            lines.append(f"  time        {self.seconds:.2f} s")
        for kind, examples in (
            ("missing", self.missingExamples),
            ("duplicated", self.duplicatedExamples),
            ("unexpected", self.unexpectedExamples),
        ):
            if examples:
                lines.append(f"first {kind}:")
                lines += [f"  {e.describe()}" for e in examples]
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.describe()


def jsonValue(value: Any) -> Any:
    """``value`` as JSON can hold it: bytes as UTF-8 text (else ``0x``-hex), dates ISO-8601."""
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return "0x" + bytes(value).hex()
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | dt.timedelta):
        return str(value)
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [jsonValue(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonValue(v) for k, v in value.items()}
    return value


__all__ = ["Example", "VerifyReport", "jsonValue"]
