"""A class-data sharing archive of Spark's classes, so that every test's Spark JVM starts faster.

A Spark driver or executor spends most of its start loading and verifying some ten thousand
classes from PySpark's jars. The JVM can map classes it loaded once from an archive instead
(Java's dynamic class-data sharing: ``-XX:ArchiveClassesAtExit`` writes one at exit,
``-XX:SharedArchiveFile`` maps it); a session starts in about half the time. The archive is
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
from pathlib import Path

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


def archive(cacheDir: Path, *, make: bool = True) -> Path | None:
    """The archive for this PySpark and Java, made by a warm-up query when missing (unless not
    ``make``: a short run would spend more on the warm-up than it saves); ``None`` (logged)
    when there is none: the tests then run without it."""
    import pyspark

    folder = cacheDir / "cds"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"spark-{pyspark.__version__}-{_fingerprint()}.jsa"
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one maker; the others wait and use its archive
        if path.is_file() or not make:
            return path if path.is_file() else None
        partial = Path(tempfile.mkdtemp(dir=folder)) / path.name
        options = f"-XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={partial} -Xlog:cds=off"
        env = {k: v for k, v in os.environ.items() if k != SUBMIT_ARGS}
        try:
            done = subprocess.run(
                [sys.executable, "-c", _WARM_UP, options],
                env=env,
                capture_output=True,
                text=True,
                timeout=WARM_UP_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            log.warning("no JVM class archive: the warm-up query took over %ss", WARM_UP_TIMEOUT)
            return None
        finally:
            if not partial.is_file():
                shutil.rmtree(partial.parent, ignore_errors=True)
        if done.returncode != 0 or not partial.is_file():
            log.warning("no JVM class archive: the warm-up failed:\n%s", done.stderr[-2000:])
            shutil.rmtree(partial.parent, ignore_errors=True)
            return None
        partial.replace(path)
        shutil.rmtree(partial.parent, ignore_errors=True)
        for old in sorted(folder.glob("*.jsa"), key=lambda p: p.stat().st_mtime)[:-KEPT]:
            old.unlink(missing_ok=True)  # a JVM that mapped it keeps its mapping
        return path


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
