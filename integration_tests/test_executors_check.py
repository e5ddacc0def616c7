"""``twophase.register`` on a standalone cluster checks that its Python workers import twophase.

The cluster (``integration_tests.spark_cluster``: a master and a worker JVM) runs the Python
workers with the interpreter ``spark.pyspark.python`` names. One run names an interpreter that
has PySpark and every dependency but not twophase (a venv seeing this venv's packages through
a directory of links, without twophase's own entries), as a worker host someone forgot would:
``register`` raises at once, before any query, saying what to install where. The other names
this venv's interpreter: the check passes and reports the version and interpreter it found.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import twophase
from integration_tests.spark_cluster import StandaloneCluster

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


def pythonWithoutTwophase(where: Path) -> Path:
    """A venv that sees this venv's packages but not twophase (no ``.pth`` of theirs runs)."""
    links = where / "packages"
    links.mkdir(parents=True)
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        name = entry.name.lower()
        if name.startswith(("twophase", "__editable__")) or name.endswith(".pth"):
            continue
        (links / entry.name).symlink_to(entry)
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "packages.pth").write_text(f"{links}\n")
    return python


@pytest.mark.timeout(300)
def test_a_cluster_whose_python_lacks_twophase_is_refused_at_register(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the repository must not reach a worker
    bare = pythonWithoutTwophase(tmp_path / "bare")
    missing = subprocess.run([str(bare), "-c", "import twophase"], capture_output=True)
    assert missing.returncode != 0, "the bare interpreter imports twophase"
    assert subprocess.run([str(bare), "-c", "import pyspark"]).returncode == 0
    cluster = StandaloneCluster(tmp_path, workers=1).start()
    work = tmp_path / "driver"
    work.mkdir()
    try:

        def run(python: Path, how: str) -> str:
            done = subprocess.run(
                [sys.executable, "-c", CHILD, cluster.url, str(python), how],
                capture_output=True,
                text=True,
                cwd=work,  # not the repository: a worker started here must not find twophase
                env={k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"},
                timeout=180,
            )
            assert done.returncode == 0, done.stdout + done.stderr[-3000:]
            return done.stdout

        refused = run(bare, "register")
        passed = run(Path(sys.executable), "check")
    finally:
        cluster.stop()
    assert "REFUSED the cluster's Python workers cannot import twophase" in refused, refused
    assert f"install twophase=={twophase.__version__}" in refused, refused
    assert "spark.pyspark.python (PYSPARK_PYTHON)" in refused, refused
    assert "checkExecutors=False" in refused and "REGISTERED" not in refused, refused
    [line] = [ln for ln in passed.splitlines() if ln.startswith("SEEN ")]
    seen = json.loads(line.removeprefix("SEEN "))
    assert seen["workers"] == f"{twophase.__version__} ({sys.executable})", seen
