"""The Prometheus side of the metrics: twophase's counters and gauges, and the driver's endpoint.

Needs ``prometheus_client`` (``pip install 'twophase[metrics]'``). Names follow Flink's
committer metrics where they map (``pendingCommittables`` -> ``twophase_pending_committables``,
``numCommittablesSuccess`` -> ``twophase_committables_success_total``, ...); every series has
the label ``sink``. Counters grow by each batch reported once (``report``); the age of the
oldest batch in doubt is computed when scraped, so it keeps growing while a query is stuck.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from twophase.metrics.reading import SinkMetrics

INSTALL_HINT = "pip install 'twophase[metrics]'"

SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


SERIES = (
    ("batches", "counter", "twophase_batches_total", "Batches reported, by outcome"),
    ("rows", "counter", "twophase_rows_total", "Rows of the decided batches"),
    ("bytes", "counter", "twophase_bytes_total", "Arrow bytes the tasks handed to the writer"),
    ("prepared", "counter", "twophase_committables_prepared_total", "Transactions decided"),
    ("committed", "counter", "twophase_committables_success_total",
     "Transactions committed by their batch's commit (Flink numCommittablesSuccess)"),
    ("alreadyCommitted", "counter", "twophase_committables_already_committed_total",
     "Transactions committed again by a retried commit or recovery "
     "(Flink numCommittablesAlreadyCommitted)"),
    ("failed", "counter", "twophase_committables_failure_total",
     "Decided transactions the participant lost (Flink numCommittablesFailure)"),
    ("retries", "counter", "twophase_committables_retry_total",
     "Commits and aborts retried after transient errors (Flink numCommittablesRetry)"),
    ("aborted", "counter", "twophase_committables_aborted_total",
     "Prepared transactions aborted: failed or duplicate attempts, aborted batches"),
    ("recoveries", "counter", "twophase_recovery_runs_total",
     "Recoveries before a batch that did something"),
    ("recoveryAborted", "counter", "twophase_recovery_transactions_aborted_total",
     "Lingering transactions the recoveries aborted"),
    ("recoveryFinished", "counter", "twophase_recovery_batches_finished_total",
     "Decided batches the recoveries committed"),
    ("prepareSeconds", "histogram", "twophase_prepare_seconds",
     "The slowest task of a batch, beginTransaction to preCommit"),
    ("decisionSeconds", "histogram", "twophase_decision_seconds",
     "Writing a batch's decision record"),
    ("commitSeconds", "histogram", "twophase_commit_seconds",
     "Committing a decided batch's transactions on the driver"),
    ("batchSeconds", "histogram", "twophase_batch_duration_seconds",
     "Spark's duration of a micro-batch (its progress)"),
    ("pending", "gauge", "twophase_pending_committables",
     "Transactions of decided batches not committed yet (Flink pendingCommittables)"),
    ("decidedUncommitted", "gauge", "twophase_decided_uncommitted_batches",
     "Batches decided and not committed yet"),
    ("lastDecided", "gauge", "twophase_last_decided_batch", "The newest decided batch id"),
    ("lastCommitted", "gauge", "twophase_last_committed_batch", "The newest committed batch id"),
    ("oldestBatch", "gauge", "twophase_oldest_uncommitted_batch",
     "The oldest batch in doubt (decided, or planned and undecided); -1 when none"),
    ("oldestAge", "gauge", "twophase_oldest_uncommitted_batch_age_seconds",
     "Seconds since Spark planned the oldest batch in doubt; 0 when none"),
    ("timeout", "gauge", "twophase_transaction_timeout_seconds",
     "The participant's transaction timeout (Kafka's transaction.timeout.ms)"),
    ("restarts", "counter", "twophase_restarts_total",
     "Restarts of a supervised query (twophase.supervise), by the failure's code"),
)  # fmt: skip
"""Every series: its key in ``PrometheusMetrics.series``, kind, name and help text."""

_LABELS = {"batches": ("sink", "outcome"), "restarts": ("query", "reason")}
"""The labels of the series that have other labels than ``sink``."""

COUNTED = ("rows", "bytes", "prepared", "committed", "alreadyCommitted", "failed", "retries",
           "aborted")  # fmt: skip
"""The counters that grow by the ``BatchFigures`` field of the same name."""

TIMED = ("prepareSeconds", "decisionSeconds", "commitSeconds")
"""The histograms that observe the ``BatchFigures`` field of the same name."""


class MetricsExtraMissing(ImportError):
    """``prometheus_client`` is not installed: the message names the extra that brings it."""


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise MetricsExtraMissing(
            "twophase's Prometheus endpoint needs prometheus_client, which is not installed: "
            f"{INSTALL_HINT}"
        ) from exc
    return prometheus_client


class PrometheusMetrics:
    """twophase's series in one Prometheus registry; ``report`` feeds them, thread-safe.

    ``registry``: a ``prometheus_client.CollectorRegistry``; by default the client's global
    one (so the application's own series share the endpoint). One instance per registry:
    ``forRegistry`` returns it.
    """

    _instances: dict[int, PrometheusMetrics] = {}
    _lock = threading.Lock()

    @classmethod
    def forRegistry(cls, registry: Any = None) -> PrometheusMetrics:
        client = _client()
        registry = registry if registry is not None else client.REGISTRY
        with cls._lock:
            found = cls._instances.get(id(registry))
            if found is None:
                found = cls._instances[id(registry)] = cls(client, registry)
            return found

    def __init__(self, client: Any, registry: Any) -> None:
        self.registry = registry
        self._lock = threading.Lock()
        self._reported: dict[str, int] = {}
        self._since: dict[str, datetime | None] = {}
        self.series: dict[str, Any] = {}
        for key, kind, name, doc in SERIES:
            labels = _LABELS.get(key, ("sink",))
            if kind == "histogram":
                made = client.Histogram(
                    name, doc, labels, buckets=SECONDS_BUCKETS, registry=registry
                )
            else:
                made = getattr(client, kind.capitalize())(name, doc, labels, registry=registry)
            self.series[key] = made

    def report(self, metrics: SinkMetrics, batchSeconds: float | None = None) -> None:
        """Take one sink's reading: gauges set, counters grown by a batch not reported before."""
        sink = metrics.sinkId
        with self._lock:
            self._gauges(metrics)
            batch = metrics.batch
            if batch is None or batch.batchId <= self._reported.get(sink, -1):
                return
            self._reported[sink] = batch.batchId
        series = self.series
        series["batches"].labels(sink, batch.outcome).inc()
        for key in COUNTED:
            value = getattr(batch, key)
            if value:
                series[key].labels(sink).inc(value)
        for key in TIMED:
            seconds = getattr(batch, key)
            if seconds is not None:
                series[key].labels(sink).observe(seconds)
        if batchSeconds is not None:
            series["batchSeconds"].labels(sink).observe(batchSeconds)
        if batch.recovery is not None:
            series["recoveries"].labels(sink).inc(batch.recovery.runs)
            series["recoveryAborted"].labels(sink).inc(batch.recovery.transactionsAborted)
            series["recoveryFinished"].labels(sink).inc(len(batch.recovery.batchesFinished))

    def restarted(self, query: str, reason: str) -> None:
        """One restart of supervised query ``query`` after a failure of code ``reason``."""
        self.series["restarts"].labels(query, reason).inc()

    def _gauges(self, metrics: SinkMetrics) -> None:
        sink, series = metrics.sinkId, self.series
        series["pending"].labels(sink).set(metrics.pendingCommittables)
        series["decidedUncommitted"].labels(sink).set(metrics.decidedUncommittedBatches)
        for key, value in (
            ("lastDecided", metrics.lastDecided),
            ("lastCommitted", metrics.lastCommitted),
            ("timeout", metrics.transactionTimeoutSeconds),
        ):
            if value is not None:
                series[key].labels(sink).set(value)
        doubt = metrics.oldestInDoubt
        series["oldestBatch"].labels(sink).set(-1 if doubt is None else doubt.batchId)
        if sink not in self._since:
            series["oldestAge"].labels(sink).set_function(lambda: self._age(sink))
        self._since[sink] = None if doubt is None else doubt.since

    def _age(self, sink: str) -> float:
        since = self._since.get(sink)
        return 0.0 if since is None else max(0.0, (datetime.now(UTC) - since).total_seconds())


_servers: dict[tuple[str, int], Any] = {}
_serversLock = threading.Lock()


def startEndpoint(port: int, addr: str = "0.0.0.0", registry: Any = None) -> int:
    """Serve ``registry`` (default: the client's global one) on ``addr:port``, once per
    process and address; returns the port. ``port`` 0 starts a server on a free port each
    time."""
    client = _client()
    registry = registry if registry is not None else client.REGISTRY
    with _serversLock:
        found = _servers.get((addr, port)) if port else None
        if found is None:
            found, _ = client.start_http_server(port, addr=addr, registry=registry)
            _servers[(addr, int(found.server_port))] = found
        return int(found.server_port)
