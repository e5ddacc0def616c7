"""The chaos runner: a pipeline started, killed at seeded moments, restarted, then verified.

A :class:`Schedule` is a list of events drawn from one seed (printed, so a failing seed replays
the same schedule):

- a *protocol point* (``task.afterWrite``, ``driver.afterDecision`` ...): armed through
  ``TWOPHASE_CRASH_AT`` when the query starts, so that exact step SIGKILLs its process
  (PROTOCOL.md section 5); numbered points are armed for the batch ``afterBatches`` after the
  start's first one;
- an *outage*: a protocol point whose kill keeps the query down for ``downSeconds`` before the
  next start, longer than the Kafka transaction timeout (``KAFKA_TIMEOUT_MS``) of the ``multi``
  pipeline's Kafka target, so the broker aborts the transactions of a decided batch and the
  restart must write them again, while PostgreSQL keeps its prepared half of the same batch;
- a *timed kill* of the ``driver`` (the query's whole session), an ``executor`` JVM, the Kafka
  ``broker`` or ``postgres`` (brought back after ``downSeconds``), delivered once the running
  query has committed ``afterBatches`` more batches, plus ``jitterSeconds`` so it lands inside a
  batch rather than between two.

Events run in order. Each start arms the leading protocol points (every task point up to and
including one driver point); timed kills wait for those to fire. A start that ends for any
reason but a drained source is followed by another, from the same checkpoint, until the source
is drained; then the output is compared with the input by ``twophase.verify``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from integration_tests.chaos.pipeline import PipelineSpec
from integration_tests.conftest import SERVICES_DIR, ServiceControl
from integration_tests.spark_processes import (
    REPO_ROOT,
    childEnvironment,
    killSession,
    makeSparkHome,
    sessionProcesses,
)
from twophase import faults

TASK_POINTS = [p for p in faults.POINTS if p.startswith("task.")]
DRIVER_POINTS = [
    # afterDecision first: the next start has a decided batch to roll forward, so that
    # duringRecovery, armed in that start, fires.
    "driver.afterDecision",
    "driver.duringRecovery",
    "driver.beforeDecision",
    "driver.betweenCommits",
    "driver.afterCommits",
    "driver.afterCommitted",
]
UNNUMBERED = {"driver.duringRecovery"}
"""Points armed without a batch: recovery runs before the start's first batch."""
RANDOM_POINTS = [p for p in faults.POINTS if p not in UNNUMBERED]
"""Points a random event may draw; ``driver.duringRecovery`` only follows a crash that leaves
a decided batch to recover (``driver.afterDecision``), else it would have nothing to fire in."""

KAFKA_TIMEOUT_MS = 15_000
"""The ``multi`` pipeline's Kafka target's (and the ``kafka`` pipeline's)
``kafka.transaction.timeout.ms``: short, so an outage outlives it."""
OUTAGE_PIPELINE = "multi"
"""The pipeline whose schedule has outages: its Kafka target's transactions time out while the
query is down after a decision, and PostgreSQL's prepared ones of the same batch do not."""
OUTAGE_SECONDS = 2.5 * KAFKA_TIMEOUT_MS / 1000
"""How long an outage keeps the query down: past the timeout and the broker's abort sweep."""

SERVICE_KINDS = {
    "postgres": ("postgres",),
    "kafka": ("broker",),
    "kafka-kafka": ("broker",),
    "multi": ("postgres", "broker"),
    "s3": ("s3",),
    "mariadb": ("mariadb",),
}
"""The servers a pipeline depends on, by pipeline (files has none)."""

START_TIMEOUT = 600.0
"""Seconds one start may run before the runner gives up on it (a hang is a failure)."""


@dataclass(frozen=True)
class Event:
    """One fault: a protocol point or a timed kill (see the module docstring)."""

    kind: str  # "point", "driver", "executor", "broker", "postgres"
    point: str = ""
    afterBatches: int = 0
    jitterSeconds: float = 0.0
    downSeconds: float = 0.0

    def describe(self) -> str:
        if self.kind == "point":
            down = f", down {self.downSeconds:.0f}s" if self.downSeconds else ""
            return f"{self.point} (+{self.afterBatches} batches){down}"
        extra = f", down {self.downSeconds:.1f}s" if self.downSeconds else ""
        return (
            f"kill {self.kind} after {self.afterBatches} batches + {self.jitterSeconds:.2f}s{extra}"
        )


@dataclass
class Schedule:
    seed: int
    pipeline: str
    events: list[Event]

    @classmethod
    def draw(cls, seed: int, pipeline: str, kills: int, *, coverPoints: bool) -> Schedule:
        """``kills`` events for ``pipeline``: with ``coverPoints`` every protocol point first
        (and the outage, for ``OUTAGE_PIPELINE``); then one timed kill of each kind the pipeline
        has (driver, executor, its servers), in seeded order, all of them with ``coverPoints``
        even past ``kills``; then seeded random events."""
        rng = random.Random(f"{seed}:{pipeline}")
        timedKinds = ["driver", "executor", *SERVICE_KINDS.get(pipeline, ())]
        events: list[Event] = []
        if coverPoints:
            events += [Event("point", p, rng.randint(0, 1)) for p in TASK_POINTS + DRIVER_POINTS]
            if pipeline == OUTAGE_PIPELINE:
                events.append(Event("point", "driver.afterDecision", downSeconds=OUTAGE_SECONDS))
        queue = rng.sample(timedKinds, len(timedKinds))
        while len(events) < kills or (coverPoints and queue):
            kind = queue.pop(0) if queue else rng.choice([*timedKinds, "executor", "point"])
            if kind == "point":
                point = rng.choice(RANDOM_POINTS)
                outage = pipeline == OUTAGE_PIPELINE and point == "driver.afterDecision"
                down = OUTAGE_SECONDS if outage and rng.random() < 0.3 else 0.0
                events.append(Event("point", point, rng.randint(0, 2), downSeconds=down))
                if point == "driver.afterDecision" and rng.random() < 0.5:
                    events.append(Event("point", "driver.duringRecovery"))
                continue
            down = (
                round(rng.uniform(0.5, 4.0), 1)
                if kind in ("broker", "postgres", "s3", "mariadb")
                else 0.0
            )
            events.append(
                Event(
                    kind,
                    afterBatches=rng.randint(0, 2),
                    jitterSeconds=round(rng.uniform(0.0, 1.2), 2),
                    downSeconds=down,
                )
            )
        return cls(seed, pipeline, events)

    def batchesNeeded(self) -> int:
        """Enough batches that the source is not drained before the last event."""
        return 2 * sum(e.afterBatches + 1 for e in self.events) + 6


@dataclass
class Kill:
    event: Event
    at: float  # time.monotonic() when delivered
    recoverySeconds: float | None = None


@dataclass
class ChaosResult:
    seed: int
    pipeline: str
    kills: list[Kill]
    starts: int
    failedStarts: int
    batches: int
    records: int
    missing: int
    duplicated: int
    unexpected: int
    seconds: float
    report: str
    skipped: list[Event] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.duplicated == 0 and self.unexpected == 0

    def killsByKind(self) -> Counter[str]:
        return Counter(
            ("task point" if k.event.point.startswith("task.") else "driver point")
            if k.event.kind == "point"
            else k.event.kind
            for k in self.kills
        )

    def longestRecovery(self) -> float:
        return max((k.recoverySeconds or 0.0 for k in self.kills), default=0.0)


@dataclass
class Services:
    """Where the servers of ``make services`` are, and how the runner crashes one of them
    (``conftest.ServiceControl``: services/kafka.sh and postgres.sh, data and port kept)."""

    pgUrl: str = ""
    bootstrap: str = ""
    s3: Any = None
    """The S3 server (``conftest.S3Service``) of the ``s3`` pipeline."""
    mariadbUrl: str = ""
    """The SQLAlchemy URL of the MariaDB of the ``mariadb`` pipeline."""

    def crash(self, kind: str, downSeconds: float) -> None:
        script, noun = {
            "broker": ("kafka.sh", "broker"),
            "postgres": ("postgres.sh", "server"),
            "s3": ("s3.sh", "server"),
            "mariadb": ("mariadb.sh", "server"),
        }[kind]
        control = ServiceControl(SERVICES_DIR / script, noun)
        control.kill()
        time.sleep(downSeconds)
        control.start()


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


class ChaosRun:
    """Runs one pipeline through its schedule; :meth:`run` returns the :class:`ChaosResult`."""

    def __init__(
        self,
        spec: PipelineSpec,
        schedule: Schedule,
        services: Services,
        verify: Callable[[PipelineSpec], Any],
        log: Callable[[str], None] = print,
    ) -> None:
        self.spec = spec
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
        self.starts = 0
        self.failedStarts = 0
        self.skipped: list[Event] = []

    # -- one start ------------------------------------------------------------------------------

    def _env(self, armed: list[str], onceDir: Path) -> dict[str, str]:
        crash = {faults.ENV: ",".join(armed), faults.ONCE_DIR_ENV: str(onceDir)} if armed else {}
        return childEnvironment(self.workdir, self.sparkHome, crash)

    def _sawCommits(self) -> int:
        count = batchesDone(self.checkpoint)
        if not self.commitTimes or self.commitTimes[-1][1] != count:
            self.commitTimes.append((time.monotonic(), count))
        return count

    @staticmethod
    def segment(pending: list[Event]) -> list[Event]:
        """The events of one start: the front of ``pending`` up to and including the first
        that ends the run (a driver point or a timed driver kill)."""
        for index, event in enumerate(pending):
            if event.kind == "driver" or event.point.startswith("driver."):
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
        planned = [int(p.name) for p in (self.checkpoint / "offsets").glob("[0-9]*")]
        firstFresh = max(planned) + 1 if planned else 0
        segment = self.segment(pending)
        armed = self.arm(segment, firstFresh)
        onceDir = self.workdir / f"once-{number}"
        onceDir.mkdir(parents=True, exist_ok=True)
        specPath = self.workdir / "spec.json"
        self.spec.save(specPath)
        logPath = self.workdir / f"start-{number}.log"
        self.log(
            f"[chaos] {self.spec.pipeline} start {number} (first new batch {firstFresh}): "
            + "; ".join(armed.get(i) or e.describe() for i, e in enumerate(segment))
        )
        done: set[int] = set()  # indexes of the segment's events that happened
        with logPath.open("w") as out:
            child = subprocess.Popen(
                [sys.executable, "-m", "integration_tests.chaos.pipeline", str(specPath)],
                cwd=REPO_ROOT,
                env=self._env(list(armed.values()), onceDir),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                code = self._watch(child, segment, armed, done, onceDir)
            finally:
                killSession(child.pid)  # executors or workers a killed driver left behind
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
            time.sleep(outage)
        if code not in (0, -signal.SIGKILL):
            self.failedStarts += 1
            lines = [line for line in logPath.read_text(errors="replace").splitlines() if line]
            tail = "\n".join(line for line in lines if "QUERY FAILED" in line)[:2000]
            self.log(f"[chaos] start {number} ended with {code}; last lines:\n{tail}")
        return code, left + pending[len(segment) :]

    def _watch(
        self,
        child: subprocess.Popen[bytes],
        segment: list[Event],
        armed: dict[int, str],
        done: set[int],
        onceDir: Path,
    ) -> int:
        """Wait for the child: note the armed points that fire, deliver the segment's timed
        kills in order, each once ``afterBatches`` more batches are committed (plus jitter)."""
        started = time.monotonic()
        baseline = mark = self._sawCommits()
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
                self.log(f"[chaos] fired {hit}")
            if code is not None:
                return code
            if count > baseline:  # recovery is over: an unfired recovery point cannot fire now
                for index, item in armed.items():
                    if item in UNNUMBERED and index not in done:
                        done.add(index)
                        self.skipped.append(segment[index])
                        self.log(f"[chaos] {item}: nothing to recover in this start; skipped")
            if time.monotonic() - started > START_TIMEOUT:
                raise AssertionError(
                    f"{self.spec.pipeline}: start {self.starts} hung for {START_TIMEOUT:.0f}s"
                )
            pendingTimed = [i for i in timed if i not in done]
            if pendingTimed and count - mark >= segment[pendingTimed[0]].afterBatches:
                event = segment[pendingTimed[0]]
                if dueAt is None:
                    dueAt = time.monotonic() + event.jitterSeconds
                if time.monotonic() >= dueAt:
                    if self._deliver(event, child.pid):
                        done.add(pendingTimed[0])
                        mark = self._sawCommits()
                    dueAt = None
            time.sleep(0.1)

    def _deliver(self, event: Event, session: int) -> bool:
        """Deliver a timed kill; False when there was nothing to kill yet (try again)."""
        now = time.monotonic()
        if event.kind == "driver":
            killSession(session)
        elif event.kind == "executor":
            pids = executorPids(session)
            if not pids:
                return False
            os.kill(self.rng.choice(pids), signal.SIGKILL)
        else:
            self.services.crash(event.kind, event.downSeconds)
        self.kills.append(Kill(event, now))
        self.log(f"[chaos] {event.describe()}: delivered")
        return True

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
            if code == 0:
                break
        self._recoveryTimes()
        report = self.verify(self.spec)
        return ChaosResult(
            seed=self.schedule.seed,
            pipeline=self.spec.pipeline,
            kills=self.kills,
            starts=self.starts,
            failedStarts=self.failedStarts,
            batches=batchesDone(self.checkpoint),
            records=int(report.actualRows),
            missing=int(report.missing),
            duplicated=int(report.duplicated),
            unexpected=int(report.unexpected),
            seconds=time.monotonic() - began,
            report=str(report),
            skipped=self.skipped + pending,
        )

    def _recoveryTimes(self) -> None:
        """For each kill: seconds until the next batch was committed after it."""
        for kill in self.kills:
            before = max((n for t, n in self.commitTimes if t <= kill.at), default=0)
            after = next((t for t, n in self.commitTimes if t > kill.at and n > before), None)
            kill.recoverySeconds = None if after is None else after - kill.at


def _epoch() -> float:
    """Offset between the wall clock (file times) and ``time.monotonic()``."""
    return time.time() - time.monotonic()


def summaryTable(results: list[ChaosResult]) -> str:
    """The soak's Markdown table: kills by kind, batches, records, lost, duplicated, recovery."""
    kinds = ["driver", "executor", "broker", "postgres", "s3", "mariadb"]
    kinds += ["driver point", "task point"]
    head = ["pipeline", "seed", *kinds, "kills", "starts", "batches", "records"]
    head += ["lost", "duplicated", "unexpected", "longest recovery s", "minutes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        byKind = r.killsByKind()
        row = [r.pipeline, str(r.seed), *(str(byKind.get(k, 0)) for k in kinds)]
        row += [str(len(r.kills)), str(r.starts), str(r.batches), f"{r.records:,}"]
        row += [str(r.missing), str(r.duplicated), str(r.unexpected)]
        row += [f"{r.longestRecovery():.1f}", f"{r.seconds / 60:.1f}"]
        lines.append("| " + " | ".join(row) + " |")
    total = Counter[str]()
    for r in results:
        total.update(r.killsByKind())
    row = ["**all**", "", *(str(total.get(k, 0)) for k in kinds)]
    row += [str(sum(len(r.kills) for r in results)), str(sum(r.starts for r in results))]
    row += [str(sum(r.batches for r in results)), f"{sum(r.records for r in results):,}"]
    row += [str(sum(r.missing for r in results)), str(sum(r.duplicated for r in results))]
    row += [str(sum(r.unexpected for r in results))]
    row += [f"{max((r.longestRecovery() for r in results), default=0):.1f}"]
    row += [f"{sum(r.seconds for r in results) / 60:.1f}"]
    lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def resultJson(result: ChaosResult) -> dict[str, Any]:
    return {
        "seed": result.seed,
        "pipeline": result.pipeline,
        "kills": {k: v for k, v in result.killsByKind().items()},
        "starts": result.starts,
        "failedStarts": result.failedStarts,
        "batches": result.batches,
        "records": result.records,
        "missing": result.missing,
        "duplicated": result.duplicated,
        "unexpected": result.unexpected,
        "longestRecoverySeconds": round(result.longestRecovery(), 2),
        "seconds": round(result.seconds, 1),
        "events": [k.event.describe() for k in result.kills],
    }
