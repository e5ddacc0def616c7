"""Close the driver process's resources when the last query of ours in it stops.

The ``foreachBatch`` adapter runs the coordinator in the driver process, whose
:class:`~twophase.resources.Resources` then hold driver connections, transaction clients and
engines across micro-batches. Each query registers as a user of them at its first batch; a
streaming query listener, one per session, releases it when Spark says the query terminated,
and the last release closes them (a later query opens what it needs again). Python workers
close theirs when they exit.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from twophase.redaction import getLogger
from twophase.resources import Resources
from twophase.spark import connect

log = getLogger(__name__)

_ATTRIBUTE = "_twophaseQueryEnd"
"""Where a session keeps its listener, so it is added once."""


class QueryEndListener(StreamingQueryListener):
    """Releases the process's resources from each query of ours that terminates."""

    def __init__(self, resources: Resources) -> None:
        self.resources = resources

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        try:
            if self.resources.release(str(event.id)):
                log.debug("closed the driver's resources: no query of ours is running")
        except Exception as exc:  # a listener must never raise into Spark
            log.warning("twophase: could not close the driver's resources (%s)", exc)


def releaseWhenStopped(spark: Any, queryId: str | None, resources: Resources) -> None:
    """Keep ``resources`` open while query ``queryId`` runs; the last query's end closes them.

    Classic sessions only: on Spark Connect the function runs in the server's Python process,
    which the server owns.
    """
    if queryId is None or connect.isConnectSession(spark):
        return
    owner = _owner(spark, queryId)
    if owner is None:
        log.debug("no session owns query %s; its resources stay open until exit", queryId)
        return
    resources.use(queryId)
    if getattr(owner, _ATTRIBUTE, None) is None:
        listener = QueryEndListener(resources)
        owner.streams.addListener(listener)
        setattr(owner, _ATTRIBUTE, listener)


def _owner(spark: Any, queryId: str) -> Any:
    """The session whose query manager runs ``queryId``: its listeners hear of its end. The
    batch's own session (``df.sparkSession``) is a clone with a manager of its own."""
    from pyspark.sql import SparkSession

    for candidate in (SparkSession.getActiveSession(), SparkSession._instantiatedSession, spark):
        if candidate is None:
            continue
        try:
            if candidate._jsparkSession.streams().get(queryId) is not None:
                return candidate
        except Exception:  # a stopped session: try the next
            log.debug("cannot ask a session for query %s", queryId, exc_info=True)
    return None


__all__ = ["QueryEndListener", "releaseWhenStopped"]
