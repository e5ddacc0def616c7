"""The metrics listener: each micro-batch's figures, read from the query's decision logs.

A Python data source cannot add metrics to Spark's query progress, so a
``StreamingQueryListener`` does it from the outside: on each ``onQueryProgress`` of the query
whose checkpoint it watches, it reads batch ``event.progress.batchId`` of every sink's decision
log (``<checkpointLocation>/twophase/<sinkId>``) and hands the figures on: one JSON line on
logger ``twophase.metrics``, an optional callback, and Prometheus (``twophase.metrics.prometheus``).

The listener only queues the batch id; a thread of its own does the reading, so neither the
batches nor Spark's listener bus wait for it, and nothing it meets is raised into Spark (it is
logged, and the next event is read). Works wherever PySpark delivers listener events to Python:
classic sessions, and Spark Connect from PySpark 4.0 (events reach the client, which must then
be able to read the checkpoint).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from twophase.coordinator.paths import sinkLogLocations
from twophase.metrics.prometheus import PrometheusMetrics, startEndpoint
from twophase.metrics.reading import SinkMetrics, readSinkMetrics
from twophase.redaction import getLogger
from twophase.spark.checkpoint import checkpointQueryId

log = getLogger(__name__)
metricsLog = getLogger("twophase.metrics")

Callback = Callable[[SinkMetrics], None]

QUEUE_SIZE = 1024
"""Events waiting for the reading thread; beyond it an event is dropped (and logged)."""
_CLOSE: tuple[str, int | None, float | None] = ("", None, None)
"""Queued by ``close()``: the thread ends when it reads this very tuple."""


class TwoPhaseMetricsListener(StreamingQueryListener):
    """Reads each batch's figures from the decision logs of one query's checkpoint.

    Parameters
    ----------
    checkpointLocation:
        The query's ``checkpointLocation``. Events of other queries of the session are ignored
        (their ids differ from the one Spark wrote in ``<checkpointLocation>/metadata``).
    sinkId:
        Only this sink; by default every sink whose log is under the checkpoint.
    callback:
        Called with each sink's ``SinkMetrics`` of each batch its log holds, on the listener's
        thread; an exception it raises is logged and ignored. (The reading when the query
        terminates, for what it left in doubt, goes to the log line and Prometheus only.)
    prometheus:
        Where to count the figures (``PrometheusMetrics.forRegistry()``), or ``None``.

    Pass it to ``spark.streams.addListener``, or let ``twophase.attachMetrics`` do it; after
    ``spark.streams.removeListener``, ``close()`` ends its thread.
    """

    def __init__(
        self,
        checkpointLocation: str,
        *,
        sinkId: str | None = None,
        callback: Callback | None = None,
        prometheus: PrometheusMetrics | None = None,
    ) -> None:
        self.checkpointLocation = checkpointLocation
        self.sinkId = sinkId
        self.callback = callback
        self.prometheus = prometheus
        self.port: int | None = None
        """The port of the Prometheus endpoint ``attachMetrics`` started, if any."""
        self.lastBatch: int | None = None
        """The newest batch whose figures were handed on."""
        self._handed = threading.Condition()
        self._queryId: str | None = None
        self._closed = False
        self._events: queue.Queue[tuple[str, int | None, float | None]] = queue.Queue(QUEUE_SIZE)
        self._thread = threading.Thread(target=self._run, name="twophase-metrics", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ Spark's calls

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        """Queue the batch of this progress; returns at once, never raises."""
        try:
            progress = event.progress
            duration = progress.batchDuration
            seconds = duration / 1000 if isinstance(duration, int | float) else None
            self._offer((str(progress.id), int(progress.batchId), seconds))
        except Exception as exc:
            log.warning("twophase metrics: could not read a progress event (%s)", exc)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        """Read what is in doubt once more: a query that failed in a commit leaves a batch so."""
        try:
            self._offer((str(event.id), None, None))
        except Exception as exc:
            log.warning("twophase metrics: could not read a termination event (%s)", exc)

    # ------------------------------------------------------------------ the reading thread

    def flush(self, timeoutSeconds: float = 30.0) -> bool:
        """Wait until every queued event is read; False if that took over ``timeoutSeconds``."""
        deadline = time.monotonic() + timeoutSeconds
        while self._events.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def awaitBatch(self, batchId: int, timeoutSeconds: float = 60.0) -> bool:
        """Wait until the figures of batch ``batchId`` (or a later one) were handed on; False
        after ``timeoutSeconds``. Spark delivers progress events after the batch, so a script
        that stops once its query ends waits here for the last one."""
        with self._handed:
            return self._handed.wait_for(
                lambda: self.lastBatch is not None and self.lastBatch >= batchId, timeoutSeconds
            )

    def close(self, timeoutSeconds: float = 30.0) -> bool:
        """End the reading thread once the events already queued are read; True when it
        ended within ``timeoutSeconds``. Events that arrive afterwards are ignored."""
        self._closed = True
        self._events.put(_CLOSE)
        self._thread.join(timeoutSeconds)
        return not self._thread.is_alive()

    def _offer(self, item: tuple[str, int | None, float | None]) -> None:
        if self._closed:
            return
        try:
            self._events.put_nowait(item)
        except queue.Full:
            log.warning("twophase metrics: %d events wait to be read; dropped one", QUEUE_SIZE)

    def _run(self) -> None:
        while True:
            item = self._events.get()
            if item is _CLOSE:
                self._events.task_done()
                return
            queryId, batchId, seconds = item
            try:
                if self._ours(queryId):
                    self._read(batchId, seconds)
            except Exception as exc:  # a metric must never stop the query or this thread
                log.warning(
                    "twophase metrics: reading batch %s of %s failed (%s: %s)",
                    batchId,
                    self.checkpointLocation,
                    type(exc).__name__,
                    exc,
                )
            finally:
                self._events.task_done()

    def _ours(self, queryId: str) -> bool:
        if self._queryId is None:
            self._queryId = checkpointQueryId(self.checkpointLocation)
        return self._queryId == queryId

    def _read(self, batchId: int | None, batchSeconds: float | None) -> None:
        for sinkId, url in sinkLogLocations(self.checkpointLocation, self.sinkId):
            metrics = readSinkMetrics(self.checkpointLocation, sinkId, url, batchId)
            self._handOn(metrics, batchSeconds)
        if batchId is not None:
            with self._handed:
                self.lastBatch = max(batchId, self.lastBatch if self.lastBatch is not None else -1)
                self._handed.notify_all()

    def _handOn(self, metrics: SinkMetrics, batchSeconds: float | None) -> None:
        fields = metrics.toJson()
        fields["checkpointLocation"] = self.checkpointLocation
        fields["batchDurationSeconds"] = batchSeconds
        metricsLog.info("%s", json.dumps(fields, sort_keys=True), extra={"twophase": fields})
        if self.prometheus is not None:
            self.prometheus.report(metrics, batchSeconds)
        if self.callback is not None and metrics.batch is not None:
            try:
                self.callback(metrics)
            except Exception as exc:
                log.warning(
                    "twophase metrics: the callback failed on sink %s (%s: %s)",
                    metrics.sinkId,
                    type(exc).__name__,
                    exc,
                )


def attachMetrics(
    spark: Any,
    checkpointLocation: str,
    *,
    sinkId: str | None = None,
    callback: Callback | None = None,
    port: int | None = None,
    addr: str = "0.0.0.0",
    registry: Any = None,
) -> TwoPhaseMetricsListener:
    """Watch one query's twophase sinks: a listener on ``spark``, and Prometheus if asked.

    Call it before or after ``start()`` with the query's ``checkpointLocation``; once per
    query. With ``port`` (0: any free port, see ``listener.port``), serves Prometheus on
    ``addr:port`` from this driver (once per process and port), which needs
    ``pip install 'twophase[metrics]'``; ``registry`` counts into a
    ``prometheus_client.CollectorRegistry`` of your own instead of the global one (any
    endpoint you serve it from then shows the series). Every figure is also logged on logger
    ``twophase.metrics`` (INFO, one JSON object per sink and batch) and handed to
    ``callback``. Returns the listener: ``spark.streams.removeListener(listener)`` takes it
    back, then ``listener.close()`` ends its thread.
    """
    prometheus = None
    served: int | None = None
    if port is not None or registry is not None:
        prometheus = PrometheusMetrics.forRegistry(registry)
    if port is not None:
        served = startEndpoint(port, addr, prometheus.registry if prometheus else None)
    listener = TwoPhaseMetricsListener(
        checkpointLocation, sinkId=sinkId, callback=callback, prometheus=prometheus
    )
    listener.port = served
    spark.streams.addListener(listener)
    return listener
