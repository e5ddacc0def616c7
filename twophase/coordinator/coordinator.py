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

This module is the walk of a batch through those states. What each step does lives by role:
:mod:`~twophase.coordinator.commits` (a decided batch's commits, ``committed(N)`` and the
cleanup), :mod:`~twophase.coordinator.recovery` (outstanding decisions rolled forward, then the
sweep), :mod:`~twophase.coordinator.aborts` (undecided handles aborted, a batch swept),
:mod:`~twophase.coordinator.lost` (lost partitions and their rewrite) and
:mod:`~twophase.coordinator.execution` (the calls, in parallel, with retries).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from twophase.coordinator.aborts import Aborts
from twophase.coordinator.commits import BatchCommits
from twophase.coordinator.errors import CoordinatorError, DriverFencedError, LogOwnershipError
from twophase.coordinator.execution import CommitExecutor
from twophase.coordinator.figures import AbortFigures, BatchTimes
from twophase.coordinator.holding import Holding
from twophase.coordinator.log import DecisionLog
from twophase.coordinator.lost import LostPartitions
from twophase.coordinator.records import BatchState, BatchStatus
from twophase.coordinator.recovery import Recovery
from twophase.coordinator.reports import CommitOutcome, CommitReport, RecoveryReport
from twophase.coordinator.runs import Driver
from twophase.coordinator.settings import CoordinatorSettings
from twophase.coordinator.slots import SlotFenced
from twophase.faults import crashPoint
from twophase.protocol import Committer, Handle, TaskResult, dumpsHandle
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
    epoch:
        The run of this driver (``holdLog`` claims one); the coordinator decides, sweeps and
        marks only while it is the newest run. ``None``: no run, which holds the log only
        while no driver ever claimed it.

    No state is kept between calls beyond the settings and the run: any process of the driver
    may make any call.
    """

    def __init__(
        self,
        committer: Committer,
        log: DecisionLog,
        sinkId: str,
        settings: CoordinatorSettings | None = None,
        epoch: int | None = None,
    ) -> None:
        self.committer = committer
        self.log = log
        self.sinkId = sinkId
        self.settings = settings or CoordinatorSettings()
        self.epoch = epoch
        self.holding = Holding(log, sinkId)
        describe = self._describe
        self.executor = CommitExecutor(sinkId, self.settings, describe)
        self.lost = LostPartitions(committer, log, sinkId, self.settings, describe, self._guard)
        self.aborts = Aborts(committer, sinkId, self.settings, self.executor, describe)
        self.commits = BatchCommits(
            committer, log, sinkId, self.settings, self.executor, self.lost, self.aborts, describe
        )
        self.recovery = Recovery(
            committer,
            log,
            sinkId,
            self.settings,
            self.executor,
            self.lost,
            self.commits,
            describe,
            self._check,
        )

    # ------------------------------------------------------------------ public API

    def holdLog(
        self,
        driver: Driver,
        remembered: int | None,
        batchId: int | None = None,
        queryId: str | None = None,
    ) -> int:
        """Make this driver's run the one that holds the log; returns its epoch.

        ``remembered`` is the run this driver claimed before, if any: kept while it is the
        newest, ``DriverFencedError`` once a newer driver claimed the log. A driver without
        one claims a new run and fences the batches an older driver may still be deciding
        (``holding``), up to ``batchId``, the batch about to run. Call before ``recover``.
        """
        self.epoch = self.holding.claim(driver, remembered, batchId, queryId)
        return self.epoch

    def _guard(self, doing: str) -> None:
        self.holding.require(self.epoch, doing)

    def _check(self, doing: str, newest: int | None) -> None:
        self.holding.check(self.epoch, newest, doing)

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
        self.recovery.rollForwardOutstanding()
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
        return self.recovery.recover(batchId)

    def commitBatch(
        self, batchId: int, results: Sequence[TaskResult], times: BatchTimes | None = None
    ) -> CommitReport:
        """Make batch N visible exactly once; safe to call again, for a replay, from any process.

        Not decided yet: validate the results, write ``decided(N)`` (the commit point), commit
        every handle in parallel with bounded retries, write ``committed(N)``, abort the other
        prepared transactions of N. Decided but unfinished: commit the logged handles (not the
        new ones), abort the new ones. Committed: abort this replay's handles, commit nothing.

        Raises ``CommitFailedError`` when handles stay uncommitted after retries (the decision
        stays: the next ``recover`` rolls forward), ``TransactionLostError`` when the
        committer lost a decided transaction, ``LogOwnershipError`` when the log belongs to
        another query, ``ValueError`` for results of another sink or batch. ``times``: when the
        batch was planned and its tasks ran, recorded with the commit's own in ``committed(N)``.
        """
        started = time.monotonic()
        stamps = {**(times.stamps() if times is not None else {}), "commitCalled": time.time()}
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
                state = self.lost.take(state, results, self.aborts.abortHandles)
            return self.commits.finish(state, results, started, CommitOutcome.ROLLED_FORWARD)
        skipped = [r.partitionId for r in results if r.handle is None]
        if skipped:
            raise CoordinatorError(
                f"twophase sink {self.sinkId}: tasks of batch {batchId} (partitions "
                f"{skipped}) wrote nothing because the log showed the batch decided, but the "
                "log holds no decision for it now (was the log reset, pruned or edited?). "
                "Refusing to decide the batch without their data; Spark will retry it."
            )
        crashPoint("driver.beforeDecision", batchId)
        self._guard(f"decides batch {batchId}")
        decisionStart = time.monotonic()
        try:
            decided = self.log.decide(batchId, results, queryId=queryId, epoch=self.epoch)
        except SlotFenced as exc:
            # A newer driver fenced the batch after the check above (this one was slow or
            # frozen in between): its transactions are not this driver's to decide or sweep.
            self.aborts.abortHandles(batchId, results, decided=frozenset())
            raise self.holding.fenced(self.epoch, exc.epoch, f"decides batch {batchId}") from None
        decisionSeconds = time.monotonic() - decisionStart
        stamps["decided"] = time.time()
        crashPoint("driver.afterDecision", batchId)
        fresh = {dumpsHandle(r.handle) for r in results if r.handle is not None}
        if decided.handleKeys == fresh:
            return self.commits.finish(
                decided, results, started, CommitOutcome.COMMITTED, decisionSeconds, stamps
            )
        # Someone else's decision won the race: its handles are rolled forward.
        return self.commits.finish(decided, results, started, CommitOutcome.ROLLED_FORWARD)

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
            self.aborts.abortHandles(batchId, results, decided=frozenset())
            raise
        state = self.log.state(batchId)
        try:
            self._guard(f"aborts batch {batchId}")
        except DriverFencedError:
            # Its own handles only (never what a decision names); the sweep is the newer
            # driver's, whose batch in flight may be this one.
            decided = state.handleKeys if state is not None else frozenset()
            self.aborts.abortHandles(batchId, results, decided=decided)
            raise
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
                aborted, retries = self.aborts.abortHandles(
                    batchId, results, decided=state.handleKeys
                )
                return CommitReport(
                    sinkId=self.sinkId,
                    batchId=batchId,
                    outcome=CommitOutcome.ABORTED,
                    handles=aborted,
                    retries=retries,
                    seconds=time.monotonic() - started,
                )
            return self.commits.finish(state, results, started, CommitOutcome.ROLLED_FORWARD)
        abortStart = time.monotonic()
        aborted, retries = self.aborts.abortHandles(batchId, results, decided=frozenset())
        abortSeconds = time.monotonic() - abortStart
        stragglers = self.aborts.sweepBatch(batchId, keep=())
        self.log.markAborted(batchId, AbortFigures(aborted + stragglers, retries, abortSeconds))
        report = CommitReport(
            sinkId=self.sinkId,
            batchId=batchId,
            outcome=CommitOutcome.ABORTED,
            handles=aborted,
            stragglersAborted=stragglers,
            retries=retries,
            seconds=time.monotonic() - started,
            commitSeconds=abortSeconds,
        )
        log.info(
            "twophase sink %s: aborted batch %d: %d handles, %d other transactions",
            self.sinkId,
            batchId,
            aborted,
            stragglers,
        )
        return report

    def sweepAbortedBatch(self, batchId: int) -> int:
        """Abort what tasks of batch N prepared after ``abortBatch`` swept it; only if aborted.

        A decided or committed batch is left alone (its transactions are the decision's), and
        so is every batch once another driver holds the log; returns how many were aborted.
        """
        state = self.log.state(batchId)
        if state is None or state.status is not BatchStatus.ABORTED:
            return 0
        self._guard(f"sweeps batch {batchId} again")
        late = self.aborts.sweepBatch(batchId, keep=())
        if late:
            log.info(
                "twophase sink %s: batch %d: aborted %d transaction(s) prepared after the abort",
                self.sinkId,
                batchId,
                late,
            )
            self._countLateAborts(batchId, late)
        return late

    def _countLateAborts(self, batchId: int, late: int) -> None:
        """Add transactions a late sweep aborted to ``aborted(N)``'s figures; best effort."""
        try:
            earlier = self.log.figures(batchId)
            figures = AbortFigures(
                (earlier.aborted or 0) + late if earlier else late,
                (earlier.retries or 0) if earlier else 0,
                (earlier.abortSeconds or 0.0) if earlier else 0.0,
            )
            self.log.markAborted(batchId, figures)
        except Exception as exc:  # figures only: the abort itself is done
            log.warning(
                "twophase sink %s: batch %d: could not record the late aborts (%s: %s)",
                self.sinkId,
                batchId,
                type(exc).__name__,
                exc,
            )

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
        aborted, retries = self.aborts.abortHandles(
            state.batchId, results, decided=state.handleKeys
        )
        log.info(
            "twophase sink %s: batch %d was already committed; replay aborted %d duplicate handles",
            self.sinkId,
            state.batchId,
            aborted,
        )
        return CommitReport(
            sinkId=self.sinkId,
            batchId=state.batchId,
            outcome=CommitOutcome.ALREADY_COMMITTED,
            duplicatesAborted=aborted,
            retries=retries,
            seconds=time.monotonic() - started,
        )

    def _describe(self, handle: Handle) -> str:
        fallback = dumpsHandle(handle)
        try:
            text = checkedDescription(self.committer, self.committer.describe(handle), fallback)
        except Exception:  # a description must never hide the real error
            text = fallback
        return redact(text)
