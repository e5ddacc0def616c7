"""Holding the decision log: a new driver claims it and fences out the older one.

Two drivers on one checkpoint (a retried application master, a replaced pod whose node is only
partitioned, a job started twice) must never both decide. A driver claims a run when it first
plans a batch (:mod:`~twophase.coordinator.runs`); the newest run holds the log. On a claim the
new run fences the decision slots of the batches an older driver may still be deciding: from the
first batch without a decision up to the batch being planned (:mod:`~twophase.coordinator.slots`),
so an older driver's decision either was created before the fence (and the new run rolls it
forward) or is refused, even one frozen between a check and its write. Every other write of a
driver's own (a sweep of what no decision keeps, an abort mark, a rewrite record) first checks
that its run is still the newest, and a driver that is not stops with ``DriverFencedError``.

A claim is said once: at INFO as an ordinary takeover when the older run's driver is known to be
gone (its process ended on this host: :mod:`~twophase.coordinator.liveness`) or is this very
driver, and as a WARNING when it may still run (its process runs, or it is on another host and
nobody here can tell): then two drivers may be running the query.
"""

from __future__ import annotations

from dataclasses import dataclass

from twophase.coordinator.errors import DriverFencedError
from twophase.coordinator.liveness import Liveness, checkDriver
from twophase.coordinator.log import DecisionLog
from twophase.coordinator.runs import Driver, Run
from twophase.coordinator.slots import SlotFenced
from twophase.redaction import getLogger

log = getLogger(__name__)

CLAIM_ATTEMPTS = 20
"""Claims tried before giving up when other drivers keep claiming the same epochs first."""


@dataclass(frozen=True)
class Holding:
    """Claims and checks runs of one sink's log."""

    log: DecisionLog
    sinkId: str

    def claim(
        self,
        driver: Driver,
        remembered: int | None,
        batchId: int | None,
        queryId: str | None = None,
    ) -> int:
        """The epoch of ``driver``'s run: ``remembered`` (the run it claimed before) while that
        is still the newest, else a new run, which fences the slots an older run may decide in.

        Raises ``DriverFencedError`` when a newer run than ``remembered`` claimed the log.
        ``batchId`` is the batch about to run, when known: fenced too, if it is further on.
        """
        runs = self.log.runs
        for _ in range(CLAIM_ATTEMPTS):
            newest = runs.newest()
            if remembered is not None and newest is not None:
                if newest == remembered:
                    return remembered
                if newest > remembered:
                    raise self.fenced(remembered, newest, "plans another batch")
            epoch = (newest or 0) + 1
            run = runs.create(epoch, driver, queryId)
            if run is None:
                continue  # another driver claimed that epoch first: claim after it
            if newest is None:
                log.info(
                    "twophase sink %s: %s (decision log %s)",
                    self.sinkId,
                    run.describe(),
                    self.log.url,
                )
                return epoch
            fenced = self._fenceOlder(epoch, batchId)
            self._sayTakeover(run, newest, fenced)
            return epoch
        raise RuntimeError(
            f"twophase sink {self.sinkId}: could not claim the decision log {self.log.url}: "
            f"other drivers claimed it first {CLAIM_ATTEMPTS} times in a row; are several "
            "drivers starting this query over and over?"
        )

    def _sayTakeover(self, run: Run, older: int, fenced: list[int]) -> None:
        """The claim's one line: an ordinary takeover (INFO) when the older run's driver is
        gone or is this driver, a warning when it may still be running."""
        previous = self.log.runs.read(older)
        closed = f"batches {fenced}" if fenced else "no batch"
        running = False
        if previous is None:
            former, reason, mayRun = f"run {older}", "its record is gone: cannot tell", True
        elif previous.driver.id == run.driver.id:
            former, reason, mayRun = previous.describe(), "this same driver", False
        else:
            check = checkDriver(previous)
            former, reason, mayRun = previous.describe(), check.said, check.mayRun
            running = check.liveness is Liveness.RUNNING
        if not mayRun:
            log.info(
                "twophase sink %s: %s (decision log %s); took the log over from %s (%s): an "
                "ordinary takeover, %s closed to the old run",
                self.sinkId,
                run.describe(),
                self.log.url,
                former,
                reason,
                closed,
            )
            return
        log.warning(
            "twophase sink %s: %s (decision log %s); fenced out %s (%s), which %s: %s closed to "
            "it, it stops before it writes anything of its own. If two drivers run this query, "
            "stop the one that should not run (docs/operations.md, Two drivers on one "
            "checkpoint)",
            self.sinkId,
            run.describe(),
            self.log.url,
            former,
            reason,
            "still runs" if running else "may still be running",
            closed,
        )

    def _fenceOlder(self, epoch: int, batchId: int | None) -> list[int]:
        """Fence N's slot for every N from the first batch without a decision up to
        ``batchId``; a batch decided first moves the end one further (the older run goes on to
        the next). Returns the batches fenced."""
        last = self.log.lastDecided()
        current = 0 if last is None else last + 1
        end = current if batchId is None else max(current, batchId)
        fenced: list[int] = []
        while current <= end:
            try:
                if self.log.fence(current, epoch):
                    fenced.append(current)
                else:
                    end = max(end, current + 1)
            except SlotFenced as exc:
                raise self.fenced(epoch, exc.epoch, "fences the log") from None
            current += 1
        return fenced

    def require(self, epoch: int | None, doing: str) -> None:
        """Raise ``DriverFencedError`` unless run ``epoch`` is the newest (one listing)."""
        self.check(epoch, self.log.runs.newest(), doing)

    def check(self, epoch: int | None, newest: int | None, doing: str) -> None:
        """Raise ``DriverFencedError`` unless run ``epoch`` is ``newest``, the newest run just
        listed. ``epoch=None``, a coordinator that holds no run (a direct use of the API), holds
        the log only while no run ever claimed it."""
        if newest is None or (epoch is not None and newest <= epoch):
            return
        raise self.fenced(epoch, newest, doing)

    def fenced(self, epoch: int | None, newer: int, doing: str) -> DriverFencedError:
        """The error for run ``epoch`` (``None``: no run) that met run ``newer``."""
        record = self.log.runs.read(newer)
        described = record.describe() if record is not None else f"run {newer}"
        return DriverFencedError(self.log.url, self.sinkId, epoch, described, doing)
