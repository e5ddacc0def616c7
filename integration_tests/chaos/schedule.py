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
- a *clean stop* (``stop``): SIGTERM to the driver, timed like a kill: the supervised query
  lets its running batch commit and stops before the next, leaving nothing in doubt; once in
  each schedule, among the timed kills of each kind;
- a *timed kill* of the ``driver`` (the query's whole session), an ``executor`` JVM or one of
  the pipeline's servers (``servers.SERVERS``: brought back after ``downSeconds``), delivered
  once the running query has committed ``afterBatches`` more batches, plus ``jitterSeconds`` so
  it lands inside a batch rather than between two;
- a *fault* beyond kills (``faultkinds.FAULT_KINDS``: a frozen server, a partition, a slow
  link, lost replies, a full disk, the broker gone past the transaction timeout), timed like a
  kill, lasting ``downSeconds`` while the query keeps running, then healed.

Drawing is pure: the same seed, pipeline name, kills, faults, servers and outage give the same
events; faults are drawn from a stream of their own, so ``faults=0`` gives the kills alone.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from integration_tests.chaos.faultkinds import FAULT_KINDS
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
COMPLETION_POINTS = ["driver.beforeCompleteBatch"]
"""Points only a sink that completes a batch in one step (``Committer.completeBatch``) has
apart from its other points: its pipelines cover them too (``Pipeline.completesBatches``)."""
RANDOM_POINTS = [p for p in faults.POINTS if p not in UNNUMBERED and p not in COMPLETION_POINTS]
"""Points a random event may draw; ``driver.duringRecovery`` only follows a crash that leaves
a decided batch to recover (``driver.afterDecision``), else it would have nothing to fire in."""
PROCESS_KINDS = ("driver", "executor", "stop")
"""Timed events of the query's own processes (``stop``: SIGTERM to the driver, which stops the
query cleanly); every other kind is a server's."""
UPGRADED = "upgraded"
"""A start by the previous release (``integration_tests.releases``), killed like the driver
after its batches: the next start is this release's, an upgrade from a killed query."""
ENDS_START = frozenset({"driver", "driver lost", "second driver", "stop", UPGRADED})
"""Timed events after which the running start's driver is gone: each ends a segment."""
FAULT_SECONDS = {
    "freeze": (2.0, 8.0),
    "partition": (2.0, 8.0),
    "slow": (3.0, 10.0),
    "reply lost": (2.0, 5.0),
    "disk full": (2.0, 6.0),
    "worker lost": (3.0, 10.0),
    "worker frozen": (40.0, 50.0),
    "worker cut off": (8.0, 20.0),
    "driver lost": (1.0, 5.0),
    "second driver": (5.0, 15.0),
}
"""How long a fault of each kind lasts (seconds, drawn between the two); ``past timeout``
lasts the pipeline's own bound, past its Kafka transaction timeout. A frozen worker stays
paused past the cluster's ``spark.network.timeout`` (``cluster.SPARK_CONF``); ``driver lost``
keeps the query down that long before a new driver; a ``second driver`` runs beside the first
that long before the first is given up."""


@dataclass(frozen=True)
class Event:
    """One event: a protocol point, a timed kill or a fault (see the module docstring)."""

    kind: str  # "point", "driver", "executor", a server's kind ("broker", ...) or a fault kind
    point: str = ""
    afterBatches: int = 0
    jitterSeconds: float = 0.0
    downSeconds: float = 0.0
    target: str = ""
    """A fault's target: a server's kind, or ``faultkinds.DISK``."""

    @property
    def isFault(self) -> bool:
        return self.kind in FAULT_KINDS

    def describe(self) -> str:
        if self.kind == "point":
            down = f", down {self.downSeconds:.0f}s" if self.downSeconds else ""
            return f"{self.point} (+{self.afterBatches} batches){down}"
        when = f"after {self.afterBatches} batches + {self.jitterSeconds:.2f}s"
        if self.kind == "stop":
            return f"stop cleanly (SIGTERM to the driver) {when}"
        if self.kind == UPGRADED:
            return f"a start by the previous release, its driver killed {when}"
        if self.isFault:
            return f"{self.kind} of {self.target} {when}, for {self.downSeconds:.1f}s"
        extra = f", down {self.downSeconds:.1f}s" if self.downSeconds else ""
        return f"kill {self.kind} {when}{extra}"


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
        faults: int = 0,
        faultTargets: Mapping[str, Sequence[str]] | None = None,
        pastTimeoutSeconds: float = 0.0,
        coverFaults: bool | None = None,
        coverTargets: bool = False,
        extraPoints: Sequence[str] = (),
        processKinds: Sequence[str] = PROCESS_KINDS,
        upgrades: int = 0,
    ) -> Schedule:
        """``kills`` events for ``pipeline``, whose servers are ``servers``: with
        ``coverPoints`` every protocol point and ``extraPoints`` first (and an outage, when
        ``outageSeconds``);
        then one timed kill of each kind the pipeline has (driver, executor, its servers), in
        seeded order, all of them with ``coverPoints`` even past ``kills``; then seeded random
        events (a random ``driver.afterDecision`` is an outage three times in ten).

        Then ``faults`` faults of the kinds in ``faultTargets`` (kind -> what it may hit),
        with ``coverFaults`` (default: ``coverPoints``) one of each kind first, even past
        ``faults`` (with ``coverTargets``: one of each kind on each server it may hit), each
        put at a seeded place among the timed events (after the protocol points); a ``past
        timeout`` lasts ``pastTimeoutSeconds``. Then ``upgrades`` starts by the
        previous release, at seeded places among the timed events, from a stream of their
        own (so ``upgrades=0`` changes nothing else)."""
        rng = random.Random(f"{seed}:{pipeline}")
        timedKinds = [*processKinds, *servers]
        events: list[Event] = []
        if coverPoints:
            events += [
                Event("point", p, rng.randint(0, 1))
                for p in [*TASK_POINTS, *DRIVER_POINTS, *extraPoints]
            ]
            if outageSeconds:
                events.append(Event("point", "driver.afterDecision", downSeconds=outageSeconds))
        queue = rng.sample(timedKinds, len(timedKinds))
        while len(events) < kills or (coverPoints and queue):
            drawn = [k for k in timedKinds if k != "stop"]  # a stop: once, from the queue
            kind = queue.pop(0) if queue else rng.choice([*drawn, "executor", "point"])
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
        if faultTargets:
            timedFrom = next((i for i, e in enumerate(events) if e.kind != "point"), len(events))
            drawn = drawFaults(
                random.Random(f"{seed}:{pipeline}:faults"),
                faults,
                faultTargets,
                cover=coverPoints if coverFaults is None else coverFaults,
                pastTimeoutSeconds=pastTimeoutSeconds,
                coverTargets=coverTargets,
            )
            frng = random.Random(f"{seed}:{pipeline}:fault-places")
            for fault in drawn:
                events.insert(frng.randint(timedFrom, len(events)), fault)
        urng = random.Random(f"{seed}:{pipeline}:upgrades")
        timedFrom = next((i for i, e in enumerate(events) if e.kind != "point"), len(events))
        for _ in range(upgrades):
            upgrade = Event(UPGRADED, afterBatches=urng.randint(1, 2), jitterSeconds=0.5)
            events.insert(urng.randint(timedFrom, len(events)), upgrade)
        return cls(seed, pipeline, events)

    def faultsByKind(self) -> dict[str, int]:
        return {k: sum(1 for e in self.events if e.kind == k) for k in FAULT_KINDS}

    def batchesNeeded(self) -> int:
        """Enough batches that the source is not drained before the last event."""
        return 2 * sum(e.afterBatches + 1 for e in self.events) + 6


def drawFaults(
    rng: random.Random,
    count: int,
    targets: Mapping[str, Sequence[str]],
    *,
    cover: bool,
    pastTimeoutSeconds: float,
    coverTargets: bool = False,
) -> list[Event]:
    """``count`` faults of the kinds in ``targets`` (with ``cover``: each kind once first, even
    past ``count``; with ``coverTargets`` too, each kind on each of its targets), each on a
    seeded target of its kind."""
    kinds = [k for k in FAULT_KINDS if targets.get(k)]
    if not kinds:
        return []
    pairs: list[tuple[str, str | None]] = (
        [(k, t) for k in kinds for t in targets[k]] if coverTargets else [(k, None) for k in kinds]
    )
    order = rng.sample(pairs, len(pairs)) if cover else []
    drawn: list[Event] = []
    while len(drawn) < count or order:
        kind, target = order.pop(0) if order else (rng.choice(kinds), None)
        low, high = FAULT_SECONDS.get(kind, (pastTimeoutSeconds, pastTimeoutSeconds))
        drawn.append(
            Event(
                kind,
                afterBatches=rng.randint(0, 2),
                jitterSeconds=round(rng.uniform(0.0, 1.2), 2),
                downSeconds=round(rng.uniform(low, high), 1),
                target=rng.choice(list(targets[kind])) if target is None else target,
            )
        )
    return drawn
