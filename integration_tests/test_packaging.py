"""The sdist and the wheel install into clean venvs; twophase then imports and its demo runs.

``python -m build`` builds the sdist from a copy of what the package is made of
(``pyproject.toml``, ``README.md``, ``twophase/``), then the wheel from that sdist, so a file
the sdist forgot fails here. Each is installed with ``pip --no-deps`` into a venv of its own,
outside the repository. The runtime dependencies are not downloaded again (pyspark alone is
~450 MB): the clean venv sees a directory of symlinks to exactly the wheel's dependency
closure (``Requires-Dist`` without extras, resolved recursively in this venv), added as a
plain path so none of its ``.pth`` files run. So nothing of the repository and no dev
dependency (pytest, ruff, mypy, duckdb, polars, build...) is importable there; ``pip check``
proves the closure satisfies the wheel's requirements.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import twophase
from integration_tests.spark_processes import REPO_ROOT

PACKAGE_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "twophase")
DEV_ONLY = ("pytest", "ruff", "mypy", "duckdb", "polars", "yaml", "build", "integration_tests")


def _run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(args, capture_output=True, text=True, **kwargs)
    assert run.returncode == 0, f"{args} failed ({run.returncode}):\n{run.stdout}\n{run.stderr}"
    return run


def _build(tmp: Path) -> tuple[Path, Path]:
    source = tmp / "source"
    source.mkdir()
    for name in PACKAGE_INPUTS:
        path = REPO_ROOT / name
        if path.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(path, source / name, ignore=ignore)
        else:
            shutil.copy2(path, source / name)
    dist = tmp / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)])
    (sdist,) = dist.glob("twophase-*.tar.gz")
    (wheel,) = dist.glob("twophase-*.whl")
    return sdist, wheel


def _requirements(text: list[str]) -> list[str]:
    """Names required without any extra (markers evaluated for this interpreter)."""
    names = []
    for line in text:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            names.append(req.name)
            names += [f"{req.name}[{extra}]" for extra in req.extras]
    return names


def _closure(wheel: Path) -> list[metadata.Distribution]:
    """The distributions of this venv the wheel needs at run time, recursively."""
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        lines = z.read(name).decode().splitlines()
    pending = _requirements(
        [ln.split(": ", 1)[1] for ln in lines if ln.startswith("Requires-Dist:")]
    )
    found: dict[str, metadata.Distribution] = {}
    visited: set[str] = set()
    while pending:
        spec = pending.pop()
        if spec in visited:
            continue
        visited.add(spec)
        base, _, extra = spec.partition("[")
        key = canonicalize_name(base)
        dist = found.get(key) or metadata.distribution(base)
        found[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            env = {"extra": extra.rstrip("]")}
            if req.marker is None or req.marker.evaluate(env):
                pending.append(req.name)
                pending += [f"{req.name}[{e}]" for e in req.extras]
    return list(found.values())


def _linkClosure(dists: list[metadata.Distribution], target: Path) -> None:
    """Symlink each distribution's top-level files and directories into ``target``."""
    target.mkdir()
    for dist in dists:
        root = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        for top in tops - {"..", "__pycache__"}:
            if (root / top).exists() and not (target / top).exists():
                (target / top).symlink_to(root / top)


def _cleanVenv(path: Path, closure: Path) -> Path:
    _run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    python = path / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    Path(site.stdout.strip(), "runtime-deps.pth").write_text(f"{closure}\n")
    return python


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "pip", "--python", str(python), *args])


def _cleanEnv() -> dict[str, str]:
    """This environment without what points into the repository, this venv or Spark Connect."""
    drop = {"PYTHONPATH", "SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV"}
    drop |= {"SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_API_MODE"}
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("TWOPHASE_")}


IMPORT_CHECK = """
import importlib.util, sys, twophase
assert twophase.__version__ == sys.argv[1], twophase.__version__
assert twophase.__file__.startswith(sys.prefix), twophase.__file__
present = [m for m in sys.argv[2:] if importlib.util.find_spec(m) is not None]
assert not present, f"dev dependencies importable: {present}"
import twophase.spark.declared, twophase.spark.connect
import twophase.sinks.postgres, twophase.sinks.kafka
print(twophase.__file__)
"""


def test_the_wheel_and_the_sdist_install_into_clean_venvs_and_the_demo_runs(
    tmp_path: Path,
) -> None:
    sdist, wheel = _build(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        licenses = [n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert licenses, "the wheel carries no LICENSE file"
        assert "Apache License" in z.read(licenses[0]).decode()
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        assert "License-Expression: Apache-2.0" in z.read(meta).decode().splitlines()
    closure = tmp_path / "runtime-deps"
    _linkClosure(_closure(wheel), closure)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = _cleanEnv()
    for kind, artifact in (("sdist", sdist), ("wheel", wheel)):
        python = _cleanVenv(tmp_path / f"venv-{kind}", closure)
        # The sdist builds its wheel in pip's isolated build environment (setuptools only).
        _pip(python, "install", "--no-deps", str(artifact))
        _pip(python, "check")
        run = _run(
            [str(python), "-c", IMPORT_CHECK, twophase.__version__, *DEV_ONLY], cwd=work, env=env
        )
        assert str(tmp_path / f"venv-{kind}") in run.stdout, run.stdout
    # The console script of the wheel's venv (the last one).
    demo = _run(
        [str(python.parent / "twophase"), "demo", "--dir", str(work / "demo")]
        + ["--rows", "8000", "--rows-per-batch", "2000"],
        cwd=work,
        env=env,
        timeout=300,
    )
    assert "EXACTLY ONCE" in demo.stdout, demo.stdout + demo.stderr
