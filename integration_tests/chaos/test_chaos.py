"""The bounded chaos profile of ``make test``: every pipeline killed at least ten times.

Pipelines ``multi`` (sequence -> PostgreSQL, Kafka, a Delta and an Iceberg table and Parquet
files under one decision: every protocol point of the five sinks in one schedule, the
batch-completion point of the table commits included, the PostgreSQL target with prepared and
staged partitions in every batch),
``s3`` (sequence -> files on the S3 server, by multipart upload), ``mariadb`` (sequence ->
twophase.sql, XA transactions) and ``kafka-avro`` (Kafka -> Kafka with Avro values through the
schema registry on both sides); ``multi``'s PostgreSQL and ``mariadb`` over TLS as roles that
are not superusers. The sink pipelines first go
through every protocol point of PROTOCOL.md section 5 (three task points in one start, then one
start per driver point), then through seeded kills of the driver, an executor and each server
they write to; the multi pipeline also goes down after a decision for longer than its Kafka
target's transaction timeout (the broker aborts the decided transactions; the restart writes
them again, PostgreSQL's prepared half waits). Kafka -> Kafka gets random kills only.

They run two at a time (``PAIRS``), each pair side by side on servers of its own, as
``make chaos PARALLEL=2`` would.

Every pipeline also gets one fault beyond kills of each kind that reaches it
(``setup.faultTargets``), at seeded places among the timed kills: a frozen server, a partition,
a slow link and lost replies of one of its servers through the proxies of
``services/toxiproxy.sh``, a full disk under its checkpoint (a tmpfs), and for the Kafka
pipelines the broker cut off for longer than the transaction timeout while the query runs.

The ``files`` (local rename), ``postgres``, ``kafka``, ``kafka-kafka``, ``delta`` and
``iceberg`` pipelines stay in ``make chaos``'s soak: ``multi`` covers their sinks (its
``archive`` target is the files sink committing by rename), ``s3`` the files sink on S3, and
``kafka-avro`` the Kafka source and sink of ``kafka-kafka``.
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
RANDOM_KILLS = 3
"""Random kills after the nine protocol points (sinks); Kafka -> Kafka gets ten."""
PAIRS = (("multi", "mariadb"), ("kafka-avro", "s3"))
"""The pipelines of the bounded profile, two side by side: ``multi`` covers the postgres and
kafka sinks, ``mariadb`` the sql sink's XA transactions (with kills of the MariaDB server).
The two of a pair share no server, so neither's kills and faults reach the other; side by side
they take about two thirds of the time one after the other on two cores."""


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("pair", PAIRS, ids="+".join)
def test_bounded_chaos_is_exactly_once(
    pair: tuple[str, str],
    pg_url: str,
    kafka_bootstrap: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    first, second = (set(PIPELINES[name].servers) for name in pair)
    assert not first & second, f"{pair} share {first & second}: their kills would meet"
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
            log=pipelineLog(pipeline),
        )

    with ThreadPoolExecutor(len(pair)) as pool:
        results = list(pool.map(run, pair))
    print(summaryTable(results) + "\n\n" + livenessTable(results))
    for result in results:
        assertBounded(result, tmp_path / result.pipeline)


def assertBounded(result: ChaosResult, workdir: Path) -> None:
    """Exactly once, every protocol point fired (sinks), at least ten kills, every fault kind
    that reaches the pipeline delivered, every failure classified as recoverable, and every
    clean stop leaving nothing in doubt."""
    pipeline = result.pipeline
    where = f"(seed {SEED}, logs in {workdir})"
    assert result.ok, f"{pipeline} is not exactly-once {where}: {result.report}"
    assert not result.fatal, f"failures classified as fatal {where}: {result.fatal}"
    stops = [k for k in result.kills if k.event.kind == "stop"]
    assert stops, f"no clean stop {where}"
    assert all(k.checked == "status 0, doctor 0" for k in stops), [k.checked for k in stops]
    assert len(result.kills) - result.faultCount() >= 10, f"too few kills delivered {where}"
    kinds = faultTargets(pipeline, proxies=True, disk=Disk.possible())
    delivered = {k.event.kind for k in result.kills if k.event.isFault}
    assert delivered >= set(kinds), f"faults not delivered {where}: {set(kinds) - delivered}"
    if pipeline != "kafka-avro":
        fired = {k.event.point for k in result.kills if k.event.kind == "point"}
        points = set(TASK_POINTS + DRIVER_POINTS)
        if PIPELINES[pipeline].completesBatches:
            points |= set(COMPLETION_POINTS)
        assert fired >= points, f"not fired: {where}" + str(sorted(points - fired))
    if PIPELINES[pipeline].outageSeconds:
        outages = [k for k in result.kills if k.event.downSeconds and k.event.kind == "point"]
        assert outages, f"no outage longer than the transaction timeout {where}"
        rewrites = list(workdir.rglob("batch-*.rewrite.json"))
        assert rewrites, f"the outage left no partition to write again {where}"
    assert result.records > 0
