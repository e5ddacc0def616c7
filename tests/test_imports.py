"""twophase imports fsspec and psycopg without reading the jars Spark puts on its Python
workers' path."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

PROBE = """
import json, sys
before = list(sys.path)
import twophase
from fsspec.registry import known_implementations as known
print(json.dumps({
    "restored": sys.path == before,
    "fromJar": "tpjar" in known,
    "fromDir": "tpdir" in known,
}))
"""


def distribution(name: str, protocol: str) -> dict[str, str]:
    """The files of an installed distribution that registers an fsspec filesystem."""
    info = f"{name}-1.0.dist-info"
    return {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/entry_points.txt": f"[fsspec.specs]\n{protocol} = {name}:FileSystem\n",
    }


def test_jars_on_the_path_are_not_read_for_entry_points(tmp_path: Path) -> None:
    jar = tmp_path / "org.example_library-1.0.jar"
    with zipfile.ZipFile(jar, "w") as archive:
        for name, text in distribution("jarred", "tpjar").items():
            archive.writestr(name, text)
        for i in range(2000):
            archive.writestr(f"org/example/C{i}.class", b"\xca\xfe\xba\xbe")
    plain = tmp_path / "site"
    for name, text in distribution("plain", "tpdir").items():
        (plain / name).parent.mkdir(parents=True, exist_ok=True)
        (plain / name).write_text(text)
    env = {"PYTHONPATH": f"{jar}:{plain}:{Path(__file__).resolve().parents[1]}"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"restored": True, "fromJar": False, "fromDir": True}


PSYCOPG_PROBE = """
import json
import twophase.sinks.postgres
import psycopg_binary
print(json.dumps({"version": psycopg_binary.__version__}))
"""


def test_psycopg_does_not_read_its_version_from_a_jar(tmp_path: Path) -> None:
    jar = tmp_path / "org.example_other-1.0.jar"
    with zipfile.ZipFile(jar, "w") as archive:
        info = "psycopg_binary-0.0.1.dist-info"
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: psycopg-binary\n"
                         "Version: 0.0.1\n")  # fmt: skip
    env = {"PYTHONPATH": f"{jar}:{Path(__file__).resolve().parents[1]}"}
    out = subprocess.run(
        [sys.executable, "-c", PSYCOPG_PROBE], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["version"] != "0.0.1"
