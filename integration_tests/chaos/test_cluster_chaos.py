"""The bounded chaos profile of the compose cluster (``make test-cluster``): faults of nodes.

Pipelines ``multi`` (sequence -> a PostgreSQL table, a Kafka topic, a Delta table and Parquet
files on S3, one decision) and ``kafka-kafka`` run side by side on the compose cluster, each
start's driver in a container of its own, the executors on the two workers, Spark's checkpoint
and the decision log on the S3 server (``cluster``). Each gets a kill of an executor and of
each of its servers, a freeze of one of them, and every fault of a node once: a worker lost,
frozen past Spark's network timeout and cut off from the servers, the driver lost, and a second
driver on the same checkpoint while the first runs or is paused. Then ``twophase verify`` and
the ``read_committed`` reader that followed each run: nothing lost, nothing twice.

The protocol points are ``make test``'s bounded profile's (one machine); here the cluster's
own ways to fail. Fails, never skips, when the cluster is not up (``make compose-up``).
"""

from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from integration_tests.chaos.cluster import Cluster
from integration_tests.chaos.faultkinds import NODE_KINDS
from integration_tests.chaos.pipelines import PIPELINES
from integration_tests.chaos.report import ChaosResult, livenessTable, summaryTable
from integration_tests.chaos.servers import servicesFromEnvironment
from integration_tests.chaos.setup import pipelineLog, runPipeline

pytestmark = pytest.mark.cluster

SEED = int(os.environ.get("TWOPHASE_CHAOS_SEED", "20261128"))
SIDE_BY_SIDE = ("multi", "kafka-kafka")


@pytest.mark.timeout(3000)
def test_faults_of_nodes_on_the_cluster_are_exactly_once() -> None:
    cluster = Cluster()
    cluster.up()
    services = servicesFromEnvironment(proxies=False)
    assert services.compose and services.s3 is not None, (
        "the servers are not the compose cluster's: `set -a; . services/docker.env; set +a`"
    )
    workdir = cluster.shared / f"bounded-{uuid.uuid4().hex[:8]}"

    def run(pipeline: str) -> ChaosResult:
        return runPipeline(
            pipeline,
            workdir / pipeline,
            services,
            seed=SEED,
            # one timed kill of each kind: an executor, each of its servers
            kills=1 + len(PIPELINES[pipeline].servers),
            rowsPerBatch=100,
            coverPoints=False,
            coverFaults=True,
            log=pipelineLog(pipeline),
            cluster=cluster,
        )

    with ThreadPoolExecutor(len(SIDE_BY_SIDE)) as pool:
        running = [pool.submit(run, pipeline) for pipeline in SIDE_BY_SIDE]
    results = [r.result() for r in running if r.exception() is None]
    print(summaryTable(results) + "\n\n" + livenessTable(results))
    for result in results:
        print(f"\n{result.pipeline}: {result.report}")
    for pipeline, outcome in zip(SIDE_BY_SIDE, running, strict=True):
        if outcome.exception() is not None:
            raise AssertionError(f"{pipeline} did not run to the end") from outcome.exception()
    for result in results:
        where = f"(seed {SEED}, logs in {workdir / result.pipeline})"
        assert result.ok, f"{result.pipeline} is not exactly-once {where}: {result.report}"
        delivered = {k.event.kind for k in result.kills}
        assert delivered >= {*NODE_KINDS, "executor", "freeze"}, (
            f"not delivered {where}: {sorted({*NODE_KINDS, 'executor', 'freeze'} - delivered)}"
        )
        assert result.records > 0
