"""Earlier releases of twophase, each built once into a venv of its own, for upgrade tests.

A release is this repository at a pinned commit: ``git archive`` of its ``twophase/`` unpacked
under ``$TWOPHASE_CACHE/releases/<commit>/src``, and a venv made ``--without-pip`` whose
``.pth`` puts that source first on ``sys.path`` and this venv's site-packages (PySpark,
pyarrow, the clients) after it as a plain path, so that the editable install of the checkout's
twophase is not run. Building takes seconds and is done once per commit (a lock keeps two test
workers from building the same one). Run the release's Python from a directory outside the
checkout, with a ``PYTHONPATH`` that does not hold it: Spark's Python workers put their working
directory first on ``sys.path``.
"""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from integration_tests.spark_processes import REPO_ROOT

PREVIOUS = "5fb8b11"
"""The release before the persisted formats were versioned (the last commit landed before)."""

READY = "ready"


def cacheRoot() -> Path:
    return Path(os.environ.get("TWOPHASE_CACHE") or Path.home() / ".cache" / "twophase")


def releaseHome(commit: str = PREVIOUS) -> Path:
    """Where the release at ``commit`` is kept: ``src/twophase`` and ``venv/``."""
    return cacheRoot() / "releases" / commit


def releasePython(commit: str = PREVIOUS) -> Path:
    """The Python of a venv whose ``import twophase`` is the release at ``commit``; built on
    the first call and kept in ``$TWOPHASE_CACHE/releases/<commit>``."""
    home = releaseHome(commit)
    python = home / "venv" / "bin" / "python"
    if (home / READY).exists():
        return python
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f"{commit}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / READY).exists():
            _build(commit, home)
    return python


def _build(commit: str, home: Path) -> None:
    found = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        raise RuntimeError(
            f"this clone of twophase ({REPO_ROOT}) lacks commit {commit}, the release the "
            "upgrade test installs: fetch the full history (git fetch --unshallow, or a clone "
            "without --depth) and run the test again"
        )
    if home.exists():
        shutil.rmtree(home)  # a build that died halfway
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", commit, "twophase"],
        capture_output=True,
        check=True,
    ).stdout
    src = home / "src"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(src, filter="data")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(src)], check=True)
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = next(p for p in sys.path if p.endswith("site-packages") and "pyspark" in os.listdir(p))
    Path(site, "twophase-release.pth").write_text(
        f"import sys; sys.path.insert(0, {str(src)!r})\n{ours}\n"
    )
    check = subprocess.run(
        [str(python), "-c", "import twophase, pyspark; print(twophase.__file__)"],
        cwd=home,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
    )
    if check.returncode != 0 or not check.stdout.strip().startswith(str(src)):
        raise RuntimeError(f"the venv of release {commit} does not import it: {check.stderr}")
    (home / READY).write_text(f"{commit}\n")
