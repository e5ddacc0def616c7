"""The compose cluster (`make compose-up`): docs/deploying.md's pipeline run as users deploy.

A driver container of its own, two workers whose executors run the sink, Spark's checkpoint
and the decision log on the S3 server. `make test-cluster` runs these (marker `cluster`); they
fail, never skip, when the cluster is not up.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from integration_tests.conftest import REPO_ROOT, S3Service

pytestmark = pytest.mark.cluster

COMPOSE = REPO_ROOT / "docker" / "compose.sh"
DOC = REPO_ROOT / "docs" / "deploying.md"
MASTER_UI = "http://127.0.0.1:8080/json/"


def compose(*words: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(COMPOSE), "compose", *words], capture_output=True, text=True, timeout=timeout
    )


def master() -> dict:
    with urllib.request.urlopen(MASTER_UI, timeout=10) as reply:
        return json.load(reply)


@pytest.fixture(scope="module")
def cluster() -> dict:
    """The Spark master's view, once both workers are alive."""
    try:
        state = master()
    except OSError as exc:
        pytest.fail(
            f"no Spark master at {MASTER_UI} ({exc}): start the cluster with `make compose-up`",
            pytrace=False,
        )
    alive = [w for w in state["workers"] if w["state"] == "ALIVE"]
    assert len(alive) == 2, f"the compose cluster should have two live workers: {state['workers']}"
    return state


def examplePipeline() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) == 1, f"{DOC} should hold one python example"
    return blocks[0]


@pytest.fixture
def example(tmp_path: Path, pg_url: str, s3: S3Service) -> Iterator[Path]:
    """docs/deploying.md's pipeline, in a folder to mount, its table and checkpoint removed
    before and after."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "pipeline.py").write_text(examplePipeline())

    def clean() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS deploying_example")
        fs = s3.filesystem()
        path = f"{s3.bucket}/checkpoints/deploying-example"
        if fs.exists(path):
            fs.rm(path, recursive=True)

    clean()
    yield job
    clean()


@pytest.mark.timeout(1200)
def test_the_deploying_example_runs_on_the_cluster_exactly_once(
    cluster: dict, example: Path, pg_url: str
) -> None:
    for run in (1, 2):
        done = compose(
            "run", "--rm", "-v", f"{example}:/job", "spark-driver", "python", "/job/pipeline.py"
        )
        assert done.returncode == 0, f"run {run} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
        with psycopg.connect(pg_url) as conn:
            rows, ids, low, high = conn.execute(
                "SELECT count(*), count(DISTINCT id), min(id), max(id) FROM deploying_example"
            ).fetchone()
        # The second run finds its checkpoint on S3 and writes nothing more.
        assert (rows, ids, low, high) == (50000, 50000, 0, 49999), f"after run {run}"
    apps = [a for a in master()["completedapps"] if a["name"] == "deploying-example"]
    assert apps, "the pipeline's application never reached the Spark master"
    # Its executors ran on the workers, not in the driver's container.
    assert all(a["cores"] > 0 for a in apps), apps
