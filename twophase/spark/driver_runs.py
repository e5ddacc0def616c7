"""Which driver this process belongs to, and the run that driver claimed in each decision log.

A driver is one Spark application, its SparkContext. Every driver-side Python process of it
(PySpark's planning and commit workers of a data source, the process running a ``foreachBatch``
function) sees the same SparkFiles root, a directory Spark makes for the SparkContext and
removes when it stops. Its path names the driver, and a small file under it keeps the epoch of
the run the driver claimed in each log (``twophase.coordinator.runs``): every process of the
driver knows its run without asking the store, and no other driver, nor a later application on
the same machine, ever finds it. A driver that was fenced forgets its run, so a new start of the
query in the same application claims a new one.

Where no SparkFiles root is known (Spark Connect runs ``foreachBatch`` in a Python process of
its own, one per query start, outside PySpark's worker set-up), the process is the driver.
"""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from pathlib import Path

from twophase.coordinator import Driver
from twophase.redaction import getLogger

log = getLogger(__name__)

_RUNS_DIRECTORY = ".twophase-runs"
_processToken = uuid.uuid4().hex
_processRuns: dict[str, int] = {}


def currentDriver() -> Driver:
    """The driver this process belongs to."""
    host = socket.gethostname()
    root = sparkFilesRoot()
    if root is None:
        token = hashlib.sha256(f"{host}\0{os.getpid()}\0{_processToken}".encode()).hexdigest()
        return Driver(f"process-{token[:20]}", host, os.getpid(), "Spark driver-side process")
    digest = hashlib.sha256(f"{host}\0{root}".encode()).hexdigest()
    return Driver(f"spark-{digest[:20]}", host, _driverPid(), "Spark driver")


def rememberedRun(logUrl: str) -> int | None:
    """The epoch of the run this driver claimed in the log at ``logUrl``, if it did."""
    where = _memory(logUrl)
    if where is None:
        return _processRuns.get(logUrl)
    try:
        return int(where.read_text().strip())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("twophase: could not read this driver's run of %s: %s", logUrl, exc)
        return None


def rememberRun(logUrl: str, epoch: int) -> None:
    """Keep ``epoch`` as this driver's run in the log at ``logUrl``, for its other processes."""
    where = _memory(logUrl)
    if where is None:
        _processRuns[logUrl] = epoch
        return
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = where.with_name(f"{where.name}.{uuid.uuid4().hex}")
    tmp.write_text(f"{epoch}\n")
    os.replace(tmp, where)


def forgetRun(logUrl: str) -> None:
    """Forget this driver's run in the log at ``logUrl`` (it was fenced)."""
    where = _memory(logUrl)
    _processRuns.pop(logUrl, None)
    if where is not None:
        try:
            where.unlink()
        except FileNotFoundError:
            pass


def _memory(logUrl: str) -> Path | None:
    root = sparkFilesRoot()
    if root is None:
        return None
    name = hashlib.sha256(logUrl.rstrip("/").encode()).hexdigest()[:32]
    return Path(root) / _RUNS_DIRECTORY / name


def sparkFilesRoot() -> str | None:
    """The SparkContext's SparkFiles root as this process sees it: set up by PySpark in a
    driver-side worker, asked of the JVM in the classic driver; ``None`` elsewhere."""
    try:
        from pyspark import SparkFiles

        if SparkFiles._is_running_on_worker:
            root = SparkFiles._root_directory
        elif SparkFiles._sc is not None:
            root = SparkFiles.getRootDirectory()
        else:
            return None
    except Exception:  # no PySpark here, or a context that cannot say
        return None
    return str(root) if root and os.path.isdir(str(root)) else None


def _driverPid() -> int:
    """The driver JVM above this worker (Linux), else this process (the classic driver)."""
    pid = os.getppid()
    for _ in range(5):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
                return pid
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if pid <= 1:
            break
    return os.getpid()
