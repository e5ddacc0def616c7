"""Checking, when twophase registers, that the application's Python workers import this twophase.

The sinks' planning and tasks run in Python workers that import twophase from the interpreter
PySpark starts them with: ``spark.pyspark.python`` (``PYSPARK_PYTHON``) on each host of a
cluster; on a local master the driver's own ``PYSPARK_PYTHON`` as the session found it at its
start (``spark-submit`` sets it from ``spark.pyspark.python``), else ``python3`` on ``PATH``,
which from a venv's python is often another Python. A worker without twophase otherwise shows
only at the query's first batch, as PySpark's ``ModuleNotFoundError``, and another version
would run another protocol beside the driver's. Once per application, :func:`checkExecutors`
checks:

- on a cluster, by reading ``twophase.probe`` (see ``twophase.spark.connect``) over one
  partition per task slot, one small job, and says what to install where;
- on a local master, by running that interpreter once (``import twophase``, about 0.3 s; the
  probe job's first run costs 7 s here, most of it starting Python workers), or not at all
  when it is this very interpreter and finds twophase where this process did. Only when that
  fails does the probe job run, to be sure (a ``--py-files`` archive reaches the workers, not
  the check); if it fails too, the error names ``PYSPARK_PYTHON`` and the interpreter to set
  it to (the driver's ``sys.executable``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
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


LOCAL_CHECK_SECONDS = 120.0
"""How long the local check waits for the workers' interpreter to import twophase; past it the
probe job decides."""

_IMPORT_CHECK = "import sys, twophase; print(twophase.__version__); print(sys.executable)"


def isClassic(spark: Any) -> bool:
    """True for a classic session, whose Python workers ``twophase.register`` checks: a cluster's
    with the probe job, a local master's through its interpreter (:func:`isCluster` tells the two
    apart). False on Spark Connect, whose server ``twophase.spark.connect`` checks."""
    context = getattr(spark, "sparkContext", None)
    return isinstance(getattr(context, "master", None), str)


def isCluster(spark: Any) -> bool:
    """True for a master that is a cluster's (not ``local``, ``local[n]`` or
    ``local-cluster[...]``, whose workers run this host's interpreter)."""
    context = getattr(spark, "sparkContext", None)
    master = getattr(context, "master", None)
    return isinstance(master, str) and not master.startswith("local")


def workersPython(context: Any) -> str:
    """The interpreter PySpark starts this application's Python workers with: what the driver
    ships with each function (``SparkContext.pythonExec``: ``PYSPARK_PYTHON`` when the context
    started, else ``python3``)."""
    return str(getattr(context, "pythonExec", None) or os.environ.get("PYSPARK_PYTHON", "python3"))


def localMessage(python: str, problem: str, driver: str) -> str:
    """What :class:`ExecutorsError` says when a local master's workers cannot import this
    twophase: the interpreter they run, why, and the variable that names another."""
    found = shutil.which(python)
    where = "" if found is None or found == python else f" ({found})"
    return (
        f"the Python workers of this local Spark application run {python}{where}, which "
        f"cannot run this twophase ({problem}); this driver has twophase {driver} on "
        f"{sys.executable}. On a local master PySpark starts its workers with PYSPARK_PYTHON "
        "as the session found it at its start, else python3 on PATH: set "
        f"PYSPARK_PYTHON={sys.executable} before the session starts (export it in the shell, or "
        "os.environ['PYSPARK_PYTHON'] = sys.executable before SparkSession.builder...getOrCreate"
        f"()), or install twophase=={driver} into {python}; nothing was written. "
        "twophase.register(spark, checkExecutors=False) skips this check"
    )


def runsThisTwophase(python: str) -> bool:
    """True when the workers' interpreter is this very one, by path (a venv's python and the
    system's it links to are not the same), and this process did not find twophase in its
    script's directory (``sys.path[0]``, which a worker lacks; the working directory it shares):
    nothing to run then."""
    found = shutil.which(python)
    if found is None or os.path.abspath(found) != os.path.abspath(sys.executable):
        return False
    first = sys.path[0] if sys.path else ""
    if not first or os.path.realpath(first) == os.path.realpath(os.getcwd()):
        return True
    home = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    return home != os.path.realpath(first)


def importProblem(context: Any, python: str) -> str | None:
    """Run the workers' interpreter once, as PySpark would on this host (this directory, the
    driver's environment with the application's executor environment): ``None`` when it
    imports this twophase, else what went wrong in a few words."""
    env = {**os.environ, **{str(k): str(v) for k, v in (context.environment or {}).items()}}
    try:
        done = subprocess.run(
            [python, "-c", _IMPORT_CHECK],
            capture_output=True,
            text=True,
            env=env,
            timeout=LOCAL_CHECK_SECONDS,
        )
    except FileNotFoundError:
        return f"no such interpreter: {python} is not a file, nor a command on PATH"
    except PermissionError:
        return f"{python} cannot be run: permission denied"
    except subprocess.TimeoutExpired:
        return f"it did not import twophase within {LOCAL_CHECK_SECONDS:g} s"
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return lines[-1].strip() if lines else f"it exited with status {done.returncode}"
    version = done.stdout.split()[0] if done.stdout.split() else "?"
    if version != __version__:
        return f"it has twophase {version}"
    return None


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
    """Check at once that the application's Python workers import this driver's twophase.

    Returns what it saw (empty when this application was checked already); raises
    :class:`ExecutorsError` when a worker lacks twophase or has another version."""
    context = spark.sparkContext
    application = str(context.applicationId)
    if application in _checked:
        return {}
    if isCluster(spark):
        return probeWorkers(spark)
    python = workersPython(context)
    problem = None if runsThisTwophase(python) else importProblem(context, python)
    if problem is None:
        _checked.add(application)
        log.debug("%s, the local Python workers' interpreter, imports twophase", python)
        return {"driverVersion": __version__, "driverPython": sys.executable, "workers": python}
    log.debug("%s cannot import twophase (%s): asking the workers themselves", python, problem)
    try:
        return probeWorkers(spark)
    except ExecutorsError as exc:
        raise ExecutorsError(localMessage(python, problem, __version__), exc.seen) from None
    except Exception as exc:  # the workers cannot even start: say it as the check saw it
        raise ExecutorsError(
            localMessage(python, problem, __version__),
            {"driverVersion": __version__, "driverPython": sys.executable, "workers": python},
        ) from exc


def probeWorkers(spark: Any) -> dict[str, str]:
    """The probe job: one row per task slot through the workers, and what each imported."""
    context = spark.sparkContext
    application = str(context.applicationId)
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


__all__ = ["ExecutorsError", "checkExecutors", "isClassic", "isCluster"]
