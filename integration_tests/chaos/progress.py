"""What a chaos soak shows while it runs: a live row per pipeline, on a terminal only.

Each row (``twophase.cli.console.LiveDisplay``) names the pipeline, fills a bar with its events
done of those its schedule planned, and says the kills and the faults apart, the batches
committed of those its input holds, the start it is in and the event it is delivering or
waiting for. Off a terminal, and in ``make test``'s bounded profile (which gives no display),
a :class:`PipelineProgress` only counts: the run's log lines and final tables are all there is.
"""

from __future__ import annotations

from integration_tests.chaos.schedule import Event, Schedule
from twophase.cli.console import LiveDisplay


class PipelineProgress:
    """One pipeline's row, told by the runner as things happen."""

    def __init__(self, display: LiveDisplay | None, pipeline: str, schedule: Schedule) -> None:
        events = schedule.events
        self.row = display.row(pipeline, total=len(events)) if display else None
        self.killsPlanned = sum(1 for e in events if not e.isFault)
        self.faultsPlanned = len(events) - self.killsPlanned
        self.batchesPlanned = schedule.batchesNeeded()
        self.kills = self.faults = self.passed = self.batches = self.start = 0
        self.waiting: list[Event] = []
        self.doing = "preparing"
        self.shown = ""

    def detail(self) -> str:
        return (
            f"kills {self.kills}/{self.killsPlanned}, faults {self.faults}/{self.faultsPlanned}, "
            f"batches {self.batches}/{self.batchesPlanned}, start {self.start}: {self.doing}"
        )

    def started(self, number: int, segment: list[Event]) -> None:
        """Start ``number`` runs the events of ``segment``."""
        self.start, self.waiting = number, list(segment)
        self._waitForNext()

    def committed(self, batches: int) -> None:
        self.batches = batches
        self._show()

    def delivering(self, event: Event) -> None:
        """A timed kill or a fault is under way (a fault lasts its ``downSeconds``)."""
        self.doing = f"now {event.describe()}"
        self._show()

    def happened(self, event: Event, delivered: bool = True) -> None:
        """``event`` is over: delivered (a protocol point fired, a kill landed, a fault
        healed), or skipped."""
        self.passed += 1
        if delivered and event.isFault:
            self.faults += 1
        elif delivered:
            self.kills += 1
        if event in self.waiting:
            self.waiting.remove(event)
        self._waitForNext()

    def down(self, seconds: float) -> None:
        self.doing = f"the query stays down {seconds:.0f}s (an outage)"
        self._show()

    def verifying(self) -> None:
        self.doing = "verifying the output"
        self._show()

    def finished(self) -> None:
        self.doing = "done"
        self._show()

    def _waitForNext(self) -> None:
        self.doing = f"next {self.waiting[0].describe()}" if self.waiting else "no event left"
        self._show()

    def _show(self) -> None:
        detail = self.detail()
        if self.row is not None and detail != self.shown:  # the runner polls ten times a second
            self.shown = detail
            self.row.show(done=self.passed, detail=detail)
