"""Who may decide in a decision log: runs, one per driver, numbered in the order they claimed it.

A run is one driver of the query (the binding says who: a Spark application's driver, or
``twophase recover``), numbered by its *epoch*. ``run-<epoch>.json`` is created only where it
does not exist (the store's create-if-absent), as one more than the highest run listed, so two
drivers never share an epoch and the newest claim is the highest. The run with the highest
epoch holds the log; an older one is fenced (:mod:`~twophase.coordinator.holding`). The records
are for that order and for operators; the newest ``RUNS_KEPT`` are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from twophase.coordinator.records import header, isoTime, parseTime, runName
from twophase.coordinator.storage import CorruptRecord, LogStorage
from twophase.redaction import getLogger
from twophase.version import __version__

log = getLogger(__name__)

RUNS_KEPT = 20
"""Runs whose records the log keeps (the newest); older ones go when the log is pruned."""


@dataclass(frozen=True)
class Driver:
    """A driver as the binding knows it: an id stable for the driver's life, and what to tell an
    operator (``kind`` such as "Spark driver", the host, the process id)."""

    id: str
    host: str
    pid: int | None
    kind: str

    def toJson(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host, "pid": self.pid, "kind": self.kind}

    @classmethod
    def fromJson(cls, data: Any) -> Driver:
        if not isinstance(data, dict):
            raise ValueError("driver is not a JSON object")
        pid = data.get("pid")
        return cls(
            str(data["id"]),
            str(data.get("host", "")),
            int(pid) if pid is not None else None,
            str(data.get("kind", "driver")),
        )


@dataclass(frozen=True)
class Run:
    """One claim of the log: its epoch, the driver that made it and when."""

    epoch: int
    driver: Driver
    claimedAt: datetime
    queryId: str | None = None
    twophase: str | None = None
    """The twophase version that claimed it (``None``: format 1, written by 0.1.0 or earlier)."""

    def toJson(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "driver": self.driver.toJson(),
            "claimedAt": isoTime(self.claimedAt),
            "description": self.describe(),
        }

    def describe(self) -> str:
        """One line for an operator: which run, which driver, where and since when."""
        pid = f", pid {self.driver.pid}" if self.driver.pid is not None else ""
        return (
            f"run {self.epoch}, {self.driver.kind} on {self.driver.host or 'an unknown host'}"
            f"{pid}, claimed the log at {isoTime(self.claimedAt)}"
        )


class RunRecords:
    """The runs' records in one log directory."""

    def __init__(self, storage: LogStorage) -> None:
        self._storage = storage

    def newest(self) -> int | None:
        """The highest epoch listed (one listing), or ``None`` when no run ever claimed."""
        return max(self._storage.listing().runs, default=None)

    def read(self, epoch: int) -> Run | None:
        """The record of run ``epoch``; ``None`` if gone (pruned) or unreadable;
        ``LogFormatError`` if a newer twophase wrote it in a newer format."""
        path = self._storage.path(runName(epoch))
        try:
            body = self._storage.readRecord(path)
            if body.get("epoch") != epoch:
                raise CorruptRecord("its content names another run")
            return Run(
                epoch,
                Driver.fromJson(body["driver"]),
                parseTime(body["claimedAt"]),
                body.get("queryId"),
                body.get("twophase") if isinstance(body.get("twophase"), str) else None,
            )
        except FileNotFoundError:
            return None
        except (CorruptRecord, KeyError, TypeError, ValueError) as exc:
            log.warning("decision log %s: ignoring run record %s: %s", self._storage.url, path, exc)
            return None

    def create(self, epoch: int, driver: Driver, queryId: str | None) -> Run | None:
        """Claim ``epoch`` for ``driver``; ``None`` when another driver created it first.

        The run before (the newest, which the caller counts from) is read first: a log that a
        newer twophase holds stops the start with ``LogFormatError`` before anything is
        written, the claim included.
        """
        if epoch > 1:
            self.read(epoch - 1)
        run = Run(epoch, driver, datetime.now(UTC), queryId, __version__)
        body = {
            **header(),
            "epoch": epoch,
            "driver": driver.toJson(),
            "claimedAt": isoTime(run.claimedAt),
            "queryId": queryId,
        }
        try:
            self._storage.publish(
                runName(epoch), body, exclusive=True, what=f"the claim of run {epoch}"
            )
        except FileExistsError:
            theirs = self.read(epoch)
            if theirs is not None and theirs.driver.id == driver.id:
                return theirs  # our own write, answered as a conflict after a retry
            return None
        return run
