"""``twophase.supervise``: a streaming query that comes back by itself after a failure a restart
can help, in the same SparkSession, and stops cleanly.

``start`` is the user's function that starts the query (``writeStream...start()``) and returns
its ``StreamingQuery``; supervision calls it once at once, and again for each restart, so a
restart costs seconds, not a JVM. A thread of its own waits for the query to end. A stop or
the end of its source ends supervision; an error is classified (``twophase.failures``): a fatal
one ends it, a recoverable one is restarted after the pause the strategy gives
(``twophase.restarts``), until the strategy gives up. Each restart is one log line, one
``Restart`` record and one count of ``twophase_restarts_total`` (by the failure's code).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from twophase.failures.causes import Failure, failureOfPython
from twophase.failures.classify import Classifier, Rule, Verdict
from twophase.failures.errors import QueryFailedError
from twophase.redaction import getLogger, redact
from twophase.restarts import RestartStrategy, exponentialDelay
from twophase.settings import TwoPhaseConfigError
from twophase.spark import signals
from twophase.spark.coded import markError
from twophase.spark.query_failure import failureOfQuery
from twophase.spark.stopping import stopGracefully

log = getLogger(__name__)


@dataclass(frozen=True)
class Restart:
    """One restart: when the failure was seen, the class of the error and its first line, its
    code and what that means, and the pause before the query was started again."""

    at: datetime
    errorClass: str
    firstLine: str
    code: str
    failure: str
    pause: float

    def describe(self) -> str:
        return f"{self.code} ({self.failure}): {self.firstLine}; restarted after {self.pause:.1f} s"


def supervise(
    start: Callable[[], Any],
    restart: RestartStrategy | None = None,
    *,
    recoverable: Iterable[Rule] = (),
    fatal: Iterable[Rule] = (),
    stopTimeout: float = 60.0,
) -> SupervisedQuery:
    """Start the query ``start()`` starts, and restart it by ``restart`` after each failure a
    restart can help; returns at once, as ``DataStreamWriter.start()`` does.

    ``restart`` is a strategy of ``twophase.restarts`` (``exponentialDelay()`` by default).
    ``recoverable`` and ``fatal`` add exception classes, class names (Java or Python) or codes
    to either side of the classification. ``stopTimeout`` is how long ``stop()`` and a SIGTERM
    wait for the running batch to finish before interrupting it.
    """
    if not callable(start):
        raise TypeError(
            f"twophase.supervise(start=...): {start!r} is not callable; give a function that "
            "starts the query and returns its StreamingQuery, e.g. lambda: df.writeStream...start()"
        )
    strategy = exponentialDelay() if restart is None else restart
    if not isinstance(strategy, RestartStrategy):
        raise TwoPhaseConfigError(
            f"twophase.supervise(restart={restart!r}): give a strategy of twophase.restarts "
            "(fixedDelay, failureRate, exponentialDelay or none)"
        )
    if (
        isinstance(stopTimeout, bool)
        or not isinstance(stopTimeout, int | float)
        or stopTimeout <= 0
    ):
        raise TwoPhaseConfigError(
            f"twophase.supervise(stopTimeout={stopTimeout!r}): give the seconds a stop waits "
            "for the running batch, a positive number"
        )
    classifier = Classifier(recoverable, fatal)
    supervised = SupervisedQuery(start, strategy, classifier, float(stopTimeout))
    supervised._begin()
    signals.watch(supervised)
    return supervised


class SupervisedQuery:
    """A query under supervision: ``query`` is the running ``StreamingQuery`` (a new one after
    each restart), ``restarts`` the restarts so far; ``awaitTermination`` and ``stop`` as a
    ``StreamingQuery``'s, ``stop`` cleanly (``twophase.stopGracefully``)."""

    def __init__(
        self,
        start: Callable[[], Any],
        strategy: RestartStrategy,
        classifier: Classifier,
        stopTimeout: float,
    ) -> None:
        self._start = start
        self.strategy = strategy
        self.classifier = classifier
        self.stopTimeout = stopTimeout
        self.restarts: list[Restart] = []
        self._backoff = strategy.backoff()
        self._query: Any = None
        self._error: QueryFailedError | None = None
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._stopLock = threading.Lock()
        self._stoppedCleanly: bool | None = None
        self._thread = threading.Thread(target=self._watch, name="twophase-supervise", daemon=True)

    # ------------------------------------------------------------------ what users call

    @property
    def query(self) -> Any:
        """The running ``StreamingQuery`` (the last one, once supervision ended)."""
        return self._query

    @property
    def id(self) -> str:
        return str(self._query.id)

    @property
    def name(self) -> str | None:
        name: str | None = self._query.name
        return name

    @property
    def isActive(self) -> bool:
        """True until supervision ended: a stop, the end of the source, or an error it keeps."""
        return not self._done.is_set()

    @property
    def stopped(self) -> bool:
        """True once a stop was asked for (``stop()``, or SIGTERM): supervision ends by it."""
        return self._stopping.is_set()

    @property
    def lastProgress(self) -> Any:
        return self._query.lastProgress

    @property
    def status(self) -> Any:
        return self._query.status

    def exception(self) -> QueryFailedError | None:
        """The error supervision ended with, or ``None``."""
        return self._error

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        """Wait until supervision ended: by a stop or the end of the source (returns), or by an
        error no restart helps or the strategy gave up on (raises ``QueryFailedError``). With
        ``timeout`` (seconds), returns whether it ended within it."""
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
                raise TwoPhaseConfigError(
                    f"SupervisedQuery.awaitTermination(timeout={timeout!r}): give seconds, 0 or "
                    "more"
                )
            ended = self._done.wait(timeout)
        else:
            while not self._done.wait(1.0):  # wakes for signals now and then
                pass
            ended = True
        if ended and self._error is not None:
            raise self._error
        return ended if timeout is not None else None

    def stop(self, timeout: float | None = None) -> bool:
        """Stop cleanly: no new batch starts, the running one finishes and commits, then the
        query stops and is not restarted. Past ``timeout`` seconds (``stopTimeout`` by default)
        the running batch is interrupted, as ``query.stop()`` does, and a WARNING says what
        the next start will do. Returns whether it stopped cleanly."""
        wait = self.stopTimeout if timeout is None else timeout
        with self._stopLock:
            self._stopping.set()
            if self._stoppedCleanly is None:
                query = self._query
                self._stoppedCleanly = stopGracefully(query, wait) if query is not None else True
        self._thread.join()
        return bool(self._stoppedCleanly)

    def stopOnSignal(self, source: str) -> None:
        """SIGTERM's stop (``twophase.spark.signals``)."""
        try:
            clean = self.stop()
            log.warning(
                "twophase: query %s stopped on SIGTERM (%s)",
                self._label(),
                "cleanly" if clean else "mid-batch",
            )
        except Exception:
            log.exception("twophase: the stop of query %s on SIGTERM failed", self._label())

    # ------------------------------------------------------------------ supervision

    def _begin(self) -> None:
        """The first start, in the caller's thread: its error is the caller's at once."""
        try:
            started = self._start()
        except Exception as exc:
            markError(exc)
            verdict = self.classifier.classify(failureOfPython(exc))
            raise QueryFailedError(
                verdict,
                "start() raised before any query started; nothing was restarted",
                0,
                gaveUp=False,
            ) from exc
        self._query = self._checked(started)
        self._thread.start()

    def _checked(self, query: Any) -> Any:
        needed = ("awaitTermination", "exception", "stop", "isActive", "id")
        if query is None or not all(hasattr(query, n) for n in needed):
            raise TypeError(
                "twophase.supervise: start() must return the StreamingQuery that "
                f"writeStream...start() returns; it returned {type(query).__name__}"
            )
        return query

    def _watch(self) -> None:
        try:
            query = self._query
            while query is not None:
                error = _awaitEnd(query)
                if self._stopping.is_set() or error is None:
                    return
                failure = failureOfQuery(query, error)
                if not self._restartFor(failure, error):
                    return
                query = self._restarted()
                if query is not None:
                    self._query = query
                    if self._stopping.is_set():  # stopped while it started: stop it too
                        stopGracefully(query, self.stopTimeout)
                        return
        except BaseException as exc:  # supervision's own bug: end, and say it
            log.exception("twophase: supervision of query %s failed", self._label())
            verdict = Verdict(
                False, type(exc).__name__, "supervision failed", type(exc).__name__, str(exc)
            )
            self._error = QueryFailedError(
                verdict, "supervision itself failed", len(self.restarts), gaveUp=False
            )
            self._error.__cause__ = exc
        finally:
            self._done.set()

    def _restartFor(self, failure: Failure, error: BaseException) -> bool:
        """Classify a failure: True after the pause before a restart, False when supervision
        ends (a fatal error, the strategy gave up, or a stop)."""
        verdict = self.classifier.classify(failure)
        count = len(self.restarts)
        if not verdict.recoverable:
            self._end(
                verdict,
                error,
                f"not recoverable ({verdict.reason}), so not restarted",
                gaveUp=False,
            )
            return False
        pause = self._backoff.onFailure(time.monotonic())
        if pause is None:
            why = f"recoverable, but {self.strategy.describe()} gave up after {count} restart(s)"
            self._end(verdict, error, why, gaveUp=True)
            return False
        record = Restart(
            datetime.now(UTC),
            verdict.errorClass or verdict.code,
            redact(_firstLine(verdict.message)),
            verdict.code,
            verdict.reason,
            pause,
        )
        self.restarts.append(record)
        _count(self._label(), verdict.code)
        shown = record.firstLine if f"[{verdict.code}]" in record.firstLine else record.describe()
        log.warning(
            "twophase: query %s failed, restart %d in %.1f s: %s",
            self._label(),
            count + 1,
            pause,
            shown,
        )
        return not self._stopping.wait(pause)

    def _restarted(self) -> Any:
        """The restarted query; a start that fails counts as a failure of its own."""
        while not self._stopping.is_set():
            try:
                _activate(self._query)
                return self._checked(self._start())
            except Exception as exc:
                markError(exc)
                if not self._restartFor(failureOfPython(exc), exc):
                    return None
        return None

    def _end(self, verdict: Verdict, error: BaseException, why: str, *, gaveUp: bool) -> None:
        failed = QueryFailedError(verdict, why, len(self.restarts), gaveUp=gaveUp)
        failed.__cause__ = error
        self._error = failed
        log.error("twophase: query %s ended: %s", self._label(), redact(str(failed)))

    def _label(self) -> str:
        query = self._query
        if query is None:
            return "(not started)"
        try:
            return str(query.name or query.id)
        except Exception:
            return "(unknown)"


def _activate(query: Any) -> None:
    """Make the session that started ``query`` the active one of this thread, as it is in the
    thread that called ``supervise``: Spark finds the data sources registered in a session
    (``spark.dataSource.register``) through its active session only. Classic sessions only."""
    jsq = getattr(query, "_jsq", None)
    if jsq is None:
        return
    try:
        from pyspark import SparkContext

        session = jsq.sparkSession()
        getattr(SparkContext._jvm, "org.apache.spark.sql.SparkSession").setActiveSession(session)
    except Exception as exc:  # the start will say what it misses
        log.debug("could not make the query's session active: %s", exc)


def _awaitEnd(query: Any) -> BaseException | None:
    """Wait for ``query`` to end; its error, or ``None`` when it ended without one."""
    try:
        query.awaitTermination()
    except Exception as exc:
        found = _exception(query)
        return found if found is not None else exc
    return _exception(query)


def _exception(query: Any) -> BaseException | None:
    try:
        found: BaseException | None = query.exception()
    except Exception:  # a stopped session cannot say
        return None
    return found


def _firstLine(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


def _count(query: str, reason: str) -> None:
    """One more restart in ``twophase_restarts_total``, where prometheus_client is installed."""
    try:
        from twophase.metrics.prometheus import MetricsExtraMissing, PrometheusMetrics
    except ImportError:
        return
    try:
        PrometheusMetrics.forRegistry().restarted(query, reason)
    except MetricsExtraMissing:
        return


__all__ = ["Restart", "SupervisedQuery", "supervise"]
