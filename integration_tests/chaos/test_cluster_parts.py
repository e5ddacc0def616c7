"""The cluster runner's parts that need no cluster: addresses, schedules, the table."""

from __future__ import annotations

import json
from dataclasses import asdict

from integration_tests.chaos.cluster import IN_CLUSTER, PROCESS_KINDS, batchesNeeded, inCluster
from integration_tests.chaos.faultkinds import NODE_KINDS
from integration_tests.chaos.pipelines import PIPELINES
from integration_tests.chaos.report import ChaosResult, Kill, summaryTable
from integration_tests.chaos.runner import ChaosRun
from integration_tests.chaos.schedule import Event
from integration_tests.chaos.setup import drawSchedule, faultTargets
from integration_tests.chaos.spec import PipelineSpec


def test_a_spec_for_a_driver_container_names_the_servers_by_service() -> None:
    spec = PipelineSpec(
        "multi",
        "/tmp/w",
        rows=10,
        rowsPerBatch=5,
        pgUrl="postgresql://twophase:twophase@127.0.0.1:5432/twophase",
        bootstrap="127.0.0.1:9092",
        sqlUrl="mysql+pymysql://twophase:twophase@127.0.0.1:3306/twophase",
        sinkOptions={"fs.endpoint_url": "http://127.0.0.1:7070"},
    )
    child = PipelineSpec(**json.loads(inCluster(json.dumps(asdict(spec)))))
    assert child.pgUrl == "postgresql://twophase:twophase@postgres:5432/twophase"
    assert child.bootstrap == "kafka:19092"
    assert child.sqlUrl == "mysql+pymysql://twophase:twophase@mariadb:3306/twophase"
    assert child.sinkOptions == {"fs.endpoint_url": "http://s3:7070"}
    assert not any(published in json.dumps(asdict(child)) for published in IN_CLUSTER)


def clusterSchedule(pipeline: str) -> list[Event]:
    """As ``test_cluster_chaos`` draws it: one timed kill of each kind (an executor, each of
    the pipeline's servers)."""
    targets = faultTargets(pipeline, proxies=False, disk=False, cluster=True)
    return drawSchedule(
        pipeline,
        7,
        1 + len(PIPELINES[pipeline].servers),
        coverPoints=False,
        targets=targets,
        coverFaults=True,
        processKinds=PROCESS_KINDS,
    ).events


def test_a_cluster_schedule_has_every_node_fault_and_loses_its_driver_only_as_a_node() -> None:
    events = clusterSchedule("multi")
    kinds = [e.kind for e in events]
    assert set(NODE_KINDS) <= set(kinds)
    assert "driver" not in kinds  # the cluster's driver is lost as a node (its container)
    assert {"executor", "postgres", "broker", "s3", "freeze"} <= set(kinds)
    one = faultTargets("multi", proxies=True, disk=True)
    assert not set(one) & set(NODE_KINDS), "a run on one machine has no node faults"


def test_a_lost_or_second_driver_ends_the_start() -> None:
    lost = Event("driver lost", target="driver")
    second = Event("second driver", target="driver")
    worker = Event("worker lost", target="spark-worker-1")
    assert ChaosRun.segment([worker, lost, worker]) == [worker, lost]
    assert ChaosRun.segment([second, worker]) == [second]


def test_the_source_outlasts_the_faults_that_last_seconds() -> None:
    from integration_tests.chaos.schedule import Schedule

    frozen = Event("worker frozen", downSeconds=45.0, target="spark-worker-1")
    schedule = Schedule(1, "kafka", [frozen, Event("second driver", target="driver")])
    assert batchesNeeded(schedule) >= schedule.batchesNeeded() + 23 + 20


def result(kills: list[Kill]) -> ChaosResult:
    return ChaosResult(1, "kafka", kills, 1, 0, 5, 500, 0, 0, 0, 60.0, "")


def test_the_node_columns_show_only_for_a_run_on_the_cluster() -> None:
    one = summaryTable([result([Kill(Event("executor"), 0.0)])]).splitlines()[0]
    assert "executor" in one and not any(kind in one for kind in NODE_KINDS)
    lost = Kill(Event("worker lost", target="spark-worker-2"), 0.0)
    cluster = summaryTable([result([lost])]).splitlines()[0]
    assert all(f"| {kind} |" in cluster for kind in NODE_KINDS)
