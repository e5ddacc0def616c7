"""The chaos runner: one pipeline started, killed on its schedule, restarted, then verified.

Events of the :class:`~integration_tests.chaos.schedule.Schedule` run in order. Each start arms
the leading protocol points (every task point up to and including one driver point) through
``TWOPHASE_CRASH_AT``; timed kills wait for those to fire, then land once the query has
committed their ``afterBatches`` more batches: the driver's whole session, one executor JVM,
or a server (``Services.crash``); faults beyond kills land the same way and last their
``downSeconds`` while the query runs (a server frozen or cut off through its proxy, the
pipeline's disk full), then heal. Each start's query runs under ``twophase.supervise``
(``chaos.pipeline``), which restarts it in the same session after a failure that leaves the
driver alive; a clean stop (``stop``, SIGTERM to the driver) ends the start, and the runner
checks that ``twophase status`` and ``twophase doctor`` find nothing in doubt. A start that ends
for any reason but a drained source (the driver killed, stopped, or failed for good) is
followed by another, a new driver process, from the same checkpoint, until the source is
drained; then the pipeline's own check compares the output with the input. Each event's
recovery is put down as ridden through, restarted in the session or by a new driver
(``report``). Nothing here knows a sink: what a pipeline writes, kills and verifies is its
module's (``pipelines/``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import IO, Any

from integration_tests.chaos.faultkinds import DISK, NETWORK_KINDS, Disk
from integration_tests.chaos.pipeline import RESTARTS_ENV, STOPPED
from integration_tests.chaos.pipelines import PIPELINES
from integration_tests.chaos.progress import PipelineProgress
from integration_tests.chaos.report import NEW_DRIVER, RESTARTED, RIDDEN, ChaosResult, Kill
from integration_tests.chaos.schedule import ENDS_START, UNNUMBERED, UPGRADED, Event, Schedule
from integration_tests.chaos.servers import Services
from integration_tests.chaos.spec import PipelineSpec
from integration_tests.spark_processes import (
    REPO_ROOT,
    childEnvironment,
    killSession,
    makeSparkHome,
    sessionProcesses,
)
from twophase import faults
from twophase.cli.console import LiveDisplay

START_TIMEOUT = 600.0
"""Seconds a start may go without committing a batch before the runner gives up on it (a hang
is a failure). Counted from its last commit, not its beginning: a start that rides through a
long run of faults on a loaded machine keeps committing, and is not hung."""


def batchesDone(checkpoint: Path) -> int:
    """How many batches Spark has committed: the newest id in ``commits/`` plus one (Spark
    keeps only the last ``minBatchesToRetain`` = 100 entries, so counting them caps at 100)."""
    ids = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*") if p.name.isdigit()]
    return max(ids) + 1 if ids else 0


def executorPids(session: int) -> list[int]:
    """Executor JVMs (``CoarseGrainedExecutorBackend``) in the query's session."""
    pids = []
    for pid in sessionProcesses(session):
        try:
            if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
        except OSError:  # gone meanwhile
            continue
    return sorted(pids)


class LocalDriver:
    """A start's driver: the child process running the query, in a session of its own (with
    ``local-cluster``, its executors are in that session too)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def poll(self) -> int | None:
        return self.process.poll()

    def kill(self) -> None:
        """The timed ``driver`` kill: the whole session, as a power cut."""
        killSession(self.process.pid)

    def stop(self) -> bool:
        """The ``stop`` event: SIGTERM to the driver's Python process, as Kubernetes sends it."""
        self.process.send_signal(signal.SIGTERM)
        return True

    def executorPids(self) -> list[int]:
        return executorPids(self.process.pid)

    def end(self) -> None:
        """After the start: executors or workers a killed driver left behind."""
        killSession(self.process.pid)


class ChaosRun:
    """Runs one pipeline through its schedule; :meth:`run` returns the :class:`ChaosResult`."""

    def __init__(
        self,
        spec: PipelineSpec,
        schedule: Schedule,
        services: Services,
        verify: Callable[[PipelineSpec], Any],
        log: Callable[[str], None] = print,
        disk: Disk | None = None,
        display: LiveDisplay | None = None,
    ) -> None:
        self.spec = spec
        self.disk = disk
        self.schedule = schedule
        self.services = services
        self.verify = verify
        self.log = log
        self.workdir = Path(spec.workdir)
        self.checkpoint = Path(spec.checkpoint)
        self.sparkHome = makeSparkHome(self.workdir / "spark-home")
        self.rng = random.Random(f"{schedule.seed}:{spec.pipeline}:executors")
        self.kills: list[Kill] = []
        self.commitTimes: list[tuple[float, int]] = []  # (when seen, batches committed)
        self.startSpans: list[tuple[float, float]] = []  # (began, ended) of each start
        self.restartTimes: list[float] = []  # when supervision restarted a query (monotonic)
        self.fatal: list[str] = []
        self.starts = 0
        self.failedStarts = 0
        self.skipped: list[Event] = []
        self.progress = PipelineProgress(display, spec.pipeline, schedule)

    # -- one start ------------------------------------------------------------------------------

    @staticmethod
    def crashSettings(armed: list[str], onceDir: Path) -> dict[str, str]:
        """The ``TWOPHASE_CRASH_*`` variables that arm ``armed``, once each."""
        return {faults.ENV: ",".join(armed), faults.ONCE_DIR_ENV: str(onceDir)} if armed else {}

    def launch(
        self, number: int, crash: dict[str, str], out: IO[bytes], previous: bool = False
    ) -> LocalDriver:
        """Start ``number``'s driver with the ``crash`` settings, its output to ``out``; with
        ``previous``, the driver of the previous release (``integration_tests.releases``)."""
        specPath = self.workdir / "spec.json"
        self.spec.save(specPath)
        python, root = (sys.executable, REPO_ROOT)
        env = childEnvironment(self.workdir, self.sparkHome, crash)
        if previous:
            python, root = self.previousRelease()
            env.update(PYSPARK_PYTHON=python, PYTHONPATH=str(root))
        process = subprocess.Popen(
            [python, "-m", "integration_tests.chaos.pipeline", str(specPath)],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return LocalDriver(process)

    def previousRelease(self) -> tuple[str, Path]:
        """The previous release's Python, and a copy of the tests' package for it to run the
        pipeline from (outside the checkout, whose ``twophase`` would come first otherwise)."""
        from integration_tests.releases import releasePython

        root = self.workdir / "previous-release"
        if not (root / "integration_tests").exists():
            shutil.copytree(
                REPO_ROOT / "integration_tests",
                root / "integration_tests",
                ignore=shutil.ignore_patterns("__pycache__", "test_*.py"),
            )
        return str(releasePython()), root

    def committedBatches(self) -> int:
        """How many batches Spark's checkpoint says are committed."""
        return batchesDone(self.checkpoint)

    def plannedBatches(self) -> list[int]:
        """The batch ids Spark's checkpoint has planned (its offsets log)."""
        return [int(p.name) for p in (self.checkpoint / "offsets").glob("[0-9]*")]

    def _sawCommits(self) -> int:
        count = self.committedBatches()
        if not self.commitTimes or self.commitTimes[-1][1] != count:
            self.commitTimes.append((time.monotonic(), count))
        self.progress.committed(count)
        return count

    @staticmethod
    def segment(pending: list[Event]) -> list[Event]:
        """The events of one start: the front of ``pending`` up to and including the first
        that ends the run (a driver point or a timed driver kill)."""
        for index, event in enumerate(pending):
            if event.kind in ENDS_START or event.point.startswith("driver."):
                return pending[: index + 1]
        return list(pending)

    @staticmethod
    def arm(segment: list[Event], firstFresh: int) -> dict[int, str]:
        """``TWOPHASE_CRASH_AT`` items for the points of ``segment``, by index in the segment.

        Numbered points target fresh batches (``firstFresh`` is the first batch id the
        checkpoint has not planned yet: a replayed batch may be decided already and never reach
        a point), spaced as the schedule spaces its events (``afterBatches`` + 1 each).
        """
        items: dict[int, str] = {}
        cursor = firstFresh
        for index, event in enumerate(segment):
            batch = cursor + event.afterBatches
            cursor = batch + 1
            if event.kind == "point":
                numbered = event.point not in UNNUMBERED
                items[index] = f"{event.point}:{batch}" if numbered else event.point
        return items

    def _startOnce(self, pending: list[Event]) -> tuple[int, list[Event]]:
        """One start running the next segment of ``pending``; returns (exit code, the rest)."""
        self.starts += 1
        number = self.starts
        planned = self.plannedBatches()
        firstFresh = max(planned) + 1 if planned else 0
        segment = self.segment(pending)
        armed = self.arm(segment, firstFresh)
        self.progress.started(number, segment)
        onceDir = self.workdir / f"once-{number}"
        onceDir.mkdir(parents=True, exist_ok=True)
        logPath = self.workdir / f"start-{number}.log"
        restartsPath = self.workdir / f"restarts-{number}.jsonl"
        self.log(
            f"[chaos] {self.spec.pipeline} start {number} (first new batch {firstFresh}): "
            + "; ".join(armed.get(i) or e.describe() for i, e in enumerate(segment))
        )
        done: set[int] = set()  # indexes of the segment's events that happened
        settings = {**self.crashSettings(list(armed.values()), onceDir)}
        settings[RESTARTS_ENV] = str(restartsPath)
        began = time.monotonic()
        previous = any(e.kind == UPGRADED for e in segment)
        with logPath.open("ab") as out:  # a second driver that took over wrote there first
            driver = self.launch(number, settings, out, previous)
            try:
                code = self._watch(driver, segment, armed, done, onceDir)
            finally:
                driver.end()
                self.startSpans.append((began, time.monotonic()))
        self._readRestarts(number, restartsPath)
        stops = [e for i, e in enumerate(segment) if i in done and e.kind == "stop"]
        if stops:
            self._checkStopped(number, code)
        left = [e for i, e in enumerate(segment) if i not in done]
        if left:
            self.log(
                f"[chaos] start {number} ended before: {'; '.join(e.describe() for e in left)}"
            )
        outage = max(
            (e.downSeconds for i, e in enumerate(segment) if i in done and e.kind == "point"),
            default=0.0,
        )
        if outage:
            self.log(f"[chaos] start {number}: the query stays down {outage:.0f}s (an outage)")
            self.progress.down(outage)
            time.sleep(outage)
        if code not in (0, -signal.SIGKILL, STOPPED):
            self.failedStarts += 1
            lines = [line for line in logPath.read_text(errors="replace").splitlines() if line]
            tail = "\n".join(line for line in lines if "QUERY FAILED" in line)[:2000]
            self.log(f"[chaos] start {number} ended with {code}; last lines:\n{tail}")
        return code, left + pending[len(segment) :]

    def _watch(
        self,
        child: LocalDriver,
        segment: list[Event],
        armed: dict[int, str],
        done: set[int],
        onceDir: Path,
    ) -> int:
        """Wait for the child: note the armed points that fire, deliver the segment's timed
        kills in order, each once ``afterBatches`` more batches are committed (plus jitter)."""
        progressed = time.monotonic()
        baseline = mark = last = self._sawCommits()
        timed = [i for i, e in enumerate(segment) if e.kind != "point"]
        dueAt: float | None = None
        while True:
            code = child.poll()
            count = self._sawCommits()
            fired = set(faults.firedItems(str(onceDir)))
            for index, item in armed.items():
                point = segment[index].point
                hit = next((f for f in fired if f.split(":")[0] == point), None)
                if index in done or hit is None or (point not in UNNUMBERED and hit != item):
                    continue
                done.add(index)
                marker = onceDir / f"{item.replace(':', '-')}.fired"
                self.kills.append(Kill(segment[index], marker.stat().st_mtime - _epoch()))
                self.progress.happened(segment[index])
                self.log(f"[chaos] fired {hit}")
            if code is not None:
                return code
            if count > baseline:  # recovery is over: an unfired recovery point cannot fire now
                for index, item in armed.items():
                    if item in UNNUMBERED and index not in done:
                        done.add(index)
                        self.skipped.append(segment[index])
                        self.progress.happened(segment[index], delivered=False)
                        self.log(f"[chaos] {item}: nothing to recover in this start; skipped")
            if count != last:
                last, progressed = count, time.monotonic()
            if time.monotonic() - progressed > START_TIMEOUT:
                raise AssertionError(
                    f"{self.spec.pipeline}: start {self.starts} committed no batch for "
                    f"{START_TIMEOUT:.0f}s"
                )
            pendingTimed = [i for i in timed if i not in done]
            if pendingTimed and count - mark >= batchesBefore(segment[pendingTimed[0]]):
                event = segment[pendingTimed[0]]
                if dueAt is None:
                    dueAt = time.monotonic() + event.jitterSeconds
                if time.monotonic() >= dueAt:
                    if self._deliver(event, child):
                        done.add(pendingTimed[0])
                        mark = self._sawCommits()
                    dueAt = None
            time.sleep(0.1)

    def _deliver(self, event: Event, driver: LocalDriver) -> bool:
        """Deliver a timed kill or a fault (back once it heals); False when there was nothing
        to kill yet (try again)."""
        now = time.monotonic()
        self.progress.delivering(event)
        if event.isFault:
            began = self._fault(event)
            self.kills.append(Kill(event, began, healed=time.monotonic()))
            self.progress.happened(event)
            self.log(f"[chaos] {event.describe()}: delivered and healed")
            return True
        if event.kind in ("driver", UPGRADED):
            driver.kill()
        elif event.kind == "stop":
            driver.stop()
        elif event.kind == "executor":
            pids = driver.executorPids()
            if not pids:
                return False
            os.kill(self.rng.choice(pids), signal.SIGKILL)
        else:
            with self.services.exclusive(event.kind):
                now = time.monotonic()
                self.services.crash(event.kind, event.downSeconds)
        self.kills.append(Kill(event, now))
        self.progress.happened(event)
        self.log(f"[chaos] {event.describe()}: delivered")
        return True

    def _fault(self, event: Event) -> float:
        """The fault of ``event`` for its ``downSeconds`` (commits still watched), then healed;
        a server's fault waits for any other on the same server to heal first. Returns when it
        began."""
        own = event.target == DISK  # the pipeline's own disk: nobody else's fault reaches it
        with nullcontext() if own else self.services.exclusive(event.target):
            began = time.monotonic()
            self._faultFor(event)
            return began

    def _faultFor(self, event: Event) -> None:
        heal: Callable[[], None]
        if event.kind == "freeze":
            heal = self.services.freeze(event.target)
        elif event.kind in NETWORK_KINDS:
            heal = self._throughProxies(
                event, lambda: self.services.disturb(event.kind, event.target)
            )
        elif event.kind == "disk full" and self.disk is not None:
            self.disk.fill()
            heal = self.disk.free
        else:
            raise AssertionError(f"no way to deliver {event.describe()}")
        try:
            until = time.monotonic() + event.downSeconds
            while time.monotonic() < until:
                self._sawCommits()
                time.sleep(0.1)
        finally:
            if event.kind in NETWORK_KINDS:
                self._throughProxies(event, heal)
            else:
                heal()

    def _throughProxies(self, event: Event, call: Callable[[], Any]) -> Any:
        """``call`` on the proxies; when Toxiproxy does not answer, restart it and call again
        (a restarted Toxiproxy has no toxics, so a heal is then done already)."""
        from integration_tests.toxiproxy import ToxiproxyError

        try:
            return call()
        except ToxiproxyError as exc:
            self.log(f"[chaos] {event.describe()}: {exc}; restarting Toxiproxy")
            self.services.restartProxies()
            return call()

    # -- the whole schedule ---------------------------------------------------------------------

    def run(self, maxStarts: int | None = None) -> ChaosResult:
        began = time.monotonic()
        pending = list(self.schedule.events)
        limit = maxStarts or 2 * len(pending) + 10
        while True:
            if self.starts >= limit:
                raise AssertionError(
                    f"{self.spec.pipeline}: not drained after {limit} starts (seed "
                    f"{self.schedule.seed}); logs in {self.workdir}"
                )
            code, pending = self._startOnce(pending)
            if self.drained(code):
                break
        self._recoveryTimes()
        self.progress.verifying()
        report = self.verify(self.spec)
        self.progress.finished()
        return ChaosResult(
            seed=self.schedule.seed,
            pipeline=self.spec.pipeline,
            kills=self.kills,
            starts=self.starts,
            failedStarts=self.failedStarts,
            batches=self.committedBatches(),
            records=int(report.actualRows),
            missing=int(report.missing),
            duplicated=int(report.duplicated),
            unexpected=int(report.unexpected),
            seconds=time.monotonic() - began,
            report=str(report),
            skipped=self.skipped + pending,
            restarts=len(self.restartTimes),
            fatal=self.fatal,
        )

    def drained(self, code: int) -> bool:
        """Whether a start that ended with ``code`` leaves the source drained and nothing
        running: the run is over."""
        return code == 0

    def _readRestarts(self, number: int, path: Path) -> None:
        """The start's supervised restarts and its end, as its child wrote them."""
        if not path.exists():
            return
        offset = _epoch()
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "end" not in record:
                self.restartTimes.append(float(record["at"]) - offset)
                self.log(f"[chaos] start {number}: restarted in the session: {record['code']}")
            elif record["end"] == "failed" and not record.get("recoverable", True):
                self.fatal.append(f"start {number}: {record['code']}")

    def _checkStopped(self, number: int, code: int) -> None:
        """After a clean stop: the start exited as stopped, and ``twophase status`` and
        ``twophase doctor`` find nothing in doubt. Put down on the stop's ``Kill``, whose
        recovery is counted from the end of the stopped start to the new driver's first
        batch."""
        from twophase import cli

        stop = next(k for k in reversed(self.kills) if k.event.kind == "stop")
        stop.healed = self.startSpans[-1][1]  # its recovery counts from the stop's end
        if code != STOPPED:
            stop.checked = f"exit {code}, not stopped"
            return
        options = PIPELINES[self.spec.pipeline].doctorOptions(self.spec)
        given = [w for k, v in options.items() for w in ("--sink-option", f"{k}={v}")]
        said = io.StringIO()
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            status = cli.main(["status", "--checkpoint", self.spec.checkpointLocation])
            doctor = cli.main(["doctor", "--checkpoint", self.spec.checkpointLocation, *given])
        stop.checked = f"status {status}, doctor {doctor}"
        self.log(f"[chaos] start {number} stopped cleanly: {stop.checked}")
        if status or doctor:
            self.log(f"[chaos] start {number}: left in doubt after the stop:\n{said.getvalue()}")

    def _recoveryTimes(self) -> None:
        """For each kill: seconds until the next batch was committed after it; for a fault,
        after it healed; and how the query came back by then."""
        for kill in self.kills:
            since = kill.healed or kill.at
            before = max((n for t, n in self.commitTimes if t <= since), default=0)
            after = next((t for t, n in self.commitTimes if t > since and n > before), None)
            kill.recoverySeconds = None if after is None else after - since
            until = after if after is not None else float("inf")
            ended = any(kill.at <= end < until for _, end in self.startSpans)
            restarted = any(kill.at <= t < until for t in self.restartTimes)
            kill.way = NEW_DRIVER if ended else RESTARTED if restarted else RIDDEN


def batchesBefore(event: Event) -> int:
    """How many batches the running start commits before ``event`` is due: its
    ``afterBatches``, and for a clean stop at least one, so that it lands in a running query
    (a SIGTERM before the query started ends the process before supervision could catch it)."""
    return max(1, event.afterBatches) if event.kind == "stop" else event.afterBatches


def _epoch() -> float:
    """Offset between the wall clock (file times) and ``time.monotonic()``."""
    return time.time() - time.monotonic()
