"""Recovery: every outstanding decision rolled forward, then the sweep of what none keeps.

Runs before any task of a batch begins (the roll-forward alone also before ``claim`` resets a
log of another query): the handles of decided-but-unfinished batches are committed with
``recoverAndCommit`` and those batches marked committed, then the committer's
``recoverAndAbort`` aborts every prepared transaction of the sink that no outstanding decision
keeps. A decided transaction the participant lost and the sink fingerprints is recorded for the
replay to write again; the batch stays decided. A recovery that did something, before a known
batch, leaves its figures in that batch's ``recovery(N)`` record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from twophase.coordinator.commits import BatchCommits
from twophase.coordinator.execution import CommitExecutor
from twophase.coordinator.figures import CommitFigures, CommittedBy, recoveryEntry
from twophase.coordinator.log import DecisionLog
from twophase.coordinator.lost import LostPartitions
from twophase.coordinator.records import BatchState
from twophase.coordinator.reports import RecoveryReport
from twophase.coordinator.settings import CoordinatorSettings
from twophase.faults import crashPoint
from twophase.protocol import Committer, Handle, RecoveryScope, checkedAborted
from twophase.redaction import getLogger

log = getLogger(__name__)


@dataclass(frozen=True)
class Recovery:
    """Finishes a sink's decided batches and aborts its lingering transactions; idempotent."""

    committer: Committer
    log: DecisionLog
    sinkId: str
    settings: CoordinatorSettings
    executor: CommitExecutor
    lost: LostPartitions
    commits: BatchCommits
    describe: Callable[[Handle], str]
    check: Callable[[str, int | None], None]
    """Raises unless this driver's run is the newest run given (``Holding.check``)."""

    def recover(self, batchId: int | None) -> RecoveryReport:
        """Roll forward, then abort the sink's prepared transactions no decision keeps.

        Only the driver that holds the log sweeps: what no decision keeps may be the newer
        driver's batch in flight. It checks just before, from the same listing when there was
        nothing to roll forward."""
        started = time.monotonic()
        outstanding, newest = self.log.pending()
        finished, committedHandles, keep, awaiting = self.rollForward(outstanding)
        crashPoint("driver.duringRecovery", batchId)
        if outstanding:
            newest = self.log.runs.newest()
        self.check("aborts the transactions no decision keeps", newest)
        aborted = self.executor.retrying(
            lambda: checkedAborted(
                self.committer,
                self.committer.recoverAndAbort(RecoveryScope(self.sinkId, keep=keep)),
            ),
            what=f"recoverAndAbort of sink {self.sinkId}",
            deadline=time.monotonic() + self.settings.commitTimeoutSeconds,
        )
        for handle in aborted:
            log.info(
                "twophase sink %s: aborted lingering transaction %s",
                self.sinkId,
                self.describe(handle),
            )
        report = RecoveryReport(
            self.sinkId,
            tuple(finished),
            committedHandles,
            len(aborted),
            time.monotonic() - started,
            awaiting,
        )
        for awaitingBatch, partitions in awaiting.items():
            log.warning(
                "twophase sink %s: batch %d is decided, but the transactions of partitions %s "
                "were aborted by the system; the replay of the batch writes them again",
                self.sinkId,
                awaitingBatch,
                list(partitions),
            )
        if not report.idle:
            log.info(
                "twophase sink %s: recovery finished batches %s (%d handles committed), "
                "aborted %d lingering transactions in %.0f ms",
                self.sinkId,
                list(report.batchesFinished),
                report.handlesCommitted,
                report.transactionsAborted,
                report.seconds * 1000,
            )
            if batchId is not None:
                self.record(batchId, report)
        return report

    def record(self, batchId: int, report: RecoveryReport) -> None:
        """Keep what the recovery did in ``recovery(N)`` of the batch about to run; best
        effort: these are figures for operators, and the recovery itself is done."""
        entry = recoveryEntry(
            datetime.now(UTC),
            report.batchesFinished,
            report.handlesCommitted,
            report.transactionsAborted,
            report.awaitingRewrite,
            report.seconds,
        )
        try:
            self.log.recordRecovery(batchId, entry)
        except Exception as exc:
            log.warning(
                "twophase sink %s: could not record the recovery before batch %d (%s: %s)",
                self.sinkId,
                batchId,
                type(exc).__name__,
                exc,
            )

    def rollForwardOutstanding(
        self,
    ) -> tuple[list[int], int, tuple[Handle, ...], dict[int, tuple[int, ...]]]:
        """``rollForward`` of the decided batches the log holds unfinished now."""
        return self.rollForward(self.log.outstanding())

    def rollForward(
        self, outstanding: list[BatchState]
    ) -> tuple[list[int], int, tuple[Handle, ...], dict[int, tuple[int, ...]]]:
        """Commit every live handle of the decided-but-unfinished batches ``outstanding``;
        mark those committed.

        Returns the batches finished, the number of handles committed, every handle of the
        outstanding decisions (the ``keep`` of the sweep that follows), and the batches left
        with partitions awaiting their rewrite (lost transactions the sink fingerprints).
        """
        if not outstanding:
            return [], 0, (), {}
        keep = tuple(
            entry.handle for state in outstanding for entry in (*state.handles, *state.replacements)
        )
        log.info(
            "twophase sink %s: rolling forward decided batches %s",
            self.sinkId,
            [s.batchId for s in outstanding],
        )
        started = time.monotonic()
        outcomes = self.executor.runAll(
            [
                job
                for state in outstanding
                for job in self.commits.jobs(state, self.committer.recoverAndCommit)
            ],
            deadline=started + self.settings.commitTimeoutSeconds,
        )
        seconds = time.monotonic() - started
        awaiting: dict[int, tuple[int, ...]] = {}
        for state in outstanding:
            lost = self.lost.rewritable([o for o in outcomes if o.job.batchId == state.batchId])
            if lost:
                state = self.lost.record(state, lost)
            if state.awaitingRewrite:
                awaiting[state.batchId] = state.awaitingRewrite
        failedBatches = {
            o.job.batchId for o in outcomes if o.error is not None and not self.lost.isRewritable(o)
        }
        finished = [
            s for s in outstanding if s.batchId not in failedBatches and s.batchId not in awaiting
        ]
        for state in sorted(finished, key=lambda s: s.batchId):
            self.commits.complete(state, deadline=started + self.settings.commitTimeoutSeconds)
            retries = sum(o.attempts - 1 for o in outcomes if o.job.batchId == state.batchId)
            figures = CommitFigures(CommittedBy.RECOVERY, len(state.liveHandles), retries)
            self.log.markCommitted(state.batchId, time.monotonic() - started, figures)
            log.info(
                "twophase sink %s: committed batch %d: %d handles, %d rows in %.0f ms (recovered)",
                self.sinkId,
                state.batchId,
                len(state.liveHandles),
                sum(e.rows for e in state.liveHandles),
                seconds * 1000,
            )
        for batchId in sorted(failedBatches):
            self.commits.raiseFailures(
                batchId,
                [o for o in outcomes if o.job.batchId == batchId and not self.lost.isRewritable(o)],
            )
        committed = sum(1 for o in outcomes if o.error is None)
        return [s.batchId for s in finished], committed, keep, awaiting
