"""Commits and retries: run commit or abort calls in parallel, retrying the transient ones.

Only ``TransientCommitError`` is retried, with exponential backoff and full jitter, bounded by
``CoordinatorSettings.commitRetries`` and the batch's deadline; any other error is returned to
the coordinator at once, because retrying a permanent error hides it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
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
        """Run ``jobs`` on a bounded thread pool, each with retries; never raises for a job."""
        if not jobs:
            return []
        workers = min(self.settings.maxParallelCommits, len(jobs))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="twophase-commit")
        try:
            futures = [pool.submit(self.runOne, job, deadline) for job in jobs]
            return [future.result() for future in as_completed(futures)]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

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
