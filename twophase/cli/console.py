"""What a command shows as it runs: its log records on stderr, and a long run's live progress.

Log records: all of them with ``--debug``, else warnings, briefly. Without ``--debug`` the
command's own paragraph (``twophase.cli.errors``) says what failed, so twophase's errors are not
logged again, each warning is shown once per message template on one short line without its
traceback, and the Kafka clients' own chatter is silenced.

Progress (:class:`LiveDisplay`): a long run's lines as ever, and on a terminal a live display
below them of what it is doing, redrawn in place and gone when the run ends; off a terminal
only the lines.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TextIO

from twophase.redaction import getLogger

log = getLogger(__name__)

BRIEF_LOG_CHARS = 200
"""Without ``--debug``, a log line is cut here: the command's own paragraph says the rest."""


class _Briefly(logging.Filter):
    """Without ``--debug``: warnings once per message template, on one short line, no
    traceback, and nothing the command says itself (the coordinator's errors become the
    command's one paragraph)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, object]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.name.startswith("twophase."):
            return False
        key = (record.name, record.msg)
        if key in self.seen:
            return False
        self.seen.add(key)
        message = " ".join(record.getMessage().split())
        if len(message) > BRIEF_LOG_CHARS:
            message = message[: BRIEF_LOG_CHARS - 3] + "..."
        record.msg, record.args = message, None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


@contextmanager
def commandLogging(err: TextIO, debug: bool, command: str) -> Iterator[None]:
    """Log records on ``err`` for the command's duration: everything with ``--debug``, else
    warnings only, briefly; the Kafka clients' own chatter only with ``--debug``."""
    root = logging.getLogger()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    if not debug:
        handler.addFilter(_Briefly())
    quiet = logging.INFO if debug and command != "doctor" else logging.WARNING
    saved = {name: logging.getLogger(name).level for name in ("", "kafka", "confluent_kafka")}
    root.addHandler(handler)
    root.setLevel(quiet)
    if not debug:
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
        logging.getLogger("confluent_kafka").setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


DUMB_TERMINALS = ("dumb", "unknown")
"""``TERM`` values of terminals that cannot move the cursor: no live display there."""


def isLiveTerminal(stream: Any) -> bool:
    """Whether a live display may redraw on ``stream``: a terminal (``isatty``) whose ``TERM``
    can move the cursor. ``NO_COLOR`` keeps the display and takes its colours away."""
    if os.environ.get("TERM", "") in DUMB_TERMINALS:
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):  # closed, or no file at all
        return False


class _TerminalFile:
    """The terminal as the live display writes to it: a write that fails (the terminal gone,
    an encoding it cannot show) is noted, not raised, so the display's own thread cannot fail."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.encoding = getattr(out, "encoding", None) or "utf-8"
        self.failed = False

    def write(self, text: str) -> int:
        if not self.failed:
            try:
                self.out.write(text)
            except (OSError, ValueError):
                self.failed = True
        return len(text)

    def flush(self) -> None:
        if not self.failed:
            try:
                self.out.flush()
            except (OSError, ValueError):
                self.failed = True

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.out.fileno()


class LiveRow:
    """One row of a :class:`LiveDisplay`: a name, a count done of a total, a line of detail.
    Off a terminal a row shows nothing and its updates do nothing."""

    def __init__(self, display: LiveDisplay | None, task: Any = None) -> None:
        self._display = display
        self._task = task

    def show(
        self,
        *,
        name: str | None = None,
        done: int | None = None,
        total: int | None = None,
        detail: str | None = None,
    ) -> None:
        """Change what the row shows; what is not given stays."""
        display = self._display
        if display is None:
            return
        fields: dict[str, Any] = {} if detail is None else {"detail": detail}
        display._draw(
            lambda progress: progress.update(
                self._task, description=name, completed=done, total=total, refresh=True, **fields
            )
        )


class LiveDisplay:
    """A long run's lines on ``out`` as ever and, when ``out`` is a terminal (``isLiveTerminal``),
    a live display of rows below them (``rich``): a spinner, each row's name, a bar of its count
    done of its total in ``unit``, the time since it began, its detail. Transient: when the run
    ends the rows are erased and only the lines stay, as off a terminal.

    Off a terminal (a pipe, CI's log, a test's capture) it writes the lines and nothing else:
    no control character. While the display is live, ``print`` and the log records that went
    to the terminal go above it. The display never raises into the run: when drawing fails it
    stops, and the lines go on plain.
    """

    def __init__(self, out: TextIO, unit: str, live: bool | None = None) -> None:
        self.out = out
        self.unit = unit
        self.live = isLiveTerminal(out) if live is None else live
        self._progress: Any = None
        self._file = _TerminalFile(out)
        self._logStreams: dict[logging.StreamHandler[Any], Any] = {}

    def __enter__(self) -> LiveDisplay:
        if self.live:
            self._draw(lambda _: None, starting=True)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop()

    def row(self, name: str, total: int) -> LiveRow:
        """A new row, at the bottom of the display."""
        tasks: list[Any] = []
        self._draw(lambda p: tasks.append(p.add_task(name, total=total, detail="")))
        return LiveRow(self, tasks[0]) if tasks else LiveRow(None)

    def say(self, text: str) -> None:
        """Write ``text`` (its line ends included) above the display, or plain without one."""
        self._draw(lambda progress: progress.console.out(text, end="", highlight=False))
        if self._progress is None:
            self.out.write(text)
            self.out.flush()

    def _start(self) -> None:
        from rich.console import Console
        from rich.file_proxy import FileProxy
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.table import Column

        # Each row on one line: the detail takes what the other columns leave of the
        # terminal's width, and a narrow terminal cuts it short rather than wrapping the row.
        name = Column(no_wrap=True, overflow="ellipsis")
        detail = Column(no_wrap=True, overflow="ellipsis", ratio=1)

        console = Console(file=self._file, force_terminal=True)  # type: ignore[arg-type]
        progress = self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", style="bold", markup=False, table_column=name),
            BarColumn(bar_width=16),
            TextColumn(f"{{task.completed:.0f}}/{{task.total:.0f}} {self.unit}", markup=False),
            TimeElapsedColumn(),
            TextColumn("{task.fields[detail]}", markup=False, table_column=detail),
            console=console,
            expand=True,
            transient=True,
            refresh_per_second=4,
        )
        progress.start()
        for handler in logging.getLogger().handlers:
            if type(handler) is logging.StreamHandler and isLiveTerminal(handler.stream):
                self._logStreams[handler] = handler.setStream(FileProxy(console, handler.stream))

    def _draw(self, step: Callable[[Any], object], starting: bool = False) -> None:
        """``step`` on the live display (started first when ``starting``); on any failure,
        or a write to the terminal that failed, stop the display for the rest of the run."""
        if self._progress is None and not starting:
            return
        try:
            if starting:
                self._start()
            step(self._progress)
        except Exception:
            log.debug("the live display stopped", exc_info=True)
            self._file.failed = True
        if self._file.failed:
            self._stop()

    def _stop(self) -> None:
        progress, self._progress = self._progress, None
        for handler, stream in self._logStreams.items():
            handler.setStream(stream)
        self._logStreams.clear()
        if progress is not None:
            try:
                progress.stop()
            except Exception:
                log.debug("the live display stopped", exc_info=True)
