"""The driver's steps around a micro-batch: open the coordinator, hold the log, recover.

The data source's stream writer and the ``foreachBatch`` adapter both call ``beforeBatch``
once per micro-batch, before any task runs, and ``openCoordinator`` to commit or abort it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from twophase.coordinator import (
    CommitOutcome,
    CommitReport,
    Coordinator,
    DecisionLog,
    DriverFencedError,
)
from twophase.coordinator.description import SinkDescription, writeSinkDescription
from twophase.coordinator.errors import DecisionConflictError
from twophase.coordinator.figures import AbortFigures
from twophase.faults import injectFaults
from twophase.protocol import Committer, TaskResult
from twophase.redaction import getLogger, isSafeOption, publicOptions
from twophase.settings import SinkSettings
from twophase.spark import driver_runs, stopping
from twophase.spark.worker import ensureLogging

log = getLogger(__name__)

LATE_TASK_GRACE_SECONDS = 5.0
"""How long the abort of a failed batch waits before sweeping it again (``abortFailedBatch``)."""


@dataclass(frozen=True)
class BatchPlan:
    """What the tasks of the batch being planned write, from the log as recovery left it.

    Nothing of a batch the log holds as decided (a replay after a crash), except the partitions
    whose decided transactions the system aborted: those the replay writes again.
    """

    lastDecided: int | None = None
    rewrite: Mapping[int, frozenset[int]] = field(default_factory=dict)
    epoch: int | None = None
    """The run of this driver that planned the batch (``twophase.spark.driver_runs``)."""
    stopping: bool = False
    """The query is stopping cleanly (``twophase.spark.stopping``): no task writes anything."""
    planned: tuple[float, float] | None = None
    """When the driver began and ended planning the batch (epoch seconds), for its figures."""

    def writes(self, batchId: int, partitionId: int) -> bool:
        """True when the task of ``partitionId`` in ``batchId`` must write its input."""
        if self.stopping:
            return False
        if self.lastDecided is None or batchId > self.lastDecided:
            return True
        return partitionId in self.rewrite.get(batchId, frozenset())

    def writesAny(self, batchId: int) -> bool:
        """True when some task of ``batchId`` must write."""
        if self.stopping:
            return False
        if self.lastDecided is None or batchId > self.lastDecided:
            return True
        return bool(self.rewrite.get(batchId))


def openCoordinator(
    committer: Committer, settings: SinkSettings, epoch: int | None = None
) -> Coordinator:
    """A coordinator over the sink's decision log, with the sink's retry bounds, acting as run
    ``epoch`` (``None``: the run this driver claimed, if any).

    Every path of the binding opens its coordinator here, so this is where the fault injection
    that wraps the committer (``driver.betweenCommits``) comes in, when a test arms it.
    """
    if epoch is None:
        epoch = driver_runs.rememberedRun(settings.logLocation)
    return Coordinator(
        injectFaults(committer),
        DecisionLog(settings.logLocation, unfenced=settings.unfencedLogStore),
        settings.sinkId,
        settings.coordinator,
        epoch,
    )


@contextmanager
def forgottenIfFenced(settings: SinkSettings) -> Iterator[None]:
    """A driver fenced by a newer one forgets its run: its query stops, and a new start of it
    in the same application claims the log again."""
    try:
        yield
    except DriverFencedError:
        driver_runs.forgetRun(settings.logLocation)
        raise


def abortFailedBatch(
    coordinator: Coordinator, batchId: int, results: Sequence[TaskResult], *, unreported: bool
) -> CommitReport:
    """Abort batch ``batchId`` after its job failed, or roll it forward if the log shows it
    decided; then, if some task never reported, sweep the batch once more.

    Spark fails the job and reports it while it is still killing the batch's other tasks; a
    task whose input was all delivered can reach PREPARE before its Python worker goes
    (PySpark allows ``spark.python.task.killTimeout``, 2 s). The second sweep, after that,
    leaves nothing prepared that would hold table locks (and Kafka's last stable offset) until
    the next start. Only an aborted batch is swept.
    """
    report = coordinator.abortBatch(batchId, results)
    if report.outcome is CommitOutcome.ABORTED and unreported:
        time.sleep(LATE_TASK_GRACE_SECONDS)
        coordinator.sweepAbortedBatch(batchId)
    return report


def stoppedBatch(settings: SinkSettings, queryId: str | None, batchId: int | None) -> bool:
    """Before anything of a batch: True when the query is stopping cleanly and the batch must
    not begin (``twophase.spark.stopping``); the log then holds it as aborted, stopped before
    any task, so nothing of it is in doubt. Spark plans it again at the next start."""
    if not stopping.parkedBeforeBatch(queryId, batchId):
        return False
    if batchId is not None:
        try:
            DecisionLog(settings.logLocation, unfenced=settings.unfencedLogStore).markAborted(
                batchId, AbortFigures(0, stopped=True)
            )
        except DecisionConflictError:  # decided before the stop: the next start commits it
            log.info(
                "twophase sink %s: batch %d is decided; left to the next start",
                settings.sinkId,
                batchId,
            )
    log.info("twophase sink %s: the query stops before batch %s begins", settings.sinkId, batchId)
    return True


def describeSink(sink: Any, settings: SinkSettings) -> None:
    """Keep ``sink.json`` beside the log: the data source class and its safe options only.

    ``twophase recover`` rebuilds the sink's committer from it. Only the options on the sink's
    allow-list (``safeOptions``, plus the shared ones) are written, in the form the sink's
    ``publicOptionValue`` gives (a URL without its password), through ``publicOptions``.
    """
    cls = type(sink)
    safe = getattr(sink, "safeOptions", ())
    shown = getattr(sink, "publicOptionValue", None)
    kept: dict[str, str] = {}
    for key, value in sink.options.items():
        if not isSafeOption(key, safe):
            continue
        public = shown(key, str(value)) if shown is not None else str(value)
        if public is not None:
            kept[key] = public
    writeSinkDescription(
        settings.logLocation,
        SinkDescription(
            sinkId=settings.sinkId,
            className=f"{cls.__module__}:{cls.__qualname__}",
            options=publicOptions(kept, safe, among=sink.options),
        ),
    )


def beforeBatch(
    sink: Any,
    committer: Committer,
    settings: SinkSettings,
    queryId: str | None,
    batchId: int | None = None,
) -> BatchPlan:
    """Hold the log for this driver and query, finish or abort what earlier runs left, and say
    what the tasks of the planned batch write (``BatchPlan``).

    Another query's log is refused before anything is written; a driver that is not the
    newest to claim the log stops with ``DriverFencedError`` (``coordinator.holding``).
    """
    ensureLogging()
    coordinator = openCoordinator(committer, settings)
    if queryId and not settings.resetLog:
        coordinator.log.refuseOtherQuery(settings.sinkId, queryId)
    with forgottenIfFenced(settings):
        epoch = coordinator.holdLog(
            driver_runs.currentDriver(), coordinator.epoch, batchId, queryId
        )
        driver_runs.rememberRun(settings.logLocation, epoch)
        if queryId:
            coordinator.claim(queryId, reset=settings.resetLog)
        describeSink(sink, settings)
        report = coordinator.recover(batchId)
    if not report.idle:
        log.info("twophase sink %s: recovery %s", settings.sinkId, report)
    return BatchPlan(
        coordinator.log.lastDecided(),
        {b: frozenset(partitions) for b, partitions in report.awaitingRewrite.items()},
        epoch,
    )
