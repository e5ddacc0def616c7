"""One chaos pipeline end to end: its schedule drawn, its input and output made, run, verified.

What differs between pipelines (the table or topics, the servers to kill, the check) is asked
of the pipeline's module (``pipelines/``); this module only puts the steps in order, and says
which faults beyond kills reach a pipeline (``faultTargets``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from integration_tests.chaos.cluster import PROCESS_KINDS as CLUSTER_PROCESS_KINDS
from integration_tests.chaos.cluster import Cluster, ClusterRun, place
from integration_tests.chaos.cluster import batchesNeeded as clusterBatches
from integration_tests.chaos.faultkinds import DISK, Disk
from integration_tests.chaos.pipelines import PIPELINES, Pipeline
from integration_tests.chaos.pipelines.kafka import BROKER_ABORT_SWEEP_SECONDS
from integration_tests.chaos.reader import LiveReader
from integration_tests.chaos.report import ChaosResult
from integration_tests.chaos.runner import ChaosRun
from integration_tests.chaos.schedule import COMPLETION_POINTS, PROCESS_KINDS, Schedule
from integration_tests.chaos.servers import Services, servicesFromEnvironment
from integration_tests.chaos.spec import PipelineSpec
from twophase.cli.console import LiveDisplay

PAST_TIMEOUT_MARGIN_SECONDS = 3
"""A ``past timeout`` fault lasts the pipeline's transaction timeout, one abort sweep of the
broker (``pipelines.kafka.BROKER_ABORT_SWEEP_SECONDS``) and this margin."""

__all__ = [
    "drawSchedule",
    "faultTargets",
    "pipelineLog",
    "prepare",
    "runPipeline",
    "servicesFromEnvironment",
    "verifyOutput",
]


def pipelineLog(pipeline: str) -> Callable[[str], None]:
    """Print the runner's lines of ``pipeline`` with its name, for pipelines side by side."""

    def log(line: str) -> None:
        print(line.replace("[chaos]", f"[chaos {pipeline}]", 1), flush=True)

    return log


def pipelineNamed(name: str) -> Pipeline:
    """The pipeline called ``name``; exit naming the known ones when there is none."""
    if name not in PIPELINES:
        raise SystemExit(f"unknown pipeline {name!r}; one of {', '.join(PIPELINES)}")
    return PIPELINES[name]


def faultTargets(
    pipeline: str, *, proxies: bool, disk: bool, cluster: bool = False
) -> dict[str, tuple[str, ...]]:
    """Which faults beyond kills reach ``pipeline``, and what each may hit: a freeze any of its
    servers; with ``proxies`` (its clients go through them) a partition, a slow link or lost
    replies any of them, and ``past timeout`` its broker when it writes Kafka transactions;
    with ``disk`` (a tmpfs under its checkpoint) a full disk; with ``cluster`` (it runs on the
    compose cluster) the faults of its nodes."""
    p = pipelineNamed(pipeline)
    targets: dict[str, tuple[str, ...]] = {"freeze": p.servers}
    if cluster:
        from integration_tests.chaos.cluster import nodeTargets

        targets.update(nodeTargets())
    if proxies:
        targets.update({"partition": p.servers, "slow": p.servers, "reply lost": p.servers})
        if p.kafkaTimeoutSeconds and "broker" in p.servers:
            targets["past timeout"] = ("broker",)
    if disk:
        targets["disk full"] = (DISK,)
    return {kind: servers for kind, servers in targets.items() if servers}


def drawSchedule(
    pipeline: str,
    seed: int,
    kills: int,
    *,
    coverPoints: bool,
    faults: int = 0,
    targets: dict[str, tuple[str, ...]] | None = None,
    coverFaults: bool | None = None,
    coverTargets: bool = False,
    processKinds: tuple[str, ...] = PROCESS_KINDS,
    upgrades: int = 0,
) -> Schedule:
    """The seeded schedule of ``pipeline``: its servers' kills, its outages if it has any,
    ``faults`` faults of the kinds in ``targets`` (see ``faultTargets``) and ``upgrades``
    starts by the previous release; ``processKinds``: the timed kills of its own processes."""
    p = pipelineNamed(pipeline)
    return Schedule.draw(
        seed,
        pipeline,
        kills,
        coverPoints=coverPoints,
        servers=p.servers,
        outageSeconds=p.outageSeconds,
        faults=faults,
        faultTargets=targets,
        pastTimeoutSeconds=(
            p.kafkaTimeoutSeconds + BROKER_ABORT_SWEEP_SECONDS + PAST_TIMEOUT_MARGIN_SECONDS
        ),
        coverFaults=coverFaults,
        coverTargets=coverTargets,
        extraPoints=COMPLETION_POINTS if p.completesBatches else (),
        processKinds=processKinds,
        upgrades=upgrades,
    )


def prepare(
    pipeline: str, workdir: Path, services: Services, rows: int, perBatch: int
) -> PipelineSpec:
    """The spec of a fresh run of ``pipeline``: its own table or topics, ``rows`` of input."""
    spec = PipelineSpec(pipeline, str(workdir), rows=rows, rowsPerBatch=perBatch)
    pipelineNamed(pipeline).prepare(spec, services)
    return spec


def liveReport(spec: PipelineSpec, reader: LiveReader) -> Any:
    """What the ``read_committed`` reader that followed the run saw, against the source."""
    from twophase import verify

    pipeline = pipelineNamed(spec.pipeline)
    seen = pipeline.liveSeen(spec, reader.finish())
    return verify.compare(pipeline.liveExpected(spec), seen, ("key", "value"))


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
    faults: int = 0,
    coverFaults: bool | None = None,
    coverTargets: bool = False,
    log: Any = print,
    display: LiveDisplay | None = None,
    cluster: Cluster | None = None,
    upgrades: int = 0,
) -> ChaosResult:
    """Draw the schedule, size the input to it, run it, verify. The checkpoint (and the files
    sink's output) lives on a tmpfs of its own when one can be mounted, for ``disk full``;
    what it held is copied back to the same place when it is unmounted. With ``display``, the
    run's progress is a row of it (``progress.PipelineProgress``). With ``cluster``, the
    pipeline runs on the compose cluster (``cluster.ClusterRun``): checkpoint and file outputs
    on S3, the faults of its nodes. ``coverTargets``: every fault kind on each server it may
    hit, not once per kind (``schedule.drawFaults``)."""
    workdir = workdir.resolve()  # executors run elsewhere: every path they see is absolute
    workdir.mkdir(parents=True, exist_ok=True)
    disk = Disk(workdir / "disk") if Disk.possible() and cluster is None else None
    targets = faultTargets(
        pipeline,
        proxies=services.proxies is not None,
        disk=disk is not None,
        cluster=cluster is not None,
    )
    schedule = drawSchedule(
        pipeline,
        seed,
        kills,
        coverPoints=coverPoints,
        faults=faults,
        targets=targets,
        coverFaults=coverFaults,
        coverTargets=coverTargets,
        processKinds=PROCESS_KINDS if cluster is None else CLUSTER_PROCESS_KINDS,
        upgrades=upgrades if cluster is None else 0,
    )
    batches = schedule.batchesNeeded() if cluster is None else clusterBatches(schedule)
    rowsPerBatch = max(rowsPerBatch, pipelineNamed(pipeline).minRowsPerBatch)
    rows = batches * rowsPerBatch
    if disk is not None:
        disk.mount()
    try:
        spec = prepare(pipeline, workdir, services, rows, rowsPerBatch)
        if cluster is not None:
            place(spec, services)
        log(
            f"[chaos] {pipeline}: seed {seed}, {rows} rows in batches of {rowsPerBatch}, "
            "schedule: " + "; ".join(e.describe() for e in schedule.events)
        )
        os.environ.setdefault("TWOPHASE_LOG_LEVEL", "INFO")
        topic = pipelineNamed(pipeline).liveTopic(spec)
        reader = LiveReader(spec.bootstrap, topic).start() if topic else None
        live: list[Any] = []

        def verifyAll(spec: PipelineSpec) -> Any:
            if reader is not None:  # the live reader first: the source is drained
                live.append(liveReport(spec, reader))
            return verifyOutput(spec)

        run = (
            ChaosRun(spec, schedule, services, verifyAll, log, disk=disk, display=display)
            if cluster is None
            else ClusterRun(cluster, spec, schedule, services, verifyAll, log, display=display)
        )
        result = run.run()
        if live:
            result.liveReader = live[0]
            result.report += f"\nread_committed reader during the run: {live[0]}"
            if reader is not None and reader.replaced:
                result.readerReplaced = len(reader.replaced)
                result.report += f"\nthe reader's stuck consumers replaced at: {reader.replaced}"
            if reader is not None and not live[0].ok:
                result.report += f"\nthe reader: {reader.diagnosis()}"
        return result
    finally:
        if disk is not None:  # what it held stays readable: the decision log, Spark's logs
            disk.unmount(keepCopyIn=disk.path)
