"""Which sessions ``twophase.register`` checks the workers of, and how: a cluster, or locally."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import twophase
from twophase.spark.executors import isClassic, isCluster, missingMessage


@pytest.mark.parametrize(
    ("master", "cluster"),
    [
        ("local", False),
        ("local[2]", False),
        ("local[*, 4]", False),
        ("local-cluster[2,1,1024]", False),
        ("spark://spark-master:7077", True),
        ("yarn", True),
        ("k8s://https://kubernetes:443", True),
    ],
)
def test_every_classic_session_is_checked_a_cluster_by_the_probe_job(
    master: str, cluster: bool
) -> None:
    session = SimpleNamespace(sparkContext=SimpleNamespace(master=master))
    assert isClassic(session)  # register checks it: a local master through its interpreter
    assert isCluster(session) is cluster


def test_a_session_without_a_spark_context_is_not_checked_here() -> None:
    assert not isClassic(SimpleNamespace())  # Spark Connect: its server checks itself
    assert not isCluster(SimpleNamespace())


def test_the_error_docs_deploying_md_shows_is_the_one_raised() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "deploying.md").read_text()
    [block] = re.findall(r"```\n(the cluster's Python workers cannot.*?)```", doc, re.DOTALL)
    expected = missingMessage(True, twophase.__version__, "/opt/venv/bin/python")
    assert " ".join(block.split()) == expected
