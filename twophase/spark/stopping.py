"""A stop that leaves nothing in doubt: the running batch finishes and commits, then the query
stops before its next batch prepares anything.

``query.stop()`` interrupts whatever batch runs: its tasks are killed, their transactions stay
prepared (holding locks, stalling ``read_committed`` readers) until the next start recovers
them. ``stopGracefully`` instead:

1. asks for the stop in a small file of the driver's own (under its SparkFiles root, where
   ``twophase.spark.driver_runs`` keeps its runs): the planning of the query's next batch, in
   either path, finds it before it does anything and waits there (``parkedBeforeBatch``);
2. waits until the query is between batches: its next batch waits there, no trigger is active,
   or the query ended by itself;
3. stops the query, and once Spark holds it as terminated, lets the waiting planning go on: it
   gives its batch up before any task began (``aborted(N)``, marked as stopped), so Spark, whose
   thread the stop interrupted, writes nothing of it either, and plans it again at the next
   start.

Past the timeout it stops the query as ``query.stop()`` does and says what the next start will
do. Where there is no SparkFiles root (Spark Connect), step 1 cannot reach the planning, and
only a query idle between triggers stops cleanly.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from twophase.coordinator import DecisionLog
from twophase.coordinator.paths import sinkLogLocations
from twophase.redaction import getLogger
from twophase.settings import TwoPhaseConfigError
from twophase.spark import driver_runs

log = getLogger(__name__)

STOPS_DIRECTORY = ".twophase-stops"
POLL_SECONDS = 0.05
PARK_LIMIT_SECONDS = 900.0
"""How long a planning waits for a stop that was asked for and never came (the asking process
died): it then goes on with its batch."""

INTERRUPT_SECONDS = 0.2
"""Between Spark's marking the query terminated and its interrupting the query's thread, both
at the start of ``query.stop()``: the waiting planning goes on only after both."""

REQUESTED = "requested"
STOPPING = "stopping"


def _directory() -> Path | None:
    root = driver_runs.sparkFilesRoot()
    return None if root is None else Path(root) / STOPS_DIRECTORY


def _marker(directory: Path, queryId: str) -> Path:
    return directory / f"{queryId}.json"


def _parked(directory: Path, queryId: str) -> Path:
    return directory / f"{queryId}.parked"


def _write(path: Path, body: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def parkedBeforeBatch(queryId: str | None, batchId: int | None) -> bool:
    """Planning of batch ``batchId``: True when a clean stop of query ``queryId`` is under way,
    so the batch must not start. Waits while the stop is asked for and not yet made; costs one
    ``stat`` of a local file when no stop was asked for."""
    directory = _directory()
    if not queryId or directory is None:
        return False
    marker = _marker(directory, queryId)
    if _read(marker) is None:
        return False
    _write(_parked(directory, queryId), {"batchId": batchId, "pid": os.getpid()})
    log.info("twophase: query %s is stopping; batch %s waits before it begins", queryId, batchId)
    deadline = time.monotonic() + PARK_LIMIT_SECONDS
    while time.monotonic() < deadline:
        body = _read(marker)
        if body is None:
            return False  # the stop was given up: the batch goes on
        if body.get("state") == STOPPING:
            return True
        time.sleep(POLL_SECONDS)
    log.warning(
        "twophase: query %s was asked to stop %.0f s ago and is still running; batch %s goes on",
        queryId,
        PARK_LIMIT_SECONDS,
        batchId,
    )
    return False


def stopGracefully(query: Any, timeout: float = 60.0) -> bool:
    """Stop ``query`` after its running batch has finished and committed; no new batch starts.

    Returns True when it stopped between batches, nothing in doubt; False when the running
    batch did not finish within ``timeout`` seconds and was interrupted as ``query.stop()``
    interrupts it (a WARNING says what the next start will do: commit a decided batch, or
    abort what an undecided one prepared and write it again). A query that already ended is
    left as it is (True).
    """
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise TwoPhaseConfigError(
            f"twophase.stopGracefully(timeout={timeout!r}): give the seconds to wait for the "
            "running batch, a positive number (60 by default)"
        )
    if not query.isActive:
        return True
    queryId = str(query.id)
    directory = _directory()
    if directory is not None:
        _write(_marker(directory, queryId), {"state": REQUESTED, "at": time.time()})
    started = time.monotonic()
    try:
        clean = _awaitBoundary(query, directory, queryId, started + timeout)
        batch = _runningBatch(query)
        _stop(query, directory, queryId)
    finally:
        if directory is not None:
            for path in (_marker(directory, queryId), _parked(directory, queryId)):
                path.unlink(missing_ok=True)
    name = query.name or queryId
    if clean:
        log.info(
            "twophase: stopped query %s between batches after %.1f s; nothing in doubt",
            name,
            time.monotonic() - started,
        )
    else:
        log.warning(
            "twophase: query %s was still in batch %s after %.0f s, so it was stopped mid-batch "
            "as query.stop() stops it. Nothing decided is lost: %s",
            name,
            "?" if batch is None else batch,
            timeout,
            nextStart(_checkpointOf(query)),
        )
    return clean


def _awaitBoundary(query: Any, directory: Path | None, queryId: str, deadline: float) -> bool:
    """Wait until the query is between batches (True) or the deadline passes (False)."""
    while time.monotonic() < deadline:
        if not query.isActive:
            log.debug("twophase: query %s ended by itself", queryId)
            return True
        if directory is not None and _parked(directory, queryId).exists():
            log.debug("twophase: query %s waits before its next batch", queryId)
            return True
        status = query.status
        if not status.get("isTriggerActive", True):
            log.debug("twophase: query %s is between triggers: %s", queryId, status)
            return True
        time.sleep(POLL_SECONDS)
    return False


def _stop(query: Any, directory: Path | None, queryId: str) -> None:
    """``query.stop()``; once Spark holds the query as terminated (the stop sets that first),
    the planning that waits is told, so that it gives its batch up and the stop completes."""
    failure: list[BaseException] = []

    def stop() -> None:
        try:
            query.stop()
        except BaseException as exc:  # raised again by the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=stop, name="twophase-stop", daemon=True)
    thread.start()
    while thread.is_alive() and query.isActive:
        time.sleep(POLL_SECONDS)
    time.sleep(INTERRUPT_SECONDS)
    if directory is not None:
        _write(_marker(directory, queryId), {"state": STOPPING, "at": time.time()})
    thread.join()
    if failure:
        raise failure[0]


def _runningBatch(query: Any) -> int | None:
    """The batch the query runs now: the one after its last progress, if it reported one."""
    try:
        progress = query.lastProgress
    except Exception:
        return None
    if not progress:
        return 0
    return int(progress["batchId"]) + 1


def _checkpointOf(query: Any) -> str | None:
    """The query's checkpoint, from Spark's own execution of it (classic sessions only)."""
    try:
        root = str(query._jsq.streamingQuery().resolvedCheckpointRoot())
    except Exception:
        return None
    return root.removeprefix("file:") if root.startswith("file:/") else root


def nextStart(checkpoint: str | None) -> str:
    """What the next start of the query does with what a stopped batch left, as its logs say."""
    if checkpoint is None:
        return "the next start of the query finishes or aborts what the batch left"
    decided: list[str] = []
    for sinkId, url in sinkLogLocations(checkpoint):
        try:
            decided += [
                f"batch {s.batchId} of sink {sinkId}" for s in DecisionLog(url).outstanding()
            ]
        except Exception as exc:  # a log that cannot be read now: say so, do not fail the stop
            log.debug("could not read the decision log %s: %s", url, exc)
    status = f"twophase status --checkpoint {checkpoint}"
    if decided:
        return (
            f"{', '.join(decided)} is decided, and the next start commits it first ({status} "
            "shows it)"
        )
    return (
        "the batch was not decided, so the next start aborts what its tasks prepared and Spark "
        f"writes the batch again ({status} shows the log)"
    )


__all__ = ["nextStart", "parkedBeforeBatch", "stopGracefully"]
