"""Checking, when twophase registers on a cluster, that the cluster's Python imports this twophase.

On a cluster the sinks' planning and tasks run in Python workers that import twophase from
the interpreter ``spark.pyspark.python`` (``PYSPARK_PYTHON``) names on each host. A host
without twophase otherwise shows only at the query's first batch, as PySpark's
``ModuleNotFoundError`` in a failed task, and another version would run another protocol
beside the driver's. :func:`checkExecutors` reads ``twophase.probe`` (see
``twophase.spark.connect``) over one partition per task slot when ``twophase.register`` runs,
one small job per application, and says what to install where.
"""

from __future__ import annotations

import sys
from typing import Any

from twophase.redaction import getLogger
from twophase.spark.connect import MISSING_MODULE, PROBE_NAME, ProbeSource
from twophase.version import __version__

log = getLogger(__name__)

MAX_PARTITIONS = 64
"""The probe reads one partition per task slot, up to this many."""

PLANNING_MARKS = ("PYTHON_DATA_SOURCE_ERROR", "create_data_source", "plan_data_source")
"""What the error of a planning worker on the driver's host holds, and a task's does not."""

_checked: set[str] = set()
"""Applications already checked: registering twice runs one job."""


class ExecutorsError(RuntimeError):
    """The cluster's Python workers cannot run this twophase: they lack it or have another
    version. The message says what to install where; ``seen`` holds what the check found."""

    errorCode = "TWOPHASE_CLUSTER_PYTHON"

    def __init__(self, message: str, seen: dict[str, str]) -> None:
        super().__init__(message)
        self.seen = seen


def isCluster(spark: Any) -> bool:
    """True for a classic session whose master is a cluster's (not ``local``, ``local[n]`` or
    ``local-cluster[...]``, whose workers run this host's interpreter)."""
    context = getattr(spark, "sparkContext", None)
    master = getattr(context, "master", None)
    return isinstance(master, str) and not master.startswith("local")


def _installHint(driver: str) -> str:
    return (
        f"install twophase=={driver}, with the extras the query uses, into the Python that "
        "spark.pyspark.python (PYSPARK_PYTHON) names on every worker host and on the driver's "
        "host, the same version as the driver's (docs/deploying.md, What the executors need); "
        "nothing was written. twophase.register(spark, checkExecutors=False) skips this check"
    )


def missingMessage(task: bool, driver: str, python: str) -> str:
    """What :class:`ExecutorsError` says when a worker lacks twophase: an executor's (``task``)
    or the planning worker's on the driver's host."""
    side = "an executor's Python lacks it" if task else "the planning worker's Python lacks it"
    return (
        f"the cluster's Python workers cannot import twophase ({side}; this driver has "
        f"twophase {driver} on {python}): {_installHint(driver)}"
    )


def checkExecutors(spark: Any) -> dict[str, str]:
    """Check at once that the cluster's Python workers import this driver's twophase.

    Returns what it saw (empty when this application was checked already); raises
    :class:`ExecutorsError` when a worker lacks twophase or has another version."""
    context = spark.sparkContext
    application = str(context.applicationId)
    if application in _checked:
        return {}
    driver = __version__
    seen = {"driverVersion": driver, "driverPython": sys.executable}
    slots = max(1, min(int(context.defaultParallelism), MAX_PARTITIONS))
    spark.dataSource.register(ProbeSource)
    try:
        reader = spark.read.format(PROBE_NAME).option("partitions", str(slots))
        rows = reader.load().collect()
    except Exception as exc:
        text = str(exc)
        if MISSING_MODULE not in text:
            raise
        # Planning (a Python worker on the driver's host) fails creating the data source
        # before any task starts; otherwise the planning worker imported twophase and an
        # executor's did not.
        planning = any(mark in text for mark in PLANNING_MARKS)
        raise ExecutorsError(missingMessage(not planning, driver, sys.executable), seen) from None
    found = {(row["executorVersion"], row["executorPython"]) for row in rows}
    found.add((rows[0]["driverVersion"], rows[0]["driverPython"]))
    other = sorted(f"{version} ({python})" for version, python in found if version != driver)
    seen["workers"] = ", ".join(sorted(f"{v} ({p})" for v, p in found))
    if other:
        raise ExecutorsError(
            f"twophase versions differ: the driver has {driver}, the cluster's Python workers "
            f"{', '.join(other)}; {_installHint(driver)}",
            seen,
        )
    _checked.add(application)
    log.info("the cluster's Python workers import twophase %s: %s", driver, seen["workers"])
    return seen


__all__ = ["ExecutorsError", "checkExecutors", "isCluster"]
