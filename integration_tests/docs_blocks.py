"""The blocks of the docs for tests: a section's text blocks (real output), a fragment run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1] / "docs"


def sectionBlocks(doc: str, heading: str) -> list[str]:
    """The ```text blocks under ``heading`` (any level) of ``docs/<doc>``, up to the next
    heading of the same or a higher level, each as one line (wrapping undone)."""
    text = (DOCS / doc).read_text()
    found = re.search(rf"^(#+) {re.escape(heading)}\n", text, flags=re.MULTILINE)
    assert found, f"docs/{doc} has no section {heading!r}"
    level = len(found.group(1))
    rest = text[found.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, flags=re.MULTILINE)
    section = rest[: end.start()] if end else rest
    return [" ".join(b.split()) for b in re.findall(r"```text\n(.*?)```", section, re.DOTALL)]


def oneLine(text: str) -> str:
    return " ".join(text.split())


def runQueryFragment(spark: Any, code: str) -> None:
    """Run a docs fragment that starts a streaming ``query`` from a given ``spark``: until it
    has processed all its source has, then stopped."""
    scope: dict[str, Any] = {"spark": spark}
    exec(code, scope)
    query = scope["query"]
    try:
        query.processAllAvailable()
    finally:
        query.stop()
