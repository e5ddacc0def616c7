"""What every bench target provides: its rows, Spark's own path, twophase's options, clean-up.

A target is written by several paths in one run (Spark's own, coalesced or not; twophase's
``format()``, coalesced or not; ``twophase.foreachBatch``); each path gets a ``place`` of its
own (a directory, a topic, a table) named by a short label, so the paths never share output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Context:
    """What targets share in one run: the Spark session, a scratch directory, the servers."""

    spark: Any
    work: Path
    pgUrl: str
    bootstrap: str


class Target:
    """One system the bench writes into. Subclasses set the class attributes and ``place``."""

    name = ""
    title = ""
    sparkOwn = ""
    """Spark's own path for this target, as a user would name it."""
    twophaseFormat = ""
    columns: tuple[str, ...] = ("id", "payload")
    """The rows as ``selectExpr`` columns over the bench's ``id`` and ``payload``."""
    bareTitle = ""
    """The client and call of ``bareTask``'s path, as the bench shows it ("": no such path)."""
    packages: tuple[str, ...] = ()
    """Maven coordinates the session needs for Spark's own path."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    @classmethod
    def sessionPackages(cls) -> tuple[str, ...]:
        """Maven coordinates the session needs for Spark's own path."""
        return cls.packages

    @classmethod
    def sessionConf(cls) -> dict[str, str]:
        """Spark settings the session needs for Spark's own path."""
        return {}

    def prepare(self, label: str) -> None:
        """Create what the path ``label`` writes into (a table, a topic), empty."""

    def sparkWriter(self, frame: Any, label: str) -> Any:
        """``frame``'s ``writeStream`` into Spark's own path, without a checkpoint."""
        raise NotImplementedError

    def twophaseOptions(self, label: str) -> dict[str, str]:
        """The options of ``format(self.twophaseFormat)`` for the path ``label``."""
        raise NotImplementedError

    def bareTask(self, label: str) -> Callable[..., Any]:
        """A ``bench.bare`` ``mapInArrow`` function bound to the place ``label``: the rows
        written by the Python client twophase uses, without twophase (only where ``bareTitle``
        is set)."""
        raise NotImplementedError

    def server(self) -> str | None:
        """The URL or ``host:port`` of the server this target writes to (``None``: no server,
        as for local files), so a bench can count that server's CPU time."""
        return None

    def filesWritten(self, label: str, own: bool) -> int | None:
        """Data files the path ``label`` made visible (``own``: Spark's own path), or None
        where the target is not files."""
        return None

    def cleanup(self) -> None:
        """Drop every place this target made (best effort)."""
