"""Committing a decided batch: its handles committed, ``committed(N)`` written, then the cleanup.

After ``decided(N)`` a batch only goes forward. ``finish`` commits every live handle of the
decision in parallel with bounded retries (a lost partition's replacement through
``Committer.commitReplacement``), writes ``committed(N)``, aborts the other handles of the call
and sweeps the batch's other prepared transactions, then prunes the log. A handle that stays
uncommitted raises (``RewritePendingError`` when the replay can write its partition again), and
the decision stays in the log for the next ``recover``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from twophase.coordinator.aborts import Aborts
from twophase.coordinator.errors import CommitFailedError, RewritePendingError
from twophase.coordinator.execution import CommitExecutor, CommitJob, JobOutcome
from twophase.coordinator.figures import CommitFigures, CommittedBy
from twophase.coordinator.log import DecisionLog
from twophase.coordinator.lost import LostPartitions
from twophase.coordinator.records import BatchState
from twophase.coordinator.reports import CommitOutcome, CommitReport
from twophase.coordinator.settings import CoordinatorSettings
from twophase.faults import crashPoint
from twophase.protocol import (
    CommitStatus,
    Committer,
    Handle,
    TaskResult,
    TransactionLostError,
)
from twophase.protocol.outcomes import CommitAnswer, settleCommit
from twophase.redaction import getLogger

log = getLogger(__name__)


@dataclass(frozen=True)
class BatchCommits:
    """Commits the decided handles of a batch and marks it committed; any process, any time."""

    committer: Committer
    log: DecisionLog
    sinkId: str
    settings: CoordinatorSettings
    executor: CommitExecutor
    lost: LostPartitions
    aborts: Aborts
    describe: Callable[[Handle], str]

    def finish(
        self,
        state: BatchState,
        results: Sequence[TaskResult],
        started: float,
        outcome: CommitOutcome,
        decisionSeconds: float | None = None,
        times: Mapping[str, float] | None = None,
    ) -> CommitReport:
        """Commit the decided handles of ``state``, mark it committed, clean up around it.

        ``committed(N)`` carries the commit's figures (``decisionSeconds``: the time this call
        took to write ``decided(N)``; ``times``: the batch's phases so far, to which the moment
        the last handle was committed is added); when the cleanup aborted other transactions
        of N, the mark is written once more with their count.
        """
        batchId = state.batchId
        action = (
            self.committer.commit
            if outcome is CommitOutcome.COMMITTED
            else self.committer.recoverAndCommit
        )
        commitStart = time.monotonic()
        live = state.liveHandles
        outcomes = self.executor.runAll(
            self.jobs(state, action),
            deadline=commitStart + self.settings.commitTimeoutSeconds,
        )
        lost = self.lost.rewritable(outcomes)
        if lost:
            self.lost.record(state, lost)
            rewrites = {r.key for r in state.replacements}
            raise RewritePendingError(
                self.sinkId,
                batchId,
                sorted(lost),
                self.lost.details(lost.values()),
                again=sorted(p for p, o in lost.items() if o.job.entry.key in rewrites),
            )
        self.raiseFailures(batchId, outcomes)
        self._logAlreadyCommitted(batchId, outcomes)
        crashPoint("driver.beforeCompleteBatch", batchId)
        self.complete(state, deadline=commitStart + self.settings.commitTimeoutSeconds)
        commitSeconds = time.monotonic() - commitStart
        committedAt = time.time()
        crashPoint("driver.afterCommits", batchId)
        figures = CommitFigures(
            CommittedBy.COMMIT if outcome is CommitOutcome.COMMITTED else CommittedBy.ROLL_FORWARD,
            len(live),
            sum(o.attempts - 1 for o in outcomes),
            decisionSeconds,
            times={**times, "committed": committedAt} if times is not None else None,
        )
        self.log.markCommitted(batchId, commitSeconds, figures)
        crashPoint("driver.afterCommitted", batchId)
        duplicates, abortRetries = self.aborts.abortHandles(
            batchId, results, decided=state.handleKeys
        )
        stragglers = self.aborts.sweepBatch(
            batchId, keep=tuple(e.handle for e in (*state.handles, *state.replacements))
        )
        if duplicates or stragglers or abortRetries:
            self._countAborts(
                batchId, commitSeconds, figures, duplicates + stragglers, abortRetries
            )
        self._prune()
        report = CommitReport(
            sinkId=self.sinkId,
            batchId=batchId,
            outcome=outcome,
            handles=len(live),
            rows=sum(e.rows for e in live),
            duplicatesAborted=duplicates,
            stragglersAborted=stragglers,
            retries=sum(o.attempts - 1 for o in outcomes) + abortRetries,
            seconds=time.monotonic() - started,
            commitSeconds=commitSeconds,
        )
        log.info(
            "twophase sink %s: committed batch %d: %d handles, %d rows in %.0f ms",
            self.sinkId,
            batchId,
            report.handles,
            report.rows,
            report.seconds * 1000,
        )
        return report

    def jobs(self, state: BatchState, action: Callable[[Handle], CommitAnswer]) -> list[CommitJob]:
        """One job per live handle: ``action``, or ``commitReplacement`` for a replay's handle;
        each settles what the commit answered (``settleCommit``): a status to go on with, or the
        error whose path the coordinator takes (retry, lost, failed)."""
        replaced = {r.key for r in state.replacements}
        jobs = []
        for entry in state.liveHandles:
            original = state.loggedHandleOf(entry.partitionId)
            if entry.key in replaced and original is not None:
                replace = functools.partial(self.committer.commitReplacement, original.handle)
                jobs.append(CommitJob(state.batchId, entry, self._settled(replace)))
            else:
                jobs.append(CommitJob(state.batchId, entry, self._settled(action)))
        return jobs

    def _settled(self, call: Callable[[Handle], CommitAnswer]) -> Callable[[Handle], CommitStatus]:
        def settled(handle: Handle) -> CommitStatus:
            return settleCommit(self.committer, call(handle), f"commit of {self.describe(handle)}")

        return settled

    def _logAlreadyCommitted(self, batchId: int, outcomes: Sequence[JobOutcome]) -> None:
        before = [o for o in outcomes if o.status is CommitStatus.ALREADY_COMMITTED]
        if before:
            log.info(
                "twophase sink %s: batch %d: %d of its transaction(s) were committed before "
                "(the sink said already committed): %s",
                self.sinkId,
                batchId,
                len(before),
                ", ".join(self.describe(o.job.entry.handle) for o in before),
            )

    def complete(self, state: BatchState, *, deadline: float) -> None:
        """``Committer.completeBatch`` for a batch whose handles are all committed, retried as a
        commit is; a failure leaves the decision in the log for the next ``recover``."""
        handles = [entry.handle for entry in state.liveHandles]
        done = self.executor.attempt(
            lambda: self.committer.completeBatch(self.sinkId, state.batchId, handles),
            what=f"batch {state.batchId}: completing the batch",
            deadline=deadline,
        )
        if isinstance(done.error, TransactionLostError):
            raise done.error
        if done.error is not None:
            error = CommitFailedError(
                self.sinkId, state.batchId, [("the batch's completion", done.attempts, done.error)]
            )
            log.error("%s", error)
            raise error from done.error

    def raiseFailures(self, batchId: int, outcomes: Sequence[JobOutcome]) -> None:
        """Raise for the failed jobs of batch N: a lost transaction as it is, any other failure
        as ``CommitFailedError``; nothing when every job succeeded."""
        failed = [o for o in outcomes if o.error is not None]
        if not failed:
            return
        for outcome in failed:
            if isinstance(outcome.error, TransactionLostError):
                lost = outcome.error
                lost.add_note(
                    f"twophase sink {self.sinkId}: batch {batchId} is decided, but its "
                    f"transaction {self.describe(outcome.job.entry.handle)} is lost: "
                    "exactly-once is broken for it; the decision stays in the log"
                )
                log.error(
                    "twophase sink %s: batch %d: transaction lost: %s: %s",
                    self.sinkId,
                    batchId,
                    self.describe(outcome.job.entry.handle),
                    lost,
                )
                raise lost
        error = CommitFailedError(
            self.sinkId,
            batchId,
            [(self.describe(o.job.entry.handle), o.attempts, o.error) for o in failed if o.error],
        )
        log.error("%s", error)
        raise error from failed[0].error

    def _countAborts(
        self, batchId: int, commitSeconds: float, figures: CommitFigures, aborted: int, retries: int
    ) -> None:
        """Write ``committed(N)`` again with the cleanup's aborts; best effort (figures only)."""
        counted = dataclasses.replace(figures, aborted=aborted, retries=figures.retries + retries)
        try:
            self.log.markCommitted(batchId, commitSeconds, counted)
        except Exception as exc:
            log.warning(
                "twophase sink %s: batch %d: could not record the aborts after the commit (%s: %s)",
                self.sinkId,
                batchId,
                type(exc).__name__,
                exc,
            )

    def _prune(self) -> None:
        try:
            self.log.prune(self.settings.retentionBatches)
        except Exception as exc:
            log.warning(
                "twophase sink %s: pruning the decision log failed (%s: %s)",
                self.sinkId,
                type(exc).__name__,
                exc,
            )
