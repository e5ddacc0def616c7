"""Which sessions ``twophase.register`` checks the executors of: classic ones on a cluster."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import twophase
from twophase.spark.executors import isCluster, missingMessage


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
def test_only_a_cluster_master_is_checked(master: str, cluster: bool) -> None:
    assert isCluster(SimpleNamespace(sparkContext=SimpleNamespace(master=master))) is cluster


def test_a_session_without_a_spark_context_is_not_a_cluster() -> None:
    assert not isCluster(SimpleNamespace())  # Spark Connect: its server checks itself


def test_the_error_docs_deploying_md_shows_is_the_one_raised() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "deploying.md").read_text()
    [block] = re.findall(r"```\n(the cluster's Python workers cannot.*?)```", doc, re.DOTALL)
    expected = missingMessage(True, twophase.__version__, "/opt/venv/bin/python")
    assert " ".join(block.split()) == expected
