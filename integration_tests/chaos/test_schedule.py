"""The seeded schedules' fault cover: once per kind, or once per kind on each of its servers."""

from __future__ import annotations

import random

from integration_tests.chaos.schedule import Schedule, drawFaults
from integration_tests.chaos.setup import drawSchedule, faultTargets

TARGETS = {
    "freeze": ("postgres", "broker", "s3"),
    "slow": ("postgres", "s3"),
    "disk full": ("disk",),
}


def test_cover_gives_each_kind_once_and_cover_targets_each_kind_on_each_server() -> None:
    once = drawFaults(random.Random(1), 0, TARGETS, cover=True, pastTimeoutSeconds=20.0)
    assert sorted(e.kind for e in once) == ["disk full", "freeze", "slow"]
    every = drawFaults(
        random.Random(1), 0, TARGETS, cover=True, pastTimeoutSeconds=20.0, coverTargets=True
    )
    pairs = sorted((e.kind, e.target) for e in every)
    assert pairs == sorted((k, t) for k, targets in TARGETS.items() for t in targets)
    more = drawFaults(
        random.Random(1), 9, TARGETS, cover=True, pastTimeoutSeconds=20.0, coverTargets=True
    )
    assert len(more) == 9 and {(e.kind, e.target) for e in more} >= set(pairs)
    assert drawFaults(random.Random(1), 0, TARGETS, cover=False, pastTimeoutSeconds=20.0) == []


def test_the_bounded_multi_schedule_reaches_every_server_with_every_fault_and_kill() -> None:
    targets = faultTargets("multi", proxies=True, disk=True)
    assert targets["freeze"] == ("postgres", "broker", "s3")
    schedule: Schedule = drawSchedule(
        "multi", 20261122, 12, coverPoints=True, targets=targets, coverFaults=True,
        coverTargets=True,
    )  # fmt: skip
    faults = {(e.kind, e.target) for e in schedule.events if e.isFault}
    assert faults == {(k, t) for k, servers in targets.items() for t in servers}
    kinds = {e.kind for e in schedule.events}
    assert {"driver", "executor", "stop", "postgres", "broker", "s3"} <= kinds
