"""One chaos pipeline end to end: its schedule drawn, its input and output made, run, verified.

What differs between pipelines (the table or topics, the servers to kill, the check) is asked
of the pipeline's module (``pipelines/``); this module only puts the steps in order.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from integration_tests.chaos.pipelines import PIPELINES, Pipeline
from integration_tests.chaos.report import ChaosResult
from integration_tests.chaos.runner import ChaosRun
from integration_tests.chaos.schedule import Schedule
from integration_tests.chaos.servers import Services, servicesFromEnvironment
from integration_tests.chaos.spec import PipelineSpec

__all__ = ["drawSchedule", "prepare", "runPipeline", "servicesFromEnvironment", "verifyOutput"]


def pipelineNamed(name: str) -> Pipeline:
    """The pipeline called ``name``; exit naming the known ones when there is none."""
    if name not in PIPELINES:
        raise SystemExit(f"unknown pipeline {name!r}; one of {', '.join(PIPELINES)}")
    return PIPELINES[name]


def drawSchedule(pipeline: str, seed: int, kills: int, *, coverPoints: bool) -> Schedule:
    """The seeded schedule of ``pipeline``: its servers' kills, its outages if it has any."""
    p = pipelineNamed(pipeline)
    return Schedule.draw(
        seed,
        pipeline,
        kills,
        coverPoints=coverPoints,
        servers=p.servers,
        outageSeconds=p.outageSeconds,
    )


def prepare(
    pipeline: str, workdir: Path, services: Services, rows: int, perBatch: int
) -> PipelineSpec:
    """The spec of a fresh run of ``pipeline``: its own table or topics, ``rows`` of input."""
    spec = PipelineSpec(pipeline, str(workdir), rows=rows, rowsPerBatch=perBatch)
    pipelineNamed(pipeline).prepare(spec, services)
    return spec


def verifyOutput(spec: PipelineSpec) -> Any:
    """Compare what the pipeline's sink holds with what its source offered (``twophase
    verify``'s report; for ``multi``: each target, and the two joined on the id)."""
    return pipelineNamed(spec.pipeline).verify(spec)


def runPipeline(
    pipeline: str,
    workdir: Path,
    services: Services,
    *,
    seed: int,
    kills: int,
    rowsPerBatch: int,
    coverPoints: bool,
    log: Any = print,
) -> ChaosResult:
    """Draw the schedule, size the input to it, run it, verify."""
    schedule = drawSchedule(pipeline, seed, kills, coverPoints=coverPoints)
    workdir = workdir.resolve()  # executors run elsewhere: every path they see is absolute
    workdir.mkdir(parents=True, exist_ok=True)
    rows = schedule.batchesNeeded() * rowsPerBatch
    spec = prepare(pipeline, workdir, services, rows, rowsPerBatch)
    log(
        f"[chaos] {pipeline}: seed {seed}, {rows} rows in batches of {rowsPerBatch}, schedule: "
        + "; ".join(e.describe() for e in schedule.events)
    )
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "INFO")
    return ChaosRun(spec, schedule, services, verifyOutput, log).run()
