"""``twophase.register`` on a standalone cluster checks that its Python workers import twophase.

The cluster (``integration_tests.spark_cluster``: a master and a worker JVM) runs the Python
workers with the interpreter ``spark.pyspark.python`` (``PYSPARK_PYTHON``) names. One run names
a script that, like one path on two hosts, runs this venv's Python on the driver's side and, in
the worker's directories, a Python with PySpark and every dependency but not twophase
(``pythonWithoutTwophase``), as a worker host someone forgot would: ``register`` raises at
once, before any query, saying what to install where. The other names this venv's Python: the
check passes and reports the version and interpreter it found.

On a local master the workers run the interpreter PySpark was given (``PYSPARK_PYTHON``, else
``python3`` on ``PATH``): a program run by this venv's Python without the variable, whose
``python3`` on ``PATH`` lacks twophase, is refused at ``register`` with the variable and the
interpreter to set it to; with the variable naming this interpreter the check runs nothing, and
naming another that has twophase it runs it once, in well under a second.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import twophase
from integration_tests.spark_cluster import StandaloneCluster
from integration_tests.spark_processes import pythonWithoutTwophase

CHILD = """
import json, sys
from pyspark.sql import SparkSession
import twophase
from twophase.spark.executors import ExecutorsError, checkExecutors
spark = (
    SparkSession.builder.master(sys.argv[1]).appName("twophase-executors-check")
    .config("spark.ui.enabled", "false").config("spark.pyspark.python", sys.argv[2])
    .config("spark.executor.cores", "1").config("spark.cores.max", "1")
    .config("spark.executor.memory", "512m").getOrCreate()
)
try:
    if sys.argv[3] == "register":
        twophase.register(spark)
        print("REGISTERED")
    else:
        twophase.register(spark, checkExecutors=False)
        print("SEEN " + json.dumps(checkExecutors(spark)))
except ExecutorsError as exc:
    print(f"REFUSED {exc}")
spark.stop()
"""


@pytest.mark.timeout(300)
def test_a_cluster_whose_python_lacks_twophase_is_refused_at_register(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the repository must not reach a worker
    bare = pythonWithoutTwophase(tmp_path / "bare")  # checks it lacks twophase, not pyspark
    cluster = StandaloneCluster(tmp_path, workers=1).start()
    perHost = tmp_path / "python"
    perHost.write_text(
        "#!/bin/sh\n"
        f'case "$PWD" in {cluster.workdir}/*) exec {bare} "$@";; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    perHost.chmod(0o755)
    work = tmp_path / "driver"
    work.mkdir()
    try:

        def run(python: Path, how: str) -> str:
            done = subprocess.run(
                [sys.executable, "-c", CHILD, cluster.url, str(python), how],
                capture_output=True,
                text=True,
                cwd=work,  # not the repository: a worker started here must not find twophase
                env=dict(os.environ, PYSPARK_PYTHON=str(python)),
                timeout=180,
            )
            assert done.returncode == 0, done.stdout + done.stderr[-3000:]
            return done.stdout

        refused = run(perHost, "register")
        passed = run(Path(sys.executable), "check")
    finally:
        cluster.stop()
    assert "REFUSED the cluster's Python workers cannot import twophase" in refused, refused
    assert "an executor's Python lacks it" in refused, refused
    assert f"install twophase=={twophase.__version__}" in refused, refused
    assert "spark.pyspark.python (PYSPARK_PYTHON)" in refused, refused
    assert "checkExecutors=False" in refused and "REGISTERED" not in refused, refused
    lines = [ln for ln in passed.splitlines() if ln.startswith("SEEN ")]
    assert len(lines) == 1, passed
    seen = json.loads(lines[0].removeprefix("SEEN "))
    assert seen["workers"] == f"{twophase.__version__} ({sys.executable})", seen


LOCAL_CHILD = """
import sys, time
from pyspark.sql import SparkSession
import twophase
from twophase.spark.executors import ExecutorsError, checkExecutors
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
started = time.monotonic()
try:
    twophase.register(spark, checkExecutors=False)
    registered = time.monotonic()
    checkExecutors(spark)
    print(f"REGISTERED {registered - started:.3f} {time.monotonic() - registered:.3f}")
except ExecutorsError as exc:
    print(f"REFUSED {exc}")
spark.stop()
"""


@pytest.mark.timeout(300)
def test_a_local_master_whose_python3_lacks_twophase_is_refused_at_register(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    bare = pythonWithoutTwophase(tmp_path / "bare")
    onPath = tmp_path / "bin"
    onPath.mkdir()
    (onPath / "python3").symlink_to(bare)  # what "python3" finds first, as a system Python
    work = tmp_path / "driver"
    work.mkdir()

    def run(**env: str) -> str:
        environment = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
        environment["PATH"] = f"{onPath}{os.pathsep}{os.environ['PATH']}"
        done = subprocess.run(
            [sys.executable, "-c", LOCAL_CHILD],
            capture_output=True,
            text=True,
            cwd=work,
            env={**environment, **env},
            timeout=240,
        )
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        return done.stdout

    refused = " ".join(run().split())
    assert "REFUSED the Python workers of this local Spark application run python3" in refused
    assert f"({onPath / 'python3'})" in refused, refused
    assert "No module named 'twophase'" in refused, refused
    assert f"set PYSPARK_PYTHON={sys.executable} before the session starts" in refused, refused
    assert f"install twophase=={twophase.__version__} into python3" in refused, refused
    assert "register(spark, checkExecutors=False) skips this check" in refused, refused

    # Another interpreter of the same venv passes (the driver's own is every other test's case).
    here = Path(sys.executable)
    other = here.with_name("python" if here.name != "python" else "python3")
    assert other.exists(), other
    passed = run(PYSPARK_PYTHON=str(other))
    found = re.search(r"REGISTERED (\S+) (\S+)", passed)
    assert found is not None, passed
    print(f"the local check of another interpreter: {float(found.group(2)):.3f} s")
    assert float(found.group(2)) < 5.0, passed  # no Spark job
