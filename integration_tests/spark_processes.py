"""Spark child processes for the tests: a private SPARK_HOME, their environment, sessions.

Running pip-installed PySpark this way (what we found, PySpark 4.3 from PyPI)
------------------------------------------------------------------------------
- ``SPARK_HOME``: PySpark finds its own home (the ``pyspark`` package directory) when unset,
  and local-cluster works with it, but the in-driver Worker then creates its work directory at
  ``$SPARK_HOME/work/app-*`` *inside the virtualenv* (executor stdout/stderr land there). The
  harness therefore gives every work directory a private ``spark-home/`` holding two symlinks
  into the package, ``bin`` (``spark-submit``, which PySpark launches) and ``jars`` (the
  driver's and executors' class path), and sets ``SPARK_HOME`` to it. Executor logs are then
  under ``<workdir>/spark-home/work/``.
- ``python/lib/pyspark.zip`` is deliberately not linked: Spark puts
  ``$SPARK_HOME/python/lib/pyspark.zip`` first on every Python worker's ``PYTHONPATH``, and
  ``zipimport`` never caches bytecode, so each Python worker daemon (about eight per query:
  data source lookup, creation, stream reader, planning, writer, tasks, commit) recompiles
  PySpark, 1.5-2 s of CPU each. Without the zip the workers import the installed ``pyspark``
  package: the same files (we diffed them) with cached bytecode. On this 2-core machine that
  takes a 6-batch run from ~38 s to ~28 s. Set ``TWOPHASE_IT_PYSPARK_ZIP=1`` to link
  ``python/`` too and run the stock layout.
- JVMs start with ``-XX:TieredStopAtLevel=1`` (C1 only): short runs spend most of their time
  starting up, and this cut another ~25 % here. It changes nothing Spark does.
- ``PYSPARK_PYTHON`` is this interpreter (the venv's). Executors of local-cluster and
  standalone mode get it, ``PYTHONPATH`` (the repository root, so workers can import sink
  classes defined in test modules: cloudpickle pickles them by reference) and the
  ``TWOPHASE_CRASH_*``/``TWOPHASE_LOG_LEVEL`` variables through ``spark.executorEnv.*``.
  (local-cluster executors would also inherit the driver's environment through the in-driver
  Worker; the standalone workers, started before the query, would not.)
- ``SPARK_LOCAL_IP=127.0.0.1``: the machine's hostname resolves to a loopback address and Spark
  otherwise picks an interface address and warns.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
FAST_JVM = "-XX:TieredStopAtLevel=1"
QUERY_FAILED = 3
"""Exit status of a child whose query failed (as opposed to drained, 0, or killed)."""


SPARK_KAFKA_CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
"""Spark's own Kafka connector, for the tests that read with Spark's Kafka source. PySpark
4.3's own is not in Maven Central as this machine sees it; 4.2.0 resolves with its
dependencies and reads on Spark 4.3."""


SHIPPED_WITH_PYSPARK = (
    "org.apache.hadoop:hadoop-client-api",
    "org.apache.hadoop:hadoop-client-runtime",
    "org.lz4:lz4-java",
    "at.yawk.lz4:lz4-java",
    "org.xerial.snappy:snappy-java",
    "org.slf4j:slf4j-api",
    "com.google.code.findbugs:jsr305",
    "org.scala-lang.modules:scala-parallel-collections_2.13",
)
"""The connector's dependencies that PySpark's own jars hold: not downloaded, not loaded twice."""


def sparkKafkaConf() -> dict[str, str]:
    """Spark settings that put Spark's Kafka connector on a session's class path, resolved by
    its Maven coordinates into the cache's Ivy directory (first by :func:`resolvePackages`)."""
    cache = Path(os.environ.get("TWOPHASE_CACHE", Path.home() / ".cache" / "twophase"))
    conf = {
        "spark.jars.packages": SPARK_KAFKA_CONNECTOR,
        "spark.jars.excludes": ",".join(SHIPPED_WITH_PYSPARK),
        "spark.jars.ivy": str(cache / "ivy"),
    }
    group, artifact, version = SPARK_KAFKA_CONNECTOR.split(":")
    resolvePackages(conf, f"{group}_{artifact}-{version}.jar")
    return conf


RESOLVE = """
import json, sys
from pyspark.sql import SparkSession
builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
for key, value in json.loads(sys.argv[1]).items():
    builder = builder.config(key, value)
builder.getOrCreate().stop()
"""


def resolvePackages(conf: Mapping[str, str], jar: str, tries: int = 3) -> None:
    """The packages of ``conf`` in its Ivy cache before sessions that use them start, perhaps
    several at once: resolved by a session of their own under a lock, a failed download tried
    again, unless ``jar`` is there already (Ivy copies the jars into ``jars/`` only once the
    whole resolution succeeded)."""
    import fcntl

    ivy = Path(conf["spark.jars.ivy"])
    if (ivy / "jars" / jar).is_file():
        return
    ivy.mkdir(parents=True, exist_ok=True)
    with open(ivy / ".resolve.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        errors = ""
        for _ in range(tries):
            if (ivy / "jars" / jar).is_file():
                return
            done = subprocess.run(
                [sys.executable, "-c", RESOLVE, json.dumps(dict(conf))],
                env=dict(os.environ, PYSPARK_PYTHON=sys.executable),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=900,
            )
            errors = done.stderr[-3000:]
        if not (ivy / "jars" / jar).is_file():
            raise RuntimeError(
                f"resolving {conf['spark.jars.packages']} into {ivy} failed {tries} times, "
                f"no {jar}:\n{errors}"
            )


def makeSparkHome(home: Path) -> Path:
    """A private ``SPARK_HOME``: symlinks to the pip package's ``bin`` and ``jars`` (see top)."""
    import pyspark

    package = Path(pyspark.__file__).resolve().parent
    home.mkdir(parents=True, exist_ok=True)
    links = ["bin", "jars"]
    if os.environ.get("TWOPHASE_IT_PYSPARK_ZIP") == "1":
        links.append("python")
    for name in links:
        link = home / name
        if not link.exists():
            link.symlink_to(package / name, target_is_directory=True)
    return home


def childEnvironment(workdir: Path, sparkHome: Path, crash: Mapping[str, str]) -> dict[str, str]:
    """The environment of a query's child process: this one without crash settings, plus
    ``crash`` (``TWOPHASE_CRASH_*``), this interpreter, the private ``SPARK_HOME``, loopback,
    local dirs in ``workdir`` and the repository on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_CRASH_")}
    env.update(crash)
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_HOME"] = str(sparkHome)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARK_LOCAL_DIRS"] = str(workdir / "spark-local")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    return env


def sessionBuilder(master: str, appName: str, partitions: int) -> Any:
    """A SparkSession builder as every test child wants it: no UI, C1-only JVMs, this
    interpreter and the repository on the executors, the ``TWOPHASE_*`` fault and log
    variables passed to them (local-cluster and standalone executors need them in
    ``executorEnv``)."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(appName)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.driver.extraJavaOptions", FAST_JVM)
        .config("spark.executor.extraJavaOptions", FAST_JVM)
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", str(REPO_ROOT))
    )
    for name, value in os.environ.items():
        if (
            name.startswith("TWOPHASE_CRASH_")
            and name != "TWOPHASE_CRASH_PGID"
            or (name == "TWOPHASE_LOG_LEVEL")
        ):
            builder = builder.config(f"spark.executorEnv.{name}", value)
    return builder


def sharedSession(appName: str, **conf: str) -> Iterator[Any]:
    """A ``local[2]`` session in the test process, twophase registered, stopped at the end:
    for a module fixture whose tests involve no crash (``yield from sharedSession(...)``)."""
    from pyspark.sql import SparkSession

    import twophase

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(appName)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    twophase.register(session)
    yield session
    session.stop()


def awaitDrained(spark: Any, query: Any) -> int:
    """Wait for an ``availableNow`` query; 0 when it drained its source, ``QUERY_FAILED`` (its
    error on stderr) when it failed. Stops the session either way."""
    try:
        query.awaitTermination()
    except Exception as exc:  # the query's error, for the test to read
        sys.stderr.write(f"QUERY FAILED: {exc}\n")
        sys.stderr.flush()
        return QUERY_FAILED
    finally:
        spark.stop()
    return 0


def lastCommittedOffset(checkpoint: Path) -> int | None:
    """The sequence source's end offset of the last batch in ``commits/`` (Spark's own log)."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")]
    if not commits:
        return None
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    return int(json.loads(lines[-1])["offset"])


def sessionProcesses(sid: int) -> list[int]:
    """Pids of the processes in session ``sid`` (a child started with ``start_new_session``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid:  # fields after ``(comm)``: state ppid pgrp session
            pids.append(int(entry.name))
    return pids


def killSession(sid: int) -> int:
    """SIGKILL every process left in session ``sid`` (the child's); returns how many."""
    killed = 0
    for pid in sessionProcesses(sid):
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return killed


def freePort(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def killExecutorJvmOnce(onceFile: str, note: str = "") -> None:
    """SIGKILL the executor JVM above this Python worker, once per ``onceFile``; a test fault.

    Called inside a task on a ``local-cluster`` or standalone executor: the JVM dies with its
    shuffle outputs and every task on it, as when a machine is lost. Raises when no executor
    JVM is above the worker (a ``local`` master runs tasks in the driver).
    """
    try:
        fd = os.open(onceFile, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, f"{note}\n".encode())
    os.close(fd)
    pid = os.getppid()
    while pid > 1:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"CoarseGrainedExecutorBackend" in cmdline:
            os.kill(pid, signal.SIGKILL)
            time.sleep(30)  # the JVM is gone; this worker dies with its pipes
            return
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
    raise RuntimeError("no executor JVM above this Python worker (not local-cluster?)")


def pythonWithoutTwophase(venv: Path) -> Path:
    """A venv whose Python imports pyspark, pyarrow and pandas (this venv's site-packages as a
    plain path, so its ``.pth`` files, among them the editable install of twophase, are not
    run) but not twophase."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = next(p for p in sys.path if p.endswith("site-packages") and "pyspark" in os.listdir(p))
    Path(site, "spark-only.pth").write_text(ours + "\n")
    check = subprocess.run(
        [str(python), "-c", "import pyspark, pyarrow\nimport twophase"],
        cwd=venv,
        capture_output=True,
        text=True,
    )
    assert "No module named 'twophase'" in check.stderr, check.stderr
    return python
