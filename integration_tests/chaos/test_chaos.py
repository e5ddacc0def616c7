"""The bounded chaos profile of ``make test``: every pipeline killed at least ten times.

Pipelines ``multi`` (sequence -> PostgreSQL, Kafka, a Delta and an Iceberg table, Parquet
files by local rename and Parquet files on the S3 server by multipart upload, under one
decision: every protocol point of the six sinks in one schedule, the batch-completion point of
the table commits included, the PostgreSQL target with prepared and staged partitions in every
batch), ``mariadb`` (sequence -> twophase.sql, XA transactions) and ``kafka-avro`` (Kafka ->
Kafka with Avro values through the schema registry on both sides, and Spark's own Kafka
source over a second topic into the same sink); ``multi``'s PostgreSQL and
``mariadb`` over TLS as roles that are not superusers. The sink pipelines first go through
every protocol point of PROTOCOL.md section 5 (three task points in one start, then one start
per driver point), then through seeded kills of the driver, an executor and each server they
write to; the multi pipeline also goes down after a decision for longer than its Kafka
target's transaction timeout (the broker aborts the decided transactions; the restart writes
them again, PostgreSQL's prepared half waits). Kafka -> Kafka gets random kills only.

``multi`` and ``mariadb`` run side by side on servers of their own, as ``make chaos
PARALLEL=2`` would; then ``kafka-avro``, whose broker ``multi`` also writes to.

Every pipeline also gets each fault beyond kills that reaches it on each of its servers
(``setup.faultTargets``), at seeded places among the timed kills: a frozen server, a
partition, a slow link and lost replies through the proxies of ``services/toxiproxy.sh``, a
full disk under its checkpoint (a tmpfs), and for the Kafka pipelines the broker cut off for
longer than the transaction timeout while the query runs.

The ``files`` (local rename), ``s3``, ``postgres``, ``kafka``, ``kafka-kafka``, ``delta`` and
``iceberg`` pipelines stay in ``make chaos``'s soak: ``multi`` covers their sinks (its
``archive`` target is the files sink committing by rename, its ``bucket`` the files sink on
S3), and ``kafka-avro`` the Kafka source and sink of ``kafka-kafka``.
The seed is fixed so CI is repeatable; ``TWOPHASE_CHAOS_SEED=<n>`` draws other schedules (the
seed is printed on failure).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from integration_tests.chaos.faultkinds import Disk
from integration_tests.chaos.pipelines import PIPELINES
from integration_tests.chaos.report import ChaosResult, livenessTable, summaryTable
from integration_tests.chaos.schedule import COMPLETION_POINTS, DRIVER_POINTS, TASK_POINTS
from integration_tests.chaos.servers import SERVERS
from integration_tests.chaos.setup import (
    faultTargets,
    pipelineLog,
    runPipeline,
    servicesFromEnvironment,
)

SEED = int(os.environ.get("TWOPHASE_CHAOS_SEED", "20261122"))
REWRITE_LINE = "the replay rewrites lost partitions"
"""What the coordinator logs (``twophase.coordinator.lost``) when it records the rewrite of a
decided batch's partitions the broker aborted."""
RANDOM_KILLS = 3
"""Random kills after the nine protocol points (sinks); Kafka -> Kafka gets ten."""
PAIRS = (("multi", "mariadb"), ("kafka-avro",))
"""The pipelines of the bounded profile, those of a group side by side: ``multi`` covers the
postgres, kafka, delta, iceberg and files sinks (locally and on S3), ``mariadb`` the sql sink's
XA transactions (with kills of the MariaDB server). The pipelines of a group share no server,
so neither's kills and faults reach the other; side by side they take about two thirds of the
time one after the other on two cores. A pipeline of its own costs a start per protocol point:
a sink that can be a target of ``multi`` is one there instead."""


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("pair", PAIRS, ids="+".join)
def test_bounded_chaos_is_exactly_once(
    pair: tuple[str, str],
    pg_url: str,
    kafka_bootstrap: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    for index, name in enumerate(pair):
        for other in pair[index + 1 :]:
            shared = set(PIPELINES[name].servers) & set(PIPELINES[other].servers)
            assert not shared, f"{name} and {other} share {shared}: their kills would meet"
    for name in pair:
        for kind in PIPELINES[name].servers:
            request.getfixturevalue(SERVERS[kind].fixture)  # fails clearly when not running
    services = servicesFromEnvironment()
    assert services.proxies is not None, (
        "no proxies between the query and its servers: `make services` starts them "
        "(services/toxiproxy.sh) and writes TWOPHASE_TOXIPROXY_URL to .services.env"
    )

    def run(pipeline: str) -> ChaosResult:
        cover = pipeline != "kafka-avro"
        return runPipeline(
            pipeline,
            tmp_path / pipeline,
            services,
            seed=SEED,
            kills=len(TASK_POINTS) + len(DRIVER_POINTS) + RANDOM_KILLS if cover else 10,
            rowsPerBatch=100,
            coverPoints=cover,
            coverFaults=True,
            coverTargets=True,
            log=pipelineLog(pipeline),
        )

    with ThreadPoolExecutor(len(pair)) as pool:
        results = list(pool.map(run, pair))
    print(summaryTable(results) + "\n\n" + livenessTable(results))
    for result in results:
        assertBounded(result, tmp_path / result.pipeline)


def assertBounded(result: ChaosResult, workdir: Path) -> None:
    """Exactly once, every protocol point fired (sinks), at least ten kills, every fault kind
    that reaches the pipeline delivered to each server it reaches, every failure classified as
    recoverable, and every clean stop leaving nothing in doubt."""
    pipeline = result.pipeline
    where = f"(seed {SEED}, logs in {workdir})"
    assert result.ok, f"{pipeline} is not exactly-once {where}: {result.report}"
    assert not result.fatal, f"failures classified as fatal {where}: {result.fatal}"
    stops = [k for k in result.kills if k.event.kind == "stop"]
    assert stops, f"no clean stop {where}"
    assert all(k.checked == "status 0, doctor 0" for k in stops), [k.checked for k in stops]
    assert len(result.kills) - result.faultCount() >= 10, f"too few kills delivered {where}"
    kinds = faultTargets(pipeline, proxies=True, disk=Disk.possible())
    wanted = {(kind, target) for kind, targets in kinds.items() for target in targets}
    delivered = {(k.event.kind, k.event.target) for k in result.kills if k.event.isFault}
    assert delivered >= wanted, f"faults not delivered {where}: {sorted(wanted - delivered)}"
    if pipeline != "kafka-avro":
        fired = {k.event.point for k in result.kills if k.event.kind == "point"}
        points = set(TASK_POINTS + DRIVER_POINTS)
        if PIPELINES[pipeline].completesBatches:
            points |= set(COMPLETION_POINTS)
        assert fired >= points, f"not fired: {where}" + str(sorted(points - fired))
    if PIPELINES[pipeline].outageSeconds:
        outages = [k for k in result.kills if k.event.downSeconds and k.event.kind == "point"]
        assert outages, f"no outage longer than the transaction timeout {where}"
        # the log's rewrite records are pruned with their batches, as the run goes on: the
        # coordinator's line when it records one is what lasts
        rewrites = [
            path
            for path in workdir.glob("start-*.log")
            if REWRITE_LINE in path.read_text(errors="replace")
        ]
        assert rewrites, f"the outage left no partition to write again {where}"
    assert result.records > 0
