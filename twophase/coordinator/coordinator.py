"""The coordinator's state machine: decides, commits and recovers the batches of one sink.

It knows the protocol (``twophase.protocol``) and its decision log, never Spark and never a
particular external system. Every method is safe to call from a fresh process: the log and
the task results carry all the state (docs/protocol.md sections 4 and 5).

The commit point of batch N is ``decided(N)`` in the log. Before it, everything of N may be
thrown away; after it, N is only ever driven forward:

- ``recover()`` runs before any task of a batch: commits the handles of decided-but-unfinished
  batches, then aborts every prepared transaction of the sink that no decision keeps;
- ``commitBatch(N, results)`` decides N (or finds it decided), commits every decided handle,
  marks N committed, aborts the other transactions of N (failed or speculative attempts, a
  replay's duplicates);
- ``abortBatch(N, results)`` aborts an undecided N, and rolls a decided N forward instead.

A decided transaction that its participant aborted by itself (Kafka's transaction timeout) is
not the end of the batch when the sink fingerprints its handles (``Committer.fingerprint``):
the partition is recorded as lost in ``rewrite(N)``, N stays decided, and Spark's replay of N
writes that partition again; ``commitBatch`` takes the replay's handle for it only when its
fingerprint matches the decided one.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from twophase.coordinator.errors import (
    CommitFailedError,
    CoordinatorError,
    LogOwnershipError,
    RewritePendingError,
)
from twophase.coordinator.execution import CommitExecutor, CommitJob, JobOutcome
from twophase.coordinator.log import DecisionLog
from twophase.coordinator.lost import LostPartitions
from twophase.coordinator.records import BatchState, BatchStatus, LoggedHandle
from twophase.coordinator.reports import CommitOutcome, CommitReport, RecoveryReport
from twophase.coordinator.settings import CoordinatorSettings
from twophase.faults import crashPoint
from twophase.protocol import (
    Committer,
    Handle,
    RecoveryScope,
    TaskResult,
    TransactionLostError,
    checkedAborted,
    dumpsHandle,
)
from twophase.protocol.checks import checkedDescription
from twophase.redaction import getLogger, redact

log = getLogger(__name__)


class Coordinator:
    """Drives batches of one sink through the two-phase commit; a decided batch only goes forward.

    Parameters
    ----------
    committer:
        The sink's driver-side operations (``commit``, ``abort``, ``recoverAndCommit``,
        ``recoverAndAbort``, ``describe``); all idempotent.
    log:
        The sink's decision log.
    sinkId:
        The sink's id; task results of another sink are refused.
    settings:
        Retry bounds, time budget and log retention (``CoordinatorSettings``' defaults when
        omitted).

    No state is kept between calls beyond the settings: any process may make any call.
    """

    def __init__(
        self,
        committer: Committer,
        log: DecisionLog,
        sinkId: str,
        settings: CoordinatorSettings | None = None,
    ) -> None:
        self.committer = committer
        self.log = log
        self.sinkId = sinkId
        self.settings = settings or CoordinatorSettings()
        self.executor = CommitExecutor(sinkId, self.settings, self._describe)
        self.lost = LostPartitions(committer, log, sinkId, self.settings, self._describe)

    # ------------------------------------------------------------------ public API

    def claim(self, queryId: str, *, reset: bool = False) -> None:
        """Make the log this query's; refuses a log of another query unless ``reset``.

        ``reset`` (option ``twophase.resetLog``) first commits the outstanding decisions of
        the old query (a decision is never dropped), then clears the log; it does nothing to a
        log this query already owns. Idempotent.
        """
        try:
            self.log.claim(self.sinkId, queryId)
            return
        except LogOwnershipError:
            if not reset:
                raise
        self._rollForwardOutstanding()
        self.log.claim(self.sinkId, queryId, reset=True)

    def recover(self, batchId: int | None = None) -> RecoveryReport:
        """Finish every decided batch, then abort prepared transactions no decision keeps.

        Run before any task of a batch begins (``batchId``, when known, is the batch about to
        run; it only targets fault injection and logs). Cheap when there is nothing to do: one
        log listing plus the committer's own ``recoverAndAbort`` sweep. Raises if a decided
        handle cannot be committed (the batch must not start: its tasks could collide with
        the unfinished transaction), ``TransactionLostError`` included, except for a lost
        transaction the sink fingerprints: that partition is recorded for the replay to write
        again (``RecoveryReport.awaitingRewrite``) and the batch stays decided.
        """
        started = time.monotonic()
        finished, committedHandles, keep, awaiting = self._rollForwardOutstanding()
        crashPoint("driver.duringRecovery", batchId)
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
                self._describe(handle),
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
        return report

    def commitBatch(self, batchId: int, results: Sequence[TaskResult]) -> CommitReport:
        """Make batch N visible exactly once; safe to call again, for a replay, from any process.

        Not decided yet: validate the results, write ``decided(N)`` (the commit point), commit
        every handle in parallel with bounded retries, write ``committed(N)``, abort the other
        prepared transactions of N. Decided but unfinished: commit the logged handles (not the
        new ones), abort the new ones. Committed: abort this replay's handles, commit nothing.

        Raises ``CommitFailedError`` when handles stay uncommitted after retries (the decision
        stays: the next ``recover`` rolls forward), ``TransactionLostError`` when the
        committer lost a decided transaction, ``LogOwnershipError`` when the log belongs to
        another query, ``ValueError`` for results of another sink or batch.
        """
        started = time.monotonic()
        queryId = self._validate(batchId, results)
        state = self.log.state(batchId)
        if state is not None and state.status is BatchStatus.COMMITTED:
            return self._skipCommitted(state, results, started)
        if state is not None and state.status is BatchStatus.DECIDED:
            log.info(
                "twophase sink %s: batch %d is already decided; committing its logged handles",
                self.sinkId,
                batchId,
            )
            if state.awaitingRewrite:
                state = self.lost.take(state, results, self._abortHandles)
            return self._finish(state, results, started, CommitOutcome.ROLLED_FORWARD)
        skipped = [r.partitionId for r in results if r.handle is None]
        if skipped:
            raise CoordinatorError(
                f"twophase sink {self.sinkId}: tasks of batch {batchId} (partitions "
                f"{skipped}) wrote nothing because the log showed the batch decided, but the "
                "log holds no decision for it now (was the log reset, pruned or edited?). "
                "Refusing to decide the batch without their data; Spark will retry it."
            )
        crashPoint("driver.beforeDecision", batchId)
        decided = self.log.decide(batchId, results, queryId=queryId)
        crashPoint("driver.afterDecision", batchId)
        fresh = {dumpsHandle(r.handle) for r in results if r.handle is not None}
        outcome = (
            CommitOutcome.COMMITTED
            if decided.handleKeys == fresh
            else CommitOutcome.ROLLED_FORWARD  # someone else's decision won the race
        )
        return self._finish(decided, results, started, outcome)

    def abortBatch(self, batchId: int, results: Sequence[TaskResult]) -> CommitReport:
        """Abort batch N unless it is decided; a decided N is rolled forward, never back.

        Undecided: abort every given handle, sweep the other prepared transactions of N, record
        ``aborted(N)`` (Spark replays N later). Failures to abort are logged, not raised: what
        is left is not in any decision, so the next ``recover`` aborts it.
        """
        started = time.monotonic()
        try:
            self._validate(batchId, results)
        except LogOwnershipError:
            # These handles are this query's and undecided anywhere: discard them, then refuse.
            self._abortHandles(batchId, results, decided=frozenset())
            raise
        state = self.log.state(batchId)
        if state is not None and state.status is BatchStatus.COMMITTED:
            return self._skipCommitted(state, results, started)
        if state is not None and state.status is BatchStatus.DECIDED:
            log.warning(
                "twophase sink %s: abort of batch %d, which is decided: rolling it forward",
                self.sinkId,
                batchId,
            )
            if state.awaitingRewrite:
                # A failed replay: its handles are not checked replacements; the next start
                # replays the batch again.
                aborted, retries = self._abortHandles(batchId, results, decided=state.handleKeys)
                return CommitReport(
                    self.sinkId,
                    batchId,
                    CommitOutcome.ABORTED,
                    aborted,
                    0,
                    0,
                    0,
                    retries,
                    time.monotonic() - started,
                    0.0,
                )
            return self._finish(state, results, started, CommitOutcome.ROLLED_FORWARD)
        abortStart = time.monotonic()
        aborted, retries = self._abortHandles(batchId, results, decided=frozenset())
        abortSeconds = time.monotonic() - abortStart
        stragglers = self._sweepBatch(batchId, keep=())
        self.log.markAborted(batchId)
        report = CommitReport(
            self.sinkId,
            batchId,
            CommitOutcome.ABORTED,
            aborted,
            0,
            0,
            stragglers,
            retries,
            time.monotonic() - started,
            abortSeconds,
        )
        log.info(
            "twophase sink %s: aborted batch %d: %d handles, %d other transactions",
            self.sinkId,
            batchId,
            aborted,
            stragglers,
        )
        return report

    def isDecided(self, batchId: int) -> bool:
        """True if batch N is decided or committed: nothing of N may be written again."""
        return self.log.isDecided(batchId)

    def status(self) -> dict[str, Any]:
        """JSON-ready state of the sink for ``twophase status``; outstanding handles described."""
        summary = self.log.status()
        summary["sinkId"] = self.sinkId
        for batch in summary["outstanding"]:
            for entry in batch["handles"]:
                entry["description"] = self._describe(entry["handle"])
        return summary

    # ------------------------------------------------------------------ the state machine

    def _validate(self, batchId: int, results: Sequence[TaskResult]) -> str | None:
        """Check that the results belong to this sink and batch and to the log's query."""
        for result in results:
            if result.sinkId != self.sinkId:
                raise ValueError(
                    f"twophase sink {self.sinkId}: batch {batchId} got a task result of sink "
                    f"{result.sinkId!r} (partition {result.partitionId})"
                )
            if result.batchId != batchId:
                raise ValueError(
                    f"twophase sink {self.sinkId}: batch {batchId} got a task result of batch "
                    f"{result.batchId} (partition {result.partitionId})"
                )
        queryIds = {r.queryId for r in results}
        if len(queryIds) > 1:
            raise ValueError(
                f"twophase sink {self.sinkId}: batch {batchId} got task results of several "
                f"queries: {sorted(queryIds)}"
            )
        queryId = queryIds.pop() if queryIds else ""
        if not queryId:  # no task reported a query id: nothing to check ownership against
            return None
        # Before reading any batch state: another query's committed(N) must not make this
        # query skip its own batch N.
        self.log.claim(self.sinkId, queryId)
        return queryId

    def _skipCommitted(
        self, state: BatchState, results: Sequence[TaskResult], started: float
    ) -> CommitReport:
        aborted, retries = self._abortHandles(state.batchId, results, decided=state.handleKeys)
        log.info(
            "twophase sink %s: batch %d was already committed; replay aborted %d duplicate handles",
            self.sinkId,
            state.batchId,
            aborted,
        )
        return CommitReport(
            self.sinkId,
            state.batchId,
            CommitOutcome.ALREADY_COMMITTED,
            0,
            0,
            aborted,
            0,
            retries,
            time.monotonic() - started,
            0.0,
        )

    def _finish(
        self,
        state: BatchState,
        results: Sequence[TaskResult],
        started: float,
        outcome: CommitOutcome,
    ) -> CommitReport:
        """Commit the decided handles of ``state``, mark it committed, clean up around it."""
        batchId = state.batchId
        action = (
            self.committer.commit
            if outcome is CommitOutcome.COMMITTED
            else self.committer.recoverAndCommit
        )
        commitStart = time.monotonic()
        live = state.liveHandles
        outcomes = self.executor.runAll(
            self._commitJobs(state, action),
            deadline=commitStart + self.settings.commitTimeoutSeconds,
            crashBetween=batchId,
        )
        commitSeconds = time.monotonic() - commitStart
        lost = self.lost.rewritable(outcomes)
        if lost:
            self.lost.record(state, lost)
            raise RewritePendingError(
                self.sinkId, batchId, sorted(lost), self.lost.details(lost.values())
            )
        self._raiseFailures(batchId, outcomes)
        crashPoint("driver.afterCommits", batchId)
        self.log.markCommitted(batchId, commitSeconds)
        crashPoint("driver.afterCommitted", batchId)
        duplicates, abortRetries = self._abortHandles(batchId, results, decided=state.handleKeys)
        stragglers = self._sweepBatch(
            batchId, keep=tuple(e.handle for e in (*state.handles, *state.replacements))
        )
        self._prune()
        report = CommitReport(
            self.sinkId,
            batchId,
            outcome,
            len(live),
            sum(e.rows for e in live),
            duplicates,
            stragglers,
            sum(o.attempts - 1 for o in outcomes) + abortRetries,
            time.monotonic() - started,
            commitSeconds,
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

    def _rollForwardOutstanding(
        self,
    ) -> tuple[list[int], int, tuple[Handle, ...], dict[int, tuple[int, ...]]]:
        """Commit every live handle of every decided-but-unfinished batch; mark those committed.

        Returns the batches finished, the number of handles committed, every handle of the
        outstanding decisions (the ``keep`` of the sweep that follows), and the batches left
        with partitions awaiting their rewrite (lost transactions the sink fingerprints).
        """
        outstanding = self.log.outstanding()
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
                for job in self._commitJobs(state, self.committer.recoverAndCommit)
            ],
            deadline=started + self.settings.commitTimeoutSeconds,
            crashBetween=None,
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
        for state in finished:
            self.log.markCommitted(state.batchId, seconds)
            log.info(
                "twophase sink %s: committed batch %d: %d handles, %d rows in %.0f ms (recovered)",
                self.sinkId,
                state.batchId,
                len(state.liveHandles),
                sum(e.rows for e in state.liveHandles),
                seconds * 1000,
            )
        for batchId in sorted(failedBatches):
            self._raiseFailures(
                batchId,
                [o for o in outcomes if o.job.batchId == batchId and not self.lost.isRewritable(o)],
            )
        committed = sum(1 for o in outcomes if o.error is None)
        return [s.batchId for s in finished], committed, keep, awaiting

    # ------------------------------------------------------------------ lost partitions

    def _commitJobs(self, state: BatchState, action: Callable[[Handle], None]) -> list[CommitJob]:
        """One job per live handle: ``action``, or ``commitReplacement`` for a replay's handle."""
        replaced = {r.key for r in state.replacements}
        jobs = []
        for entry in state.liveHandles:
            original = state.loggedHandleOf(entry.partitionId)
            if entry.key in replaced and original is not None:
                replace = functools.partial(self.committer.commitReplacement, original.handle)
                jobs.append(CommitJob(state.batchId, entry, replace))
            else:
                jobs.append(CommitJob(state.batchId, entry, action))
        return jobs

    def _abortHandles(
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
            crashBetween=None,
        )
        for failed in (o for o in outcomes if o.error is not None):
            log.warning(
                "twophase sink %s: batch %d: could not abort %s (%s: %s); the next recovery "
                "aborts it",
                self.sinkId,
                batchId,
                self._describe(failed.job.entry.handle),
                type(failed.error).__name__,
                failed.error,
            )
        retries = sum(o.attempts - 1 for o in outcomes)
        return sum(1 for o in outcomes if o.error is None), retries

    def sweepAbortedBatch(self, batchId: int) -> int:
        """Abort what tasks of batch N prepared after ``abortBatch`` swept it; only if aborted.

        A decided or committed batch is left alone (its transactions are the decision's);
        returns how many transactions were aborted.
        """
        state = self.log.state(batchId)
        if state is None or state.status is not BatchStatus.ABORTED:
            return 0
        late = self._sweepBatch(batchId, keep=())
        if late:
            log.info(
                "twophase sink %s: batch %d: aborted %d transaction(s) prepared after the abort",
                self.sinkId,
                batchId,
                late,
            )
        return late

    def _sweepBatch(self, batchId: int, keep: tuple[Handle, ...]) -> int:
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
                self._describe(handle),
            )
        return len(aborted)

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

    def _raiseFailures(self, batchId: int, outcomes: Sequence[JobOutcome]) -> None:
        failed = [o for o in outcomes if o.error is not None]
        if not failed:
            return
        for outcome in failed:
            if isinstance(outcome.error, TransactionLostError):
                lost = outcome.error
                lost.add_note(
                    f"twophase sink {self.sinkId}: batch {batchId} is decided, but its "
                    f"transaction {self._describe(outcome.job.entry.handle)} is lost: "
                    "exactly-once is broken for it; the decision stays in the log"
                )
                log.error(
                    "twophase sink %s: batch %d: transaction lost: %s: %s",
                    self.sinkId,
                    batchId,
                    self._describe(outcome.job.entry.handle),
                    lost,
                )
                raise lost
        error = CommitFailedError(
            self.sinkId,
            batchId,
            [(self._describe(o.job.entry.handle), o.attempts, o.error) for o in failed if o.error],
        )
        log.error("%s", error)
        raise error from failed[0].error

    def _describe(self, handle: Handle) -> str:
        fallback = dumpsHandle(handle)
        try:
            text = checkedDescription(self.committer, self.committer.describe(handle), fallback)
        except Exception:  # a description must never hide the real error
            text = fallback
        return redact(text)
