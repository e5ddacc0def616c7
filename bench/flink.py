"""PyFlink for ``make bench``: its own venv and connector jars, cached, and running one job."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._common import (
    REPO,
    MemoryPeaks,
    sampleMemory,
)
from bench.session import log

FLINK_VERSION = "1.20.3"
FLINK_DIR = REPO / "bench" / "flink"


def flinkPython(cache: Path) -> Path:
    """The interpreter of a venv with apache-flink, created once in the cache."""
    venv = cache / "flink-venv"
    marker = venv / f".installed-{FLINK_VERSION}"
    if not marker.is_file():
        log(f"creating {venv} with apache-flink=={FLINK_VERSION} (once; a few minutes)")
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, f"apache-flink=={FLINK_VERSION}"], check=True)
        marker.touch()
    return venv / "bin" / "python"


def flinkJars(cache: Path, python: Path) -> list[str]:
    """Connector jars from Maven Central (bench/flink/pom.xml) plus the compiled helper."""
    pom = FLINK_DIR / "pom.xml"
    java = FLINK_DIR / "src" / "io" / "twophase" / "bench" / "BenchJdbc.java"
    digest = hashlib.sha1(pom.read_bytes() + java.read_bytes()).hexdigest()[:10]
    jars = cache / f"flink-jars-{digest}"
    helper = jars / "twophase-bench-jdbc.jar"
    if not helper.is_file():
        log(f"resolving Flink connector jars into {jars} (once)")
        shutil.rmtree(jars, ignore_errors=True)
        mvn = ["mvn", "-q", "-f", str(pom), "dependency:copy-dependencies"]
        args = ["-DincludeScope=runtime", f"-DoutputDirectory={jars}"]
        subprocess.run([*mvn, *args], check=True)
        site = subprocess.run(
            [str(python), "-c", "import pyflink, os; print(os.path.dirname(pyflink.__file__))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        classes = Path(tempfile.mkdtemp(prefix="bench-jdbc-"))
        classpath = f"{jars}/*:{site}/lib/*"
        subprocess.run(["javac", "-d", str(classes), "-cp", classpath, str(java)], check=True)
        subprocess.run(["jar", "cf", str(helper), "-C", str(classes), "."], check=True)
        shutil.rmtree(classes, ignore_errors=True)
    # Flink's own slf4j binding is in its lib/; a second slf4j-api would only add noise.
    return sorted(str(j) for j in jars.glob("*.jar") if not j.name.startswith("slf4j-api"))


def runFlink(
    python: Path, jars: list[str], job: str, rows: int, parallelism: int, checkpointMs: int,
    target: str, warmTarget: str, extra: list[str], logFile: Path,
) -> tuple[float, MemoryPeaks]:  # fmt: skip
    command = [
        str(python), str(REPO / "bench" / "flink_jobs.py"), job, "--rows", str(rows),
        "--parallelism", str(parallelism), "--checkpoint-ms", str(checkpointMs),
        "--jars", ",".join(jars), "--target", target, "--warm-target", warmTarget, *extra,
    ]  # fmt: skip
    with logFile.open("w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
        with sampleMemory(proc.pid) as peaks:
            try:
                out, _ = proc.communicate(timeout=900)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise RuntimeError("timed out after 900 s") from None
    if proc.returncode != 0:
        lines = [
            line.strip()
            for line in logFile.read_text(errors="replace").splitlines()
            if "Exception" in line or "Error" in line
        ]
        raise RuntimeError((lines[-1] if lines else f"exit {proc.returncode}")[:200])
    result = json.loads(out.strip().splitlines()[-1])
    return float(result["seconds"]), peaks
