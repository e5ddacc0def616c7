"""Commits and retries: run commit or abort calls in parallel, retrying the transient ones.

Only ``TransientCommitError`` is retried, with exponential backoff and full jitter, bounded by
``CoordinatorSettings.commitRetries`` and the batch's deadline; any other error is returned to
the coordinator at once, because retrying a permanent error hides it.

The threads are the process's, kept between calls (``_keptThreads``): a driver or a commit
worker that PySpark reuses commits every batch without starting threads again. A thread is
named ``twophase-commit`` only while it runs a call's jobs, ``twophase-idle`` otherwise.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from twophase.coordinator.records import LoggedHandle
from twophase.coordinator.settings import CoordinatorSettings
from twophase.protocol import CommitStatus, Handle, TransientCommitError
from twophase.protocol.calls import servingBatch
from twophase.redaction import getLogger

log = getLogger(__name__)

_T = TypeVar("_T")

BUSY_NAME = "twophase-commit"
"""The name of a thread while it runs commit or abort jobs."""
IDLE_PREFIX = "twophase-idle"
KEPT_THREADS = 256
"""At most this many kept threads at once; a call uses ``maxParallelCommits`` of them."""
_kept: tuple[int, ThreadPoolExecutor] | None = None
_keptLock = threading.Lock()


def _keptThreads() -> ThreadPoolExecutor:
    """This process's commit threads (made anew in a forked child: threads do not survive a
    fork, and PySpark forks its Python workers)."""
    global _kept
    with _keptLock:
        if _kept is None or _kept[0] != os.getpid():
            _kept = (os.getpid(), ThreadPoolExecutor(KEPT_THREADS, thread_name_prefix=IDLE_PREFIX))
        return _kept[1]


@dataclass(frozen=True)
class CommitJob:
    batchId: int
    entry: LoggedHandle
    action: Callable[[Handle], Any]


@dataclass(frozen=True)
class JobOutcome:
    """How one job ended: its error, or the ``CommitStatus`` a settled commit returned."""

    job: CommitJob
    attempts: int
    error: Exception | None
    status: CommitStatus | None = None


@dataclass(frozen=True)
class Attempted(Generic[_T]):
    """A call made with retries: its value or its last error, and how many calls it took
    (tenacity's own count)."""

    attempts: int
    value: _T | None = None
    error: Exception | None = None


class _stopAtDeadline(stop_base):
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: RetryCallState) -> bool:
        return time.monotonic() >= self.deadline


class CommitExecutor:
    """Runs one sink's commit and abort calls with the coordinator's retry bounds."""

    def __init__(
        self, sinkId: str, settings: CoordinatorSettings, describe: Callable[[Handle], str]
    ) -> None:
        self.sinkId = sinkId
        self.settings = settings
        self._describe = describe

    def runAll(self, jobs: Sequence[CommitJob], *, deadline: float) -> list[JobOutcome]:
        """Run ``jobs``, at most ``maxParallelCommits`` at once, each with retries; never raises
        for a job. Outcomes come in the order the jobs ended."""
        if not jobs:
            return []
        pending = collections.deque(jobs)
        outcomes: list[JobOutcome] = []

        def drain() -> None:
            thread = threading.current_thread()
            idle, thread.name = thread.name, BUSY_NAME
            try:
                while True:
                    try:
                        job = pending.popleft()
                    except IndexError:
                        return
                    outcomes.append(self.runOne(job, deadline))
            finally:
                thread.name = idle

        workers = min(self.settings.maxParallelCommits, len(jobs))
        try:
            for running in [_keptThreads().submit(drain) for _ in range(workers)]:
                running.result()
        finally:
            pending.clear()  # interrupted: the threads start no further job of this call
        return outcomes

    def runOne(self, job: CommitJob, deadline: float) -> JobOutcome:
        """``job`` with retries; its calls say which batch they serve (``servingBatch``)."""
        with servingBatch(job.batchId):
            done = self.attempt(
                lambda: job.action(job.entry.handle),
                what=f"batch {job.batchId}: {self._describe(job.entry.handle)}",
                deadline=deadline,
            )
        status = done.value if isinstance(done.value, CommitStatus) else None
        return JobOutcome(job, done.attempts, done.error, status)

    def retrying(self, call: Callable[[], _T], *, what: str, deadline: float) -> _T:
        """Call with retries on ``TransientCommitError`` only, bounded by attempts and time;
        raises the last error when retries are exhausted."""
        return self._retrying(what, deadline)(call)

    def attempt(self, call: Callable[[], _T], *, what: str, deadline: float) -> Attempted[_T]:
        """``retrying``, with the number of calls it took and the last error returned instead
        of raised."""
        retrying = self._retrying(what, deadline)
        try:
            value = retrying(call)
        except Exception as exc:
            return Attempted(int(retrying.statistics.get("attempt_number", 1)), error=exc)
        return Attempted(int(retrying.statistics.get("attempt_number", 1)), value=value)

    def _retrying(self, what: str, deadline: float) -> Retrying:
        backoff = wait_random_exponential(
            multiplier=self.settings.retryInitialSeconds, max=self.settings.retryMaxSeconds
        )

        def wait(state: RetryCallState) -> float:
            return min(backoff(state), max(0.0, deadline - time.monotonic()))

        def beforeSleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            log.warning(
                "twophase sink %s: %s: transient failure (attempt %d): %s; retrying",
                self.sinkId,
                what,
                state.attempt_number,
                error,
            )

        return Retrying(
            retry=retry_if_exception_type(TransientCommitError),
            stop=stop_after_attempt(self.settings.commitRetries + 1) | _stopAtDeadline(deadline),
            wait=wait,
            before_sleep=beforeSleep,
            reraise=True,
        )
