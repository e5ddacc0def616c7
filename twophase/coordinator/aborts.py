"""Aborts and sweeps: discarding handles no decision names, and what a batch left unreported.

Both are best effort and never touch a decided transaction: a handle is aborted only when the
decision does not name it (Spark may hand the decided messages to ``commit`` twice, or to
``abort`` after ``commit``), and a sweep keeps every handle it is given. What fails here is not
in any decision, so it is logged, not raised: the next ``recover`` aborts it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from twophase.coordinator.execution import CommitExecutor, CommitJob
from twophase.coordinator.records import LoggedHandle
from twophase.coordinator.settings import CoordinatorSettings
from twophase.protocol import Committer, Handle, RecoveryScope, TaskResult, checkedAborted
from twophase.redaction import getLogger

log = getLogger(__name__)


@dataclass(frozen=True)
class Aborts:
    """Aborts the undecided handles of a batch and sweeps its other prepared transactions."""

    committer: Committer
    sinkId: str
    settings: CoordinatorSettings
    executor: CommitExecutor
    describe: Callable[[Handle], str]

    def abortHandles(
        self, batchId: int, results: Sequence[TaskResult], *, decided: frozenset[str]
    ) -> tuple[int, int]:
        """Abort the handles of ``results`` that are not in ``decided``; log failures.

        Returns (handles aborted, retries). Never aborts a decided handle: Spark may hand the
        decided messages to ``commit`` twice or to ``abort`` after ``commit``.
        """
        seen = set(decided)
        jobs = []
        for result in results:
            if result.handle is None:
                continue
            entry = LoggedHandle.fromResult(result)
            if entry.key in seen:
                continue
            seen.add(entry.key)
            jobs.append(CommitJob(batchId, entry, self.committer.abort))
        outcomes = self.executor.runAll(
            jobs,
            deadline=time.monotonic() + self.settings.commitTimeoutSeconds,
        )
        for failed in (o for o in outcomes if o.error is not None):
            log.warning(
                "twophase sink %s: batch %d: could not abort %s (%s: %s); the next recovery "
                "aborts it",
                self.sinkId,
                batchId,
                self.describe(failed.job.entry.handle),
                type(failed.error).__name__,
                failed.error,
            )
        retries = sum(o.attempts - 1 for o in outcomes)
        return sum(1 for o in outcomes if o.error is None), retries

    def sweepBatch(self, batchId: int, keep: tuple[Handle, ...]) -> int:
        """Abort prepared transactions of batch N that ``keep`` does not name; best effort."""
        scope = RecoveryScope(self.sinkId, keep=keep, batchId=batchId)
        try:
            aborted = self.executor.retrying(
                lambda: checkedAborted(self.committer, self.committer.recoverAndAbort(scope)),
                what=f"recoverAndAbort of batch {batchId}",
                deadline=time.monotonic() + self.settings.commitTimeoutSeconds,
            )
        except Exception as exc:
            log.warning(
                "twophase sink %s: batch %d: sweeping other prepared transactions failed "
                "(%s: %s); the next recovery aborts them",
                self.sinkId,
                batchId,
                type(exc).__name__,
                exc,
            )
            return 0
        for handle in aborted:
            log.info(
                "twophase sink %s: batch %d: aborted transaction %s outside the decision",
                self.sinkId,
                batchId,
                self.describe(handle),
            )
        return len(aborted)
