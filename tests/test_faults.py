"""Fault injection: a named point kills the process with SIGKILL, once per marker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from twophase import faults

CHILD = """
import sys
from twophase import faults
for item in sys.argv[1:]:
    point, _, batch = item.partition(":")
    faults.crashPoint(point, int(batch))
print("survived", flush=True)
"""


def reach(points: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a child that reaches ``points`` in order; returns how it ended."""
    childEnv = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_CRASH")}
    childEnv.update(env)
    return subprocess.run(
        [sys.executable, "-c", CHILD, *points],
        env=childEnv,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,  # a driver.* point kills the child's process group only
    )


def test_once_dir_fires_each_armed_item_once(tmp_path: Path) -> None:
    onceDir = tmp_path / "once"
    onceDir.mkdir()
    env = {
        faults.ENV: "task.afterBegin:1,task.afterWrite:2,driver.afterDecision:2",
        faults.ONCE_DIR_ENV: str(onceDir),
    }
    path = ["task.afterBegin:0", "task.afterBegin:1", "task.afterWrite:2"]
    path += ["driver.afterDecision:2"]
    ends = [reach(path, env).returncode for _ in range(4)]
    assert ends == [-signal.SIGKILL] * 3 + [0]
    assert sorted(faults.firedItems(str(onceDir))) == [
        "driver.afterDecision:2",
        "task.afterBegin:1",
        "task.afterWrite:2",
    ]


def test_an_unarmed_or_other_batch_point_does_nothing() -> None:
    env = {faults.ENV: "task.afterWrite:5"}
    done = reach(["task.afterWrite:4", "task.afterBegin:5"], env)
    assert done.returncode == 0 and "survived" in done.stdout


def test_the_once_file_stops_every_point_after_the_first_crash(tmp_path: Path) -> None:
    env = {faults.ENV: "task.afterBegin,task.afterWrite", faults.ONCE_ENV: str(tmp_path / "x")}
    assert reach(["task.afterBegin:0"], env).returncode == -signal.SIGKILL
    assert reach(["task.afterBegin:0", "task.afterWrite:0"], env).returncode == 0
    assert (tmp_path / "x").read_text().strip() == "task.afterBegin:0"
