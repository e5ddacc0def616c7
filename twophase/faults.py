"""Deterministic fault injection: crash this process abruptly at a named protocol step.

Tests and the chaos harness set ``TWOPHASE_CRASH_AT`` to ``<point>`` or ``<point>:<batchId>``
(several separated by commas). When the running code reaches that point, the whole process
group (``driver.*`` points) or the task's Python worker (``task.*`` points) is killed with
SIGKILL: no ``finally``, no atexit, exactly like a power cut. Spark's driver-side Python workers
share the process group of the driver that spawned them, so a driver point takes down the
driver JVM too; run the query in its own session (``start_new_session``). A task point kills
the worker mid-task: Spark sees the attempt die and retries it, leaving its debris behind.

Points (see PROTOCOL.md section 5): ``task.afterBegin``, ``task.afterWrite``,
``task.afterPreCommit``, ``driver.beforeDecision``, ``driver.afterDecision``,
``driver.betweenCommits``, ``driver.beforeCompleteBatch``, ``driver.afterCommits``,
``driver.afterCommitted``, ``driver.duringRecovery``.

``TWOPHASE_CRASH_ONCE_DIR`` instead makes every armed item fire once on its own (a marker per
item in that directory): several task points armed in one query start each kill one attempt.

``TWOPHASE_CRASH_ACTION=pause:<dir>`` makes the point stand still instead of killing: the
process writes ``<dir>/paused-<pid>`` and waits until ``<dir>/release`` exists, so a test can
freeze the whole driver there (SIGSTOP), start a second driver on the same checkpoint, and let
the first go on afterwards.
"""

from __future__ import annotations

import os
import signal
import time

from twophase.redaction import getLogger

log = getLogger(__name__)

ENV = "TWOPHASE_CRASH_AT"
ONCE_ENV = "TWOPHASE_CRASH_ONCE_FILE"
ONCE_DIR_ENV = "TWOPHASE_CRASH_ONCE_DIR"
GROUP_ENV = "TWOPHASE_CRASH_PGID"
ACTION_ENV = "TWOPHASE_CRASH_ACTION"
PAUSE_LIMIT_SECONDS = 900.0
"""How long a paused point waits for its release before it goes on by itself."""

POINTS = (
    "task.afterBegin",
    "task.afterWrite",
    "task.afterPreCommit",
    "driver.beforeDecision",
    "driver.afterDecision",
    "driver.betweenCommits",
    "driver.beforeCompleteBatch",
    "driver.afterCommits",
    "driver.afterCommitted",
    "driver.duringRecovery",
)


def markQueryProcessGroup() -> None:
    """Record this process's group as the one a ``driver.*`` point kills.

    Call it in the process that starts the query, before Spark starts: the JVM and every
    Python worker inherit the variable. Needed because PySpark's daemon puts its workers in
    process groups of their own, so the commit worker's group is not the driver's.
    """
    os.environ.setdefault(GROUP_ENV, str(os.getpgid(0)))


def _armedItem(point: str, batchId: int | None) -> str | None:
    """The item of ``TWOPHASE_CRASH_AT`` that names this point (and batch), if any."""
    spec = os.environ.get(ENV, "")
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, batch = item.partition(":")
        if name != point:
            continue
        if batch and (batchId is None or int(batch) != batchId):
            continue
        onceDir = os.environ.get(ONCE_DIR_ENV)
        if onceDir and os.path.exists(os.path.join(onceDir, _markerName(item))):
            continue  # this item already fired
        return item
    return None


def _markerName(item: str) -> str:
    return item.replace(":", "-") + ".fired"


def armed(point: str, batchId: int | None = None) -> bool:
    """True if ``TWOPHASE_CRASH_AT`` names this point (and batch): code may line up the window."""
    return _armedItem(point, batchId) is not None


def firedItems(onceDir: str) -> list[str]:
    """The items of ``TWOPHASE_CRASH_AT`` that fired under ``TWOPHASE_CRASH_ONCE_DIR=onceDir``,
    each as ``<point>:<batch it fired in>``."""
    if not os.path.isdir(onceDir):
        return []
    fired = []
    for name in sorted(os.listdir(onceDir)):
        if name.endswith(".fired"):
            with open(os.path.join(onceDir, name)) as f:
                fired.append(f.read().strip())
    return fired


def crashPoint(point: str, batchId: int | None = None) -> None:
    """Kill the process group with SIGKILL if ``TWOPHASE_CRASH_AT`` names this point.

    ``TWOPHASE_CRASH_ONCE_FILE``, when set, names a marker file: the crash happens only if the
    file does not exist yet (it is created just before), so a restarted query runs through.
    """
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; known points: {', '.join(POINTS)}")
    item = _armedItem(point, batchId)
    if item is None:
        return
    action = os.environ.get(ACTION_ENV, "kill")
    if action.startswith("pause:"):
        _pause(point, batchId, action[len("pause:") :])
        return
    onceDir = os.environ.get(ONCE_DIR_ENV)
    marker = os.path.join(onceDir, _markerName(item)) if onceDir else os.environ.get(ONCE_ENV)
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, f"{point}:{batchId}\n".encode())
        os.fsync(fd)
        os.close(fd)
    log.warning("fault injection: SIGKILL at %s (batch %s)", point, batchId)
    if point.startswith("driver."):
        os.killpg(int(os.environ.get(GROUP_ENV) or os.getpgid(0)), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _pause(point: str, batchId: int | None, directory: str) -> None:
    """Stand still at ``point``: say so in ``<directory>/paused-<pid>``, then wait for
    ``<directory>/release``."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"paused-{os.getpid()}"), "w") as f:
        f.write(f"{point}:{batchId}\n")
    log.warning("fault injection: paused at %s (batch %s)", point, batchId)
    release = os.path.join(directory, "release")
    deadline = time.monotonic() + PAUSE_LIMIT_SECONDS
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.1)
    log.warning("fault injection: going on from %s (batch %s)", point, batchId)
