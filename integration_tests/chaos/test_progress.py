"""The chaos soak's live rows: on a terminal what each pipeline has done of its schedule and
what it is at; off one, and without a display (``make test``'s bounded profile), nothing."""

from __future__ import annotations

import io
import re

import pytest

from integration_tests.chaos.progress import PipelineProgress
from integration_tests.chaos.schedule import Event, Schedule
from twophase.cli.console import LiveDisplay

KILL = Event("driver", afterBatches=1, jitterSeconds=0.3)
POINT = Event("point", "task.afterWrite", 0)
RECOVERY = Event("point", "driver.duringRecovery")
FREEZE = Event("freeze", afterBatches=0, jitterSeconds=0.5, downSeconds=4.2, target="postgres")
SCHEDULE = Schedule(7, "postgres", [POINT, RECOVERY, KILL, FREEZE])


def playSchedule(progress: PipelineProgress) -> None:
    """What the runner tells a pipeline's row over two starts."""
    progress.started(1, [POINT, RECOVERY, KILL])
    progress.committed(2)
    progress.happened(POINT)
    progress.happened(RECOVERY, delivered=False)  # nothing to recover in this start
    progress.delivering(KILL)
    progress.happened(KILL)
    progress.started(2, [FREEZE])
    progress.committed(5)
    progress.delivering(FREEZE)
    progress.happened(FREEZE)
    progress.verifying()
    progress.finished()


def test_a_terminal_row_shows_kills_faults_batches_and_the_current_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    out = io.StringIO()
    with LiveDisplay(out, "events", live=True) as display:
        playSchedule(PipelineProgress(display, "postgres", SCHEDULE))
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    for text in (
        "postgres",
        "kills 0/3, faults 0/1, batches 2/",
        "start 1: next task.afterWrite (+0 batches)",
        "start 1: now kill driver after 1 batches + 0.30s",
        "start 1: no event left",
        "2/4 events",  # the skipped recovery point counts as passed, not as a kill
        "kills 2/3, faults 0/1",
        "start 2: now freeze of postgres after 0 batches + 0.50s, for 4.2s",
        "4/4 events",
        "kills 2/3, faults 1/1, batches 5/",
        "verifying the output",
        "done",
    ):
        assert text in shown, f"{text!r} never shown"


def test_off_a_terminal_and_without_a_display_nothing_is_shown() -> None:
    out = io.StringIO()  # not a terminal
    with LiveDisplay(out, "events") as display:
        progress = PipelineProgress(display, "postgres", SCHEDULE)
        playSchedule(progress)
    assert out.getvalue() == ""
    quiet = PipelineProgress(None, "postgres", SCHEDULE)
    playSchedule(quiet)
    assert (quiet.kills, quiet.faults, quiet.passed) == (2, 1, 4)
