"""Whether a run's driver still runs, and how a claim and ``twophase status`` say it.

Real processes of this host: a child that has ended (its pid gone), this test's own process
(running, started before a claim made now, and a "reused" pid for a claim dated before it
started), and a driver on another host, of which nothing can be told. The claim of a new run
logs an ordinary takeover at INFO only when the older driver is known to be gone.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from twophase import cli
from twophase.coordinator import DecisionLog, Driver
from twophase.coordinator.holding import Holding
from twophase.coordinator.liveness import Liveness, checkDriver, processStart
from twophase.coordinator.runs import Run

HOST = socket.gethostname()


def endedPid() -> int:
    """The pid of a child that ran and was reaped: no process has it now."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert processStart(child.pid) is None
    return child.pid


def run(pid: int | None, host: str = HOST, claimedAt: datetime | None = None) -> Run:
    return Run(1, Driver("d", host, pid, "Spark driver"), claimedAt or datetime.now(UTC))


def test_the_driver_is_running_gone_or_unknown() -> None:
    mine = checkDriver(run(os.getpid()))
    assert mine.liveness is Liveness.RUNNING and mine.mayRun
    assert mine.reason == f"process {os.getpid()} still runs on this host"

    gone = endedPid()
    ended = checkDriver(run(gone))
    assert ended.liveness is Liveness.GONE and not ended.mayRun
    assert ended.reason == f"no process {gone} runs on this host any more"

    reused = checkDriver(run(os.getpid(), claimedAt=datetime(2001, 1, 1, tzinfo=UTC)))
    assert reused.liveness is Liveness.GONE and "after the claim" in reused.reason

    elsewhere = checkDriver(run(4242, host="host-b"))
    assert elsewhere.liveness is Liveness.UNKNOWN and elsewhere.mayRun
    assert elsewhere.said == (
        f"it runs on host-b, not on this host ({HOST}): cannot tell whether it still runs"
    )
    assert checkDriver(run(None)).liveness is Liveness.UNKNOWN


def test_a_claim_after_a_gone_driver_is_an_ordinary_takeover_else_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holding = Holding(DecisionLog(str(tmp_path / "log")), "s1")
    gone = endedPid()
    holding.claim(Driver("old", HOST, gone, "Spark driver"), None, 1)
    with caplog.at_level(logging.INFO, logger="twophase.coordinator.holding"):
        holding.claim(Driver("new", HOST, os.getpid(), "Spark driver"), None, 1)
        holding.claim(Driver("third", "host-b", 4242, "Spark driver"), None, 1)
        holding.claim(Driver("fourth", HOST, os.getpid(), "twophase recover"), None, 1)
    first, second, third = caplog.records
    assert first.levelno == logging.INFO, first.getMessage()
    assert f"took the log over from run 1, Spark driver on {HOST}, pid {gone}" in (
        first.getMessage()
    )
    assert (
        f"(no process {gone} runs on this host any more): an ordinary takeover, batches [0, 1] "
        "closed to the old run" in first.getMessage()
    ), first.getMessage()
    assert "fenced out" not in first.getMessage()

    assert second.levelno == logging.WARNING
    assert f"fenced out run 2, Spark driver on {HOST}, pid {os.getpid()}" in second.getMessage()
    assert (
        f"(process {os.getpid()} still runs on this host), which still runs: batches [0, 1] "
        "closed to it" in second.getMessage()
    )
    assert third.levelno == logging.WARNING
    assert "cannot tell whether it still runs), which may still be running" in third.getMessage()
    assert "stop the one that should not run" in third.getMessage()


def test_status_says_whether_the_newest_runs_driver_still_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = tmp_path / "ckpt" / "twophase" / "s1"
    log = DecisionLog(str(url))
    log.claim("s1", "q-1")
    holding = Holding(log, "s1")
    gone = endedPid()
    holding.claim(Driver("old", HOST, gone, "Spark driver"), None, None)

    def newestRun() -> str:
        assert cli.main(["status", "--checkpoint", str(tmp_path / "ckpt")]) == 0
        out = capsys.readouterr().out
        return next(line for line in out.splitlines() if line.startswith("  newest run"))

    assert newestRun().endswith(
        f"; its driver is gone (no process {gone} runs on this host any more): the next start "
        "takes the log over"
    )
    holding.claim(Driver("new", HOST, os.getpid(), "Spark driver"), None, None)
    assert newestRun().endswith(f"; its driver still runs (process {os.getpid()} still runs on "
                                "this host)")  # fmt: skip
    holding.claim(Driver("b", "host-b", 4242, "Spark driver"), None, None)
    line = newestRun()
    assert "run 3, Spark driver on host-b, pid 4242" in line
    assert line.endswith("cannot tell whether it still runs")
    assert cli.main(["status", "--checkpoint", str(tmp_path / "ckpt"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["run"]["driverLiveness"] == "unknown" and info["run"]["epoch"] == 3
