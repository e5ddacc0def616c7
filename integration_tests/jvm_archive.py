"""A class-data sharing archive of Spark's classes, so that every test's Spark JVM starts faster.

A Spark driver or executor spends most of its start loading and verifying some ten thousand
classes from PySpark's jars. The JVM can map classes it loaded once from an archive instead
(Java's dynamic class-data sharing: ``-XX:ArchiveClassesAtExit`` writes one at exit,
``-XX:SharedArchiveFile`` maps it), which is much quicker. The archive is
made once per PySpark jars and Java (a warm-up query, under ``$TWOPHASE_CACHE/cds``), and
handed to every Spark JVM the tests start, in process or in a child, through
``PYSPARK_SUBMIT_ARGS`` (``spark.driver.defaultJavaOptions`` and
``spark.executor.defaultJavaOptions``, which Spark puts before any ``extraJavaOptions`` a test
or an example sets). A JVM whose classes do not match the archive (another PySpark, another
Java) runs without it, silently: the archive only ever changes how fast a JVM starts.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from integration_tests.spark_processes import killSession, sessionProcesses

log = logging.getLogger(__name__)

WARM_UP_TIMEOUT = 300.0
KEPT = 4
"""Archives kept in the cache (one per PySpark install: a venv made again needs a new one)."""
SUBMIT_ARGS = "PYSPARK_SUBMIT_ARGS"

_WARM_UP = """
import sys, tempfile
from pyspark.sql import SparkSession
import twophase
spark = (SparkSession.builder.master("local[2]").appName("twophase-jvm-archive")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.extraJavaOptions", sys.argv[1]).getOrCreate())
twophase.register(spark)
work = tempfile.mkdtemp()
query = (spark.readStream.format("twophase.sequence").option("totalRows", "400")
         .option("rowsPerBatch", "200").load().writeStream.format("twophase.files")
         .option("path", work + "/out").option("checkpointLocation", work + "/cp")
         .trigger(availableNow=True).start())
query.awaitTermination()
spark.read.parquet(work + "/out").groupBy().count().collect()
spark.stop()
"""
"""The warm-up: the classes of a session, a streaming query through a Python source and sink,
a Parquet read and a shuffle, as most tests use them."""


def _fingerprint() -> str:
    """What the archive depends on: PySpark's jars (names, sizes, times) and the Java that runs
    them (its ``release`` file)."""
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    digest = hashlib.sha256(str(jars).encode())
    for jar in sorted(jars.glob("*.jar")):
        stat = jar.stat()
        digest.update(f"{jar.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    java = shutil.which("java")
    if java:
        release = Path(os.path.realpath(java)).parent.parent / "release"
        digest.update(release.read_bytes() if release.is_file() else java.encode())
    return digest.hexdigest()[:16]


def archivePath(cacheDir: Path) -> Path:
    """Where the archive of this PySpark and Java lives under ``cacheDir``."""
    import pyspark

    return cacheDir / "cds" / f"spark-{pyspark.__version__}-{_fingerprint()}.jsa"


def waitForArchive(cacheDir: Path) -> Path | None:
    """The archive under ``cacheDir``, once whoever makes it (this process or another: the
    process running a session of pytest-xdist workers) is done; ``None`` when there is none."""
    path = archivePath(cacheDir)
    lockPath = path.parent / ".lock"
    if path.is_file():
        return path
    if not lockPath.is_file():
        return None  # nobody ever made one here
    with lockPath.open("a") as lock:
        deadline = time.monotonic() + WARM_UP_TIMEOUT + 60
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break  # the maker is done (or there was none); closing the file drops the lock
            except BlockingIOError:
                if time.monotonic() > deadline:
                    log.warning("no JVM class archive: its maker still holds %s", lockPath)
                    return None
                time.sleep(0.5)
    return path if path.is_file() else None


class Archive:
    """The archive of this PySpark and Java under ``cacheDir``: found, or made by a warm-up
    query that :meth:`start` begins in the background (the unit tests run meanwhile) and moves
    into place once it is over, holding the cache's lock until then (:func:`waitForArchive`
    waits for it, in any process). Without ``make`` only a cached archive is used: a short run
    would spend more on the warm-up than it saves."""

    def __init__(self, cacheDir: Path, *, make: bool = True) -> None:
        self.path = archivePath(cacheDir)
        self.folder = self.path.parent
        self.make = make
        self._lock: IO[str] | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._partial: Path | None = None
        self._mover: threading.Thread | None = None

    def start(self) -> None:
        """Begin the warm-up when the archive is missing (one maker at a time: another waits
        for the first's lock, then finds its archive)."""
        if self.path.is_file() or not self.make:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = (self.folder / ".lock").open("w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        if self.path.is_file():
            self._release()
            return
        self._partial = Path(tempfile.mkdtemp(dir=self.folder)) / self.path.name
        options = f"-XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={self._partial} -Xlog:cds=off"
        env = {k: v for k, v in os.environ.items() if k != SUBMIT_ARGS}
        with (self._partial.parent / "warm-up.log").open("wb") as out:
            self._child = subprocess.Popen(
                [sys.executable, "-c", _WARM_UP, options],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._mover = threading.Thread(target=self.ready, name="jvm-archive", daemon=True)
        self._mover.start()

    def finish(self) -> None:
        """Wait until the warm-up, if any, is over and its archive in place."""
        if self._mover is not None:
            self._mover.join()
        self.ready()

    def ready(self) -> Path | None:
        """The archive once the warm-up is over; ``None`` (logged) when there is none: the
        tests then run without it."""
        child, partial = self._child, self._partial
        if child is not None and partial is not None:
            self._child = None
            deadline = time.monotonic() + WARM_UP_TIMEOUT
            try:
                code: int | None = child.wait(timeout=WARM_UP_TIMEOUT)
            except subprocess.TimeoutExpired:
                code = None
            # The JVM writes the archive as it exits, after the Python that started it.
            while sessionProcesses(child.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if sessionProcesses(child.pid):
                killSession(child.pid)
                code = None
            child.wait()
            if code == 0 and partial.is_file():
                partial.replace(self.path)
                for old in sorted(self.folder.glob("*.jsa"), key=lambda p: p.stat().st_mtime)[
                    :-KEPT
                ]:
                    old.unlink(missing_ok=True)  # a JVM that mapped it keeps its mapping
            else:
                tail = (partial.parent / "warm-up.log").read_text(errors="replace")[-2000:]
                log.warning("no JVM class archive: the warm-up ended with %s:\n%s", code, tail)
            shutil.rmtree(partial.parent, ignore_errors=True)
        self._release()
        return self.path if self.path.is_file() else None

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file drops the lock
            self._lock = None


def submitArgs(path: Path, existing: str | None) -> str:
    """``PYSPARK_SUBMIT_ARGS`` that hand ``path`` to the driver and the executors, keeping
    what ``existing`` already asked for (it ends with the ``pyspark-shell`` PySpark needs)."""
    options = f"-XX:SharedArchiveFile={path} -Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"
    args = (
        f'--conf "spark.driver.defaultJavaOptions={options}" '
        f'--conf "spark.executor.defaultJavaOptions={options}"'
    )
    rest = (existing or "pyspark-shell").strip()
    return f"{args} {rest}"
