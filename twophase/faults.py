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

Most points are one ``crashPoint`` call between two protocol steps. ``driver.betweenCommits``
falls inside the coordinator's parallel commits of a batch, so it is injected from outside: the
Spark binding hands the coordinator the sink's committer through ``injectFaults``, which wraps it
in ``CrashingBetweenCommits`` when ``TWOPHASE_CRASH_AT`` names that point.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from twophase.protocol import Committer, Handle, Prepared, RecoveryScope, dumpsHandle, listsPrepared
from twophase.protocol.calls import batchOfCall
from twophase.protocol.outcomes import CommitAnswer, settleCommit
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

BETWEEN_COMMITS = "driver.betweenCommits"


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


def named(point: str) -> bool:
    """True if ``TWOPHASE_CRASH_AT`` names ``point`` at all, for any batch, fired or not."""
    spec = os.environ.get(ENV, "")
    return any(item.strip().partition(":")[0] == point for item in spec.split(","))


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
    kill(point)


def kill(point: str) -> None:
    """The kill of a point that fires: SIGKILL to the query's process group for a ``driver.*``
    point, to this process for a ``task.*`` one. Unit tests put a simulated crash in its place."""
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


def injectFaults(committer: Committer) -> Committer:
    """The committer a coordinator drives: ``committer`` in ``CrashingBetweenCommits`` when
    ``TWOPHASE_CRASH_AT`` names ``driver.betweenCommits``, else ``committer`` itself, so a query
    without fault injection pays one environment lookup."""
    if not named(BETWEEN_COMMITS) or isinstance(committer, CrashingBetweenCommits):
        return committer
    return withCrashBetweenCommits(committer)


def withCrashBetweenCommits(committer: Committer) -> CrashingBetweenCommits:
    """``committer`` in a ``CrashingBetweenCommits`` that speaks the same form of the sweep
    (``listsPrepared`` says the same of both)."""
    return _wrapperClass(type(committer), listsPrepared(committer))(committer)


class CrashingBetweenCommits(Committer):
    """A sink's committer that fires ``driver.betweenCommits`` between two commits of a batch.

    While the point is armed for a batch, the commits of that batch (``commit``,
    ``recoverAndCommit``, ``commitReplacement``) run one at a time; once one of its handles
    committed, the commit of another of its handles fires the point first, so the crash leaves
    the batch partly committed. A batch of one handle, or a retry of the handle that committed,
    never fires. Every other call, attribute and batch goes to the sink's committer as it is.

    A handle need not name its batch: the batch of a commit is the one the coordinator says the
    call serves (``twophase.protocol.calls``); a commit made outside a batch goes on as it is.
    """

    def __init__(self, committer: Committer) -> None:
        self.wrapped = committer
        self._lock = threading.Lock()
        self._committed: dict[int, set[str]] = {}
        self._fired: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":  # not set yet (a copy being built): no committer to ask
            raise AttributeError(name)
        return getattr(self.wrapped, name)

    def commit(self, handle: Handle) -> CommitAnswer:
        return self._committing(handle, self.wrapped.commit)

    def recoverAndCommit(self, handle: Handle) -> CommitAnswer:
        return self._committing(handle, self.wrapped.recoverAndCommit)

    def commitReplacement(self, original: Handle, replacement: Handle) -> CommitAnswer:
        return self._committing(
            replacement, functools.partial(self.wrapped.commitReplacement, original)
        )

    def abort(self, handle: Handle) -> None:
        self.wrapped.abort(handle)

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle] | None:
        return self.wrapped.recoverAndAbort(scope)

    def preparedNames(self, handle: Handle) -> Iterable[str]:
        return self.wrapped.preparedNames(handle)

    def abortPrepared(self, item: Prepared) -> bool | None:
        return self.wrapped.abortPrepared(item)

    def completeBatch(self, sinkId: str, batchId: int, handles: Sequence[Handle]) -> None:
        self.wrapped.completeBatch(sinkId, batchId, handles)

    def fingerprint(self, handle: Handle) -> str | None:
        return self.wrapped.fingerprint(handle)

    def describe(self, handle: Handle) -> str:
        return self.wrapped.describe(handle)

    def _committing(self, handle: Handle, call: Callable[[Handle], CommitAnswer]) -> CommitAnswer:
        """``call(handle)``; in a batch the point is armed for, one at a time, after firing the
        point when another handle of the batch committed before."""
        batchId = batchOfCall()
        if batchId is None or not armed(BETWEEN_COMMITS, batchId):
            return call(handle)
        key = dumpsHandle(handle)
        with self._lock:
            committed = self._committed.setdefault(batchId, set())
            if committed and key not in committed and batchId not in self._fired:
                self._fired.add(batchId)
                crashPoint(BETWEEN_COMMITS, batchId)
            answer = call(handle)
            if _settled(self.wrapped, answer):
                committed.add(key)
            return answer


def _settled(committer: Committer, answer: CommitAnswer) -> bool:
    """Whether a commit's answer says committed (now or before), as the coordinator reads it."""
    try:
        settleCommit(committer, answer)
    except Exception:
        return False
    return True


@functools.cache
def _wrapperClass(cls: type[Committer], lists: bool) -> type[CrashingBetweenCommits]:
    """The wrapper's class for committers of ``cls``: named after it, with its
    ``abortConcurrency``, and with ``listPrepared`` only when ``cls`` lists what it prepared."""

    def listPrepared(self: CrashingBetweenCommits, scope: RecoveryScope) -> Iterable[Prepared]:
        return self.wrapped.listPrepared(scope)

    namespace: dict[str, Any] = {
        "abortConcurrency": property(lambda self: self.wrapped.abortConcurrency),
        "__qualname__": f"CrashingBetweenCommits[{cls.__qualname__}]",
    }
    if lists:
        namespace["listPrepared"] = listPrepared
    name = f"CrashingBetweenCommits[{cls.__name__}]"
    return cast(type[CrashingBetweenCommits], type(name, (CrashingBetweenCommits,), namespace))
