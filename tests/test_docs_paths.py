"""Every file or folder that CONTRIBUTING.md and docs/architecture.md name in backticks exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = ("CONTRIBUTING.md", "docs/architecture.md", "docs/reliability.md")
PATH = re.compile(r"`((?:twophase|tests|integration_tests|bench|services|docs)/[\w./-]*)`")


def namedPaths(text: str) -> list[str]:
    """The repository paths a document names in backticks (no globs or placeholders)."""
    return [p for p in PATH.findall(text) if "<" not in p and "*" not in p]


def test_a_wrong_path_is_found() -> None:
    assert namedPaths("see `twophase/nowhere.py` and `bench/`") == ["twophase/nowhere.py", "bench/"]


@pytest.mark.parametrize("doc", DOCS)
def test_every_named_path_exists(doc: str) -> None:
    named = namedPaths((REPO / doc).read_text())
    assert named, f"{doc} names no path: the pattern no longer matches its style"
    missing = sorted({p for p in named if not (REPO / p).exists()})
    assert not missing, f"{doc} names paths that do not exist: {missing}"
