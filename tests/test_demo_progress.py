"""``twophase demo``'s output, with its Spark runs played by fake children: off a terminal the
same lines as ever and not one control character; on a terminal a live display of the step,
the batches and the rows, the same lines above it, and nothing of it left at the end."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

import pytest

from twophase.cli import demo

ROWS, PER_BATCH = 1_000, 100  # ten batches; the kill lands in batch 4

PLAIN_OUTPUT = """\
twophase demo: 1,000 rows in 10 batches of 100, sequence -> files ({output})
run 1: SIGKILL of the whole query (driver JVM and Python workers) in batch 4, after its decision \
and its first committed transaction
  batch   0:        100 rows read by this run
  batch   1:        200 rows read by this run
  batch   2:        300 rows read by this run
  batch   3:        400 rows read by this run
crash after 1.0s: the log holds 4 committed batches and 1 decided-but-unfinished transactions; \
1 undecided staged attempts
run 2: restarting from the checkpoint
  batch   4:        100 rows read by this run
  batch   5:        200 rows read by this run
  batch   6:        300 rows read by this run
  batch   7:        400 rows read by this run
  batch   8:        500 rows read by this run
  batch   9:        600 rows read by this run

summary
  rows expected                         1,000
  rows in output                        1,000
  duplicated / missing / wrong      0 / 0 / 0
  batches committed                        10
  transactions recovered                    1  (decided before the crash)
  staged attempts aborted                   1  (prepared, never decided)
  staging left behind                       0
  throughput                              200 rows/s  (wall clock of both runs, Spark \
start-up included)
  result: EXACTLY ONCE
"""
"""What the demo printed before it had a live display, for the fake runs below."""


class FakeChild:
    """A query's child process: its progress lines, then its exit code."""

    def __init__(self, batches: range, code: int) -> None:
        self.stdout = iter(
            demo.PROGRESS_PREFIX + json.dumps({"batchId": b, "numInputRows": PER_BATCH}) + "\n"
            for b in batches
        )
        self.code = code

    def wait(self) -> int:
        return self.code


@pytest.fixture
def fakeRuns(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> demo.DemoPlan:
    """Run 1 commits batches 0-3 and is SIGKILLed in batch 4 (decided, one transaction
    committed, one staged attempt undecided); run 2 commits 4-9. A clock ticks 1 s a call."""
    plan = demo.DemoPlan(tmp_path / "demo", ROWS, PER_BATCH, 2, 0.4)
    runs = [FakeChild(range(4), -signal.SIGKILL), FakeChild(range(4, 10), 0)]
    started: list[FakeChild] = []

    def startChild(*_: Any) -> FakeChild:
        started.append(runs[len(started)])
        return started[-1]

    def committed(_: demo.DemoPlan) -> int:
        return 10 if len(started) == 2 else 4

    def staging(_: demo.DemoPlan) -> set[str]:
        return set() if len(started) == 2 else {"files/a1", "files/a2"}

    def outstanding(_: demo.DemoPlan) -> list[dict[str, Any]]:
        return [{"staging": "files/a1"}]

    verified = {"rows": ROWS, "duplicates": 0, "missing": 0, "unexpected": 0}
    ticks = iter(range(1_000))
    monkeypatch.setattr(demo, "time", SimpleNamespace(monotonic=lambda: float(next(ticks))))
    monkeypatch.setattr(demo, "_startChild", startChild)
    monkeypatch.setattr(demo, "_committedBatches", committed)
    monkeypatch.setattr(demo, "_stagingAttempts", staging)
    monkeypatch.setattr(demo, "_outstandingHandles", outstanding)
    monkeypatch.setattr(demo, "verifyOutput", lambda _: dict(verified, wrongPayloads=0))
    return plan


class NotATerminal:
    """A file as a pipe or CI's log is: it says it is no terminal."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_off_a_terminal_the_demo_prints_what_it_always_did(fakeRuns: demo.DemoPlan) -> None:
    out = NotATerminal()
    assert demo.runDemo(fakeRuns, out) == 0  # type: ignore[arg-type]
    assert out.text == PLAIN_OUTPUT.format(output=fakeRuns.output)
    assert not [c for c in out.text if not c.isprintable() and c != "\n"]


class BrokenTerminal(NotATerminal):
    """A terminal that fails every write holding a control sequence, as one gone or unable to
    show what the display draws."""

    def write(self, text: str) -> int:
        if "\x1b" in text:
            raise OSError(5, "Input/output error")
        return super().write(text)

    def isatty(self) -> bool:
        return True


@contextmanager
def terminal() -> Iterator[tuple[TextIO, list[bytes]]]:
    """A pseudo-terminal: what is written to the file given is read from its other side."""
    leader, follower = pty.openpty()
    out = os.fdopen(follower, "w", encoding="utf-8")
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the other side is closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield out, chunks
    finally:
        out.close()
        reader.join(10)
        os.close(leader)
    assert not reader.is_alive(), "the terminal's reader did not reach the end of the output"


def screen(raw: str) -> str:
    """What a terminal shows once ``raw`` is written: line feeds, carriage returns, the cursor
    moved up, lines erased; other control sequences (colours, the cursor hidden) show nothing."""
    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]+", raw):
        if token == "\n":
            row += 1
            lines += [""] * (row + 1 - len(lines))
        elif token == "\r":
            col = 0
        elif token.startswith("\x1b[") and token.endswith("A"):
            row = max(0, row - int(token[2:-1] or 1))
        elif token == "\x1b[2K":
            lines[row] = ""
        elif not token.startswith("\x1b"):
            lines[row] = lines[row][:col].ljust(col) + token + lines[row][col + len(token) :]
            col += len(token)
    return "\n".join(lines).rstrip("\n") + "\n"


def onATerminal(plan: demo.DemoPlan, monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.delenv("NO_COLOR", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with terminal() as (out, chunks):
        assert demo.runDemo(plan, out) == 0
    return b"".join(chunks).decode()


def test_on_a_terminal_a_live_row_shows_the_step_the_batches_and_the_rows(
    fakeRuns: demo.DemoPlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = onATerminal(fakeRuns, monkeypatch)
    for shown in (
        "run 1: writing",
        "4/10 batches",
        "400 rows written",
        "run 2: writing",
        "10/10 batches",
        "1,000 rows written",
        "checking the output",
    ):
        assert shown in raw, f"{shown!r} never shown"
    assert "\x1b[" in raw  # drawn in place
    assert screen(raw) == PLAIN_OUTPUT.format(output=fakeRuns.output)  # and erased at the end


def test_no_color_keeps_the_live_row_without_colours(
    fakeRuns: demo.DemoPlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = onATerminal(fakeRuns, monkeypatch, NO_COLOR="1")
    assert "10/10 batches" in raw
    params = [p for sgr in re.findall(r"\x1b\[([0-9;]*)m", raw) for p in sgr.split(";") if p]
    colours = [p for p in params if 30 <= int(p) <= 49 or 90 <= int(p) <= 107]
    assert not colours


def test_a_dumb_terminal_gets_the_plain_lines(
    fakeRuns: demo.DemoPlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = onATerminal(fakeRuns, monkeypatch, TERM="dumb")
    assert raw == PLAIN_OUTPUT.format(output=fakeRuns.output).replace("\n", "\r\n")


def test_a_terminal_that_fails_the_display_still_gets_every_line(
    fakeRuns: demo.DemoPlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    out = BrokenTerminal()
    assert demo.runDemo(fakeRuns, out) == 0  # type: ignore[arg-type]
    assert out.text == PLAIN_OUTPUT.format(output=fakeRuns.output)
