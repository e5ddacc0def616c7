"""Set up the Python workers twophase runs in: cheap garbage collection, logging that shows.

PySpark's daemon forks the Python workers and, when a worker is reused, runs a full
``gc.collect()`` in it after every task or planner call. A worker that has imported pyspark,
pyarrow and pandas tracks about 120,000 objects (modules, classes, constants), so each of those
collections costs 50-110 ms of CPU. A micro-batch of 8 partitions pays one in the source's and
one in the sink's worker of every task, plus one in each driver-side worker that plans the
read, creates the writer and commits: well over a second of CPU per batch on 2 cores, spent
re-scanning objects that live as long as the process. ``freezeWorkerHeap`` moves the objects
alive at twophase's first call in a worker into the collector's permanent generation
(``gc.freeze``, as pre-fork servers do after start-up), so later collections scan only what
the calls create. Objects created afterwards stay collectable as usual.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading

from twophase.redaction import getLogger

log = getLogger(__name__)

_lock = threading.Lock()
_frozen = False


def inPySparkWorker() -> bool:
    """True in a Python worker forked by PySpark's daemon (``python -m pyspark.daemon``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == "pyspark.daemon"


def freezeWorkerHeap() -> None:
    """Freeze the worker's heap once per process; a no-op outside PySpark's daemon workers.

    Called at every entry point PySpark calls twophase through (planning, writer creation,
    tasks, commits): by then the worker has imported pyspark and unpickled our classes. A
    driver, a test or a notebook process keeps its collector as it is.
    """
    global _frozen
    if _frozen or not inPySparkWorker():
        return
    with _lock:
        if _frozen:
            return
        gc.collect()  # garbage that exists now must not be frozen with the rest
        gc.freeze()
        _frozen = True
    log.debug("froze %d start-up objects out of the per-call collections", gc.get_freeze_count())


def ensureLogging() -> None:
    """Give ``twophase`` loggers a stderr handler inside Spark's Python workers.

    Spark's driver-side Python workers configure no logging, so without this the one INFO line
    per committed batch would vanish. An application that configured logging keeps its own.
    ``TWOPHASE_LOG_LEVEL`` (default INFO) sets the level.
    """
    logger = logging.getLogger("twophase")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(os.environ.get("TWOPHASE_LOG_LEVEL", "INFO").upper())
