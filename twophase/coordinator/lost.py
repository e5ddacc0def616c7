"""Decided transactions the participant aborted on its own: found, recorded, written again.

Kafka aborts a transaction older than its timeout, also a decided one. When the sink
fingerprints its handles (``Committer.fingerprint``), such a loss is recorded in the log's
``rewrite(N)`` record instead of stopping the query, Spark's replay of N writes those partitions
again, and ``take`` accepts the replay's handles once their fingerprints match the decided ones
(docs/protocol.md section 5). The coordinator's state machine calls this; nothing here commits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from twophase.coordinator.errors import RewriteMismatchError
from twophase.coordinator.execution import JobOutcome
from twophase.coordinator.log import DecisionLog
from twophase.coordinator.records import BatchState, LoggedHandle
from twophase.coordinator.settings import REWRITE_MISMATCH_OPTION, CoordinatorSettings
from twophase.protocol import Committer, Handle, TaskResult, TransactionLostError
from twophase.protocol.fingerprint import differenceOf
from twophase.redaction import getLogger

log = getLogger(__name__)


class LostPartitions:
    """The lost-partition rules of one sink's coordinator: which losses the replay can repair,
    recording them, and taking the replay's handles for them."""

    def __init__(
        self,
        committer: Committer,
        decisionLog: DecisionLog,
        sinkId: str,
        settings: CoordinatorSettings,
        describe: Callable[[Handle], str],
        guard: Callable[[str], None] = lambda doing: None,
    ) -> None:
        self.committer = committer
        self.log = decisionLog
        self.sinkId = sinkId
        self.settings = settings
        self.describe = describe
        self.guard = guard
        """Raises unless this driver still holds the log (``Holding.require``)."""

    def isRewritable(self, outcome: JobOutcome) -> bool:
        """A decided transaction the participant aborted, in a sink that fingerprints it."""
        error = outcome.error
        return (
            isinstance(error, TransactionLostError)
            and error.rewritable
            and self.fingerprint(outcome.job.entry.handle) is not None
        )

    def rewritable(self, outcomes: Sequence[JobOutcome]) -> dict[int, JobOutcome]:
        """The rewritable losses among ``outcomes``, by partition."""
        return {o.job.entry.partitionId: o for o in outcomes if self.isRewritable(o)}

    def fingerprint(self, handle: Handle) -> str | None:
        try:
            return self.committer.fingerprint(handle)
        except Exception:  # a broken fingerprint must not hide the loss
            log.warning(
                "twophase sink %s: fingerprint of a handle failed", self.sinkId, exc_info=True
            )
            return None

    def record(self, state: BatchState, lost: dict[int, JobOutcome]) -> BatchState:
        """Record the partitions of ``lost`` as awaiting their rewrite; returns the new state."""
        partitions = tuple(sorted(set(state.lostPartitions) | set(lost)))
        replacements = tuple(r for r in state.replacements if r.partitionId not in lost)
        self.guard(f"records the lost partitions of batch {state.batchId}")
        self.log.recordRewrite(state.batchId, partitions, replacements)
        for outcome in lost.values():
            log.warning(
                "twophase sink %s: batch %d partition %d: decided transaction %s was aborted by "
                "the system (%s); the replay of the batch writes it again",
                self.sinkId,
                state.batchId,
                outcome.job.entry.partitionId,
                self.describe(outcome.job.entry.handle),
                outcome.error,
            )
        replaced = {r.partitionId for r in replacements}
        return dataclasses.replace(
            state,
            lostPartitions=partitions,
            awaitingRewrite=tuple(p for p in partitions if p not in replaced),
            replacements=replacements,
        )

    def details(self, outcomes: Any) -> str:
        first = next(iter(outcomes))
        return f"{self.describe(first.job.entry.handle)}: {first.error}"

    def take(
        self,
        state: BatchState,
        results: Sequence[TaskResult],
        abortOthers: Callable[..., object],
    ) -> BatchState:
        """Take the replay's handles for the partitions awaiting a rewrite, once they match.

        Every awaiting partition needs a replay handle whose fingerprint equals the decided
        one, or the replay gave the lost partitions' records to one another's tasks
        (``permuted``); otherwise (a non-deterministic query, other partitioning) nothing of
        the replay is written and ``RewriteMismatchError`` names what differs, unless the
        ``twophase.rewriteMismatch=write`` setting accepts the replay's records.
        """
        batchId = state.batchId
        known = state.handleKeys
        replay = {
            r.partitionId: r
            for r in results
            if r.handle is not None and LoggedHandle.fromResult(r).key not in known
        }
        replacements = list(state.replacements)
        permuted = self.permuted(state, replay)
        if permuted:
            replacements += [LoggedHandle.fromResult(replay[p]) for p in state.awaitingRewrite]
            log.info(
                "twophase sink %s: batch %d: the replay gave the lost partitions' records to "
                "other tasks (%s): each matches a lost partition's fingerprint, all are taken",
                self.sinkId,
                batchId,
                ", ".join(f"partition {p}'s to partition {q}" for p, q in permuted.items()),
            )
            return self.recorded(state, replacements)
        differences: list[tuple[int, str]] = []
        for partitionId in state.awaitingRewrite:
            original = state.loggedHandleOf(partitionId)
            expected = None if original is None else self.fingerprint(original.handle)
            result = replay.get(partitionId)
            if result is None or result.handle is None:
                differences.append(
                    (partitionId, "the replay wrote nothing for it (fewer partitions?)")
                )
                continue
            got = self.fingerprint(result.handle)
            difference = (
                "no fingerprint to compare"
                if expected is None or got is None
                else differenceOf(expected, got)
            )
            if difference is not None:
                differences.append((partitionId, difference))
                if self.settings.rewriteMismatch != "write":
                    continue
            replacements.append(LoggedHandle.fromResult(result))
        unwritable = [d for d in differences if d[0] not in {r.partitionId for r in replacements}]
        if unwritable or (differences and self.settings.rewriteMismatch != "write"):
            abortOthers(batchId, results, decided=known)
            error = RewriteMismatchError(self.sinkId, batchId, differences, REWRITE_MISMATCH_OPTION)
            log.error("%s", error)
            raise error
        if differences:
            log.warning(
                "twophase sink %s: batch %d: writing the replay's records for lost partitions "
                "although they differ from the decided ones (%s=write): %s",
                self.sinkId,
                batchId,
                REWRITE_MISMATCH_OPTION,
                "; ".join(f"partition {p}: {what}" for p, what in differences),
            )
        return self.recorded(state, replacements)

    def permuted(self, state: BatchState, replay: dict[int, TaskResult]) -> dict[int, int]:
        """Where each lost partition's records went, when the replay gave them to other tasks
        among the lost partitions (Spark's Kafka source may order a batch's topic partitions
        otherwise after a restart): each replay handle's fingerprint equals exactly one lost
        partition's. Empty when they are in place, or anything else differs."""
        expected: dict[str, list[int]] = {}
        handles: dict[int, Handle] = {}
        for partitionId in state.awaitingRewrite:
            original = state.loggedHandleOf(partitionId)
            fingerprint = None if original is None else self.fingerprint(original.handle)
            result = replay.get(partitionId)
            if fingerprint is None or result is None or result.handle is None:
                return {}
            expected.setdefault(fingerprint, []).append(partitionId)
            handles[partitionId] = result.handle
        moved: dict[int, int] = {}
        for partitionId, handle in handles.items():
            got = self.fingerprint(handle)
            if got is None or not expected.get(got):
                return {}
            source = expected[got].pop(0)
            if source != partitionId:
                moved[source] = partitionId
        return moved

    def recorded(self, state: BatchState, replacements: list[LoggedHandle]) -> BatchState:
        """``replacements`` recorded as the rewrite of ``state``'s batch."""
        batchId = state.batchId
        self.guard(f"records the rewrite of batch {batchId}")
        self.log.recordRewrite(batchId, state.lostPartitions, replacements)
        log.info(
            "twophase sink %s: batch %d: the replay rewrites lost partitions %s",
            self.sinkId,
            batchId,
            list(state.awaitingRewrite),
        )
        return dataclasses.replace(state, replacements=tuple(replacements), awaitingRewrite=())
