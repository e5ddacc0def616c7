"""The seeded schedule of a chaos run: which faults hit a pipeline, in which order, and when.

A :class:`Schedule` is a list of events drawn from one seed (printed, so a failing seed replays
the same schedule):

- a *protocol point* (``task.afterWrite``, ``driver.afterDecision`` ...): armed through
  ``TWOPHASE_CRASH_AT`` when the query starts, so that exact step SIGKILLs its process
  (PROTOCOL.md section 5); numbered points are armed for the batch ``afterBatches`` after the
  start's first one;
- an *outage*: a protocol point whose kill keeps the query down for ``downSeconds`` before the
  next start, for pipelines with an ``outageSeconds`` (``multi``: longer than its Kafka target's
  transaction timeout, so the broker aborts the transactions of a decided batch and the restart
  must write them again, while PostgreSQL keeps its prepared half of the same batch);
- a *timed kill* of the ``driver`` (the query's whole session), an ``executor`` JVM or one of
  the pipeline's servers (``servers.SERVERS``: brought back after ``downSeconds``), delivered
  once the running query has committed ``afterBatches`` more batches, plus ``jitterSeconds`` so
  it lands inside a batch rather than between two.

Drawing is pure: the same seed, pipeline name, kills, servers and outage give the same events.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

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
PROCESS_KINDS = ("driver", "executor")
"""Timed kills of the query's own processes; every other kind is a server's."""


@dataclass(frozen=True)
class Event:
    """One fault: a protocol point or a timed kill (see the module docstring)."""

    kind: str  # "point", "driver", "executor", or a server's kind ("broker", "postgres", ...)
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
    def draw(
        cls,
        seed: int,
        pipeline: str,
        kills: int,
        *,
        coverPoints: bool,
        servers: Sequence[str] = (),
        outageSeconds: float = 0.0,
    ) -> Schedule:
        """``kills`` events for ``pipeline``, whose servers are ``servers``: with
        ``coverPoints`` every protocol point first (and an outage, when ``outageSeconds``);
        then one timed kill of each kind the pipeline has (driver, executor, its servers), in
        seeded order, all of them with ``coverPoints`` even past ``kills``; then seeded random
        events (a random ``driver.afterDecision`` is an outage three times in ten)."""
        rng = random.Random(f"{seed}:{pipeline}")
        timedKinds = [*PROCESS_KINDS, *servers]
        events: list[Event] = []
        if coverPoints:
            events += [Event("point", p, rng.randint(0, 1)) for p in TASK_POINTS + DRIVER_POINTS]
            if outageSeconds:
                events.append(Event("point", "driver.afterDecision", downSeconds=outageSeconds))
        queue = rng.sample(timedKinds, len(timedKinds))
        while len(events) < kills or (coverPoints and queue):
            kind = queue.pop(0) if queue else rng.choice([*timedKinds, "executor", "point"])
            if kind == "point":
                point = rng.choice(RANDOM_POINTS)
                outage = outageSeconds > 0 and point == "driver.afterDecision"
                down = outageSeconds if outage and rng.random() < 0.3 else 0.0
                events.append(Event("point", point, rng.randint(0, 2), downSeconds=down))
                if point == "driver.afterDecision" and rng.random() < 0.5:
                    events.append(Event("point", "driver.duringRecovery"))
                continue
            down = round(rng.uniform(0.5, 4.0), 1) if kind not in PROCESS_KINDS else 0.0
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
