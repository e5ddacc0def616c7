"""The metrics read from a decision log: Prometheus series, the transaction timeout, the extra.

Spark-free: a real log written by the coordinator, read by ``readSinkMetrics`` and counted into
a registry of the test's own; ``integration_tests/test_metrics.py`` runs the listener on Spark.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from twophase.coordinator import DecisionLog
from twophase.coordinator.description import SinkDescription, writeSinkDescription
from twophase.metrics import readSinkMetrics
from twophase.metrics.prometheus import PrometheusMetrics
from twophase.metrics.reading import timeoutOf
from twophase.protocol import TaskResult

SINK = "s1"


def results(batchId: int, partitions: int = 2) -> list[TaskResult]:
    return [
        TaskResult(
            SINK, "q1", batchId, p, 0, {"txn": f"b{batchId}-p{p}"}, 5, bytes=40, seconds=0.01
        )
        for p in range(partitions)
    ]


def test_each_batch_is_counted_once_and_the_gauges_follow_the_log(tmp_path: Path) -> None:
    url = str(tmp_path / "ckpt" / "twophase" / SINK)
    log = DecisionLog(url)
    for batchId in range(2):
        log.decide(batchId, results(batchId))
        log.markCommitted(batchId, 0.02)
    log.decide(2, results(2, partitions=3))  # decided, never committed
    writeSinkDescription(
        url, SinkDescription(SINK, "x:Y", {"kafka.transaction.timeout.ms": "90000"})
    )
    registry = CollectorRegistry()
    prometheus = PrometheusMetrics.forRegistry(registry)
    assert PrometheusMetrics.forRegistry(registry) is prometheus
    for batchId in (0, 1, 1, 0):  # a repeated event counts nothing again
        prometheus.report(readSinkMetrics(str(tmp_path / "ckpt"), SINK, url, batchId), 0.5)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"sink": SINK, **labels})

    assert sample("twophase_batches_total", outcome="committed") == 2
    assert sample("twophase_rows_total") == 20 and sample("twophase_bytes_total") == 160
    assert sample("twophase_committables_prepared_total") == 4
    assert sample("twophase_committables_success_total") == 4
    assert sample("twophase_commit_seconds_count") == 2
    assert sample("twophase_batch_duration_seconds_sum") == 1.0
    assert sample("twophase_pending_committables") == 3
    assert sample("twophase_decided_uncommitted_batches") == 1
    assert (sample("twophase_last_decided_batch"), sample("twophase_last_committed_batch")) == (
        2,
        1,
    )
    assert sample("twophase_oldest_uncommitted_batch") == 2
    age = sample("twophase_oldest_uncommitted_batch_age_seconds")
    assert age is not None and 0 <= age < 60
    assert sample("twophase_transaction_timeout_seconds") == 90

    log.markCommitted(2, 0.1)
    prometheus.report(readSinkMetrics(str(tmp_path / "ckpt"), SINK, url, 2))
    assert sample("twophase_committables_success_total") == 7
    assert sample("twophase_oldest_uncommitted_batch") == -1
    assert sample("twophase_oldest_uncommitted_batch_age_seconds") == 0


def test_the_transaction_timeout_is_the_shortest_of_the_sinks_options() -> None:
    assert timeoutOf({"topic": "t"}) is None
    assert timeoutOf({"twophase.kafka.transactionTimeoutMs": "60000"}) == 60
    multi = {"a.kafka.transaction.timeout.ms": "30000", "b.kafka.transaction.timeout.ms": "9000"}
    assert timeoutOf(multi) == 9


@pytest.mark.parametrize("call", ["PrometheusMetrics.forRegistry()", "startEndpoint(0)"])
def test_without_the_extra_the_error_names_the_install_command(call: str) -> None:
    code = (
        "import sys\n"
        "sys.modules['prometheus_client'] = None\n"
        "from twophase.metrics.prometheus import PrometheusMetrics, startEndpoint\n"
        f"{call}\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 1
    assert "MetricsExtraMissing" in run.stderr
    assert "pip install 'twophase[metrics]'" in run.stderr
