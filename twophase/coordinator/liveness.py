"""Whether a run's driver still runs: its process on this host, told apart from a later one.

A run record names its driver's host and process id (:mod:`~twophase.coordinator.runs`), and
that is all there is to go by. On the record's own host the process is looked up in ``/proc``:
a pid that no process has (or a zombie's) means the driver is gone, and so does a pid that a
process started after the run's claim has now (the pid was reused); a pid whose process started
before the claim is taken for the driver. On another host, without a pid or without ``/proc``,
nothing can be told, and the caller must say so rather than guess.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path

from twophase.coordinator.records import isoTime
from twophase.coordinator.runs import Run

CLAIM_SLACK_SECONDS = 2.0
"""How much later than the claim a process may seem to have started and still be the driver:
``/proc/stat``'s boot time has whole seconds, and the wall clock may have been stepped."""

PROC = Path("/proc")


class Liveness(StrEnum):
    """What can be told of a run's driver from here."""

    RUNNING = "running"
    """Its process runs on this host, started before the claim."""
    GONE = "gone"
    """No process of that pid on this host, or a later one under a reused pid."""
    UNKNOWN = "unknown"
    """Another host, no pid in the record, or no ``/proc`` to look in."""


@dataclass(frozen=True)
class DriverCheck:
    """The verdict on one run's driver, and the reason in a few words for an operator."""

    liveness: Liveness
    reason: str

    @property
    def mayRun(self) -> bool:
        """False only when the driver is known to be gone."""
        return self.liveness is not Liveness.GONE

    @property
    def said(self) -> str:
        """The reason, and for an unknown one that nothing could be told."""
        if self.liveness is Liveness.UNKNOWN:
            return f"{self.reason}: cannot tell whether it still runs"
        return self.reason

    def toJson(self) -> dict[str, str]:
        return {"driverLiveness": str(self.liveness), "driverCheck": self.said}


def checkDriver(run: Run, host: str | None = None) -> DriverCheck:
    """Whether the driver of ``run`` still runs, as far as this host can tell (read-only)."""
    here = socket.gethostname() if host is None else host
    pid = run.driver.pid
    if not run.driver.host or run.driver.host != here:
        where = run.driver.host or "an unknown host"
        return DriverCheck(Liveness.UNKNOWN, f"it runs on {where}, not on this host ({here})")
    if pid is None:
        return DriverCheck(Liveness.UNKNOWN, "its record names no process id")
    if not PROC.is_dir() or bootTime() is None:
        return DriverCheck(Liveness.UNKNOWN, "this host has no /proc to look in")
    started = processStart(pid)
    if started is None:
        return DriverCheck(Liveness.GONE, f"no process {pid} runs on this host any more")
    if started > run.claimedAt + timedelta(seconds=CLAIM_SLACK_SECONDS):
        return DriverCheck(
            Liveness.GONE,
            f"process {pid} on this host started at {isoTime(started)}, after the claim: its "
            "pid is another process's now",
        )
    return DriverCheck(Liveness.RUNNING, f"process {pid} still runs on this host")


def processStart(pid: int) -> datetime | None:
    """When process ``pid`` started (``/proc/<pid>/stat`` against the boot time), or ``None``
    when there is no such process or it has ended (a zombie)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        state, ticks = fields[0], int(fields[19])
        boot = bootTime()
    except (OSError, ValueError, IndexError):
        return None
    if state in ("Z", "X", "x") or boot is None:
        return None  # ended, not reaped yet
    return boot + timedelta(seconds=ticks / os.sysconf("SC_CLK_TCK"))


def bootTime() -> datetime | None:
    """The host's boot time (``btime`` of ``/proc/stat``), or ``None`` where it cannot be read."""
    try:
        lines = (PROC / "stat").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("btime "):
            return datetime.fromtimestamp(int(line.split()[1]), UTC)
    return None


__all__ = ["DriverCheck", "Liveness", "checkDriver", "processStart"]
