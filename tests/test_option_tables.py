"""Each sink's option table in docs/ is its declaration, rendered; ``--write`` renders them.

``make docs-options`` runs this file with ``--write`` after a declaration changes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from twophase.options import (
    BEGIN,
    END,
    SHARED_NAME,
    SHARED_OPTIONS,
    SinkOption,
    keptOptions,
    tableBlock,
)
from twophase.redaction import SHARED_SAFE_OPTIONS
from twophase.sinks.registry import SINKS, SinkSpec

ROOT = Path(__file__).resolve().parent.parent
DECLARED = [s for s in SINKS if s.options is not None]
TABLES = [
    (SHARED_NAME, "docs/writing-a-sink.md", SHARED_OPTIONS),
    *((s.name(), s.page or "", s.declaredOptions()) for s in DECLARED),
]
"""Each table in docs/: whose options, on which page, declared where."""


def _block(name: str) -> re.Pattern[str]:
    return re.compile(re.escape(BEGIN.format(name=name)) + r".*?" + re.escape(END), re.S)


def writeTables() -> list[str]:
    """Rewrite every declared table in its page; return the pages changed."""
    changed = []
    for name, page, options in TABLES:
        text = (ROOT / page).read_text()
        found = _block(name).search(text)
        assert found is not None, f"{page} has no block of {name}'s options"
        new = text[: found.start()] + tableBlock(name, options) + text[found.end() :]
        if new != text:
            (ROOT / page).write_text(new)
            changed.append(page)
    return changed


@pytest.mark.parametrize("name, page, options", TABLES, ids=[t[0] for t in TABLES])
def test_the_docs_table_is_the_declaration(
    name: str, page: str, options: tuple[SinkOption, ...]
) -> None:
    found = _block(name).findall((ROOT / page).read_text())
    assert len(found) == 1, f"{page} needs one block of {name}'s options"
    assert found[0] == tableBlock(name, options), (
        f"{page}'s table of {name}'s options differs from its declaration: run make docs-options"
    )


def test_every_sink_keeps_the_shared_options_the_declaration_keeps() -> None:
    assert keptOptions(SHARED_OPTIONS) == SHARED_SAFE_OPTIONS
    assert "twophase.rewritemismatch" not in SHARED_SAFE_OPTIONS


@pytest.mark.parametrize("spec", DECLARED, ids=lambda s: s.kind)
def test_the_checkpoint_keeps_what_the_declaration_keeps(spec: SinkSpec) -> None:
    declared = spec.declaredOptions()
    assert all(isinstance(o, SinkOption) for o in declared)
    names = [n.lower() for o in declared for n in o.names]
    assert len(names) == len(set(names)), f"{spec.kind} declares an option twice"
    kept = keptOptions(declared)
    safe = spec.bindingClass().safeOptions
    # What the binding allows is what the declaration keeps, plus the options the sink's own
    # driver sets for its executors (never a user's); never a secret row.
    assert kept <= safe
    assert all(n.startswith("twophase.") for n in safe - kept), safe - kept
    secrets = {n.lower() for o in declared if o.secret for n in o.names}
    assert not secrets & safe


def test_a_family_keeps_only_its_members_and_a_secret_nothing() -> None:
    family = SinkOption(("fs.*",), "prefix", "", "storage", kept=("fs.endpoint_url",))
    secret = SinkOption(("password",), "string", "", "the password", secret=True)
    plain = SinkOption(("maxOpenFiles", "partSize"), "integer", "32", "files")
    assert keptOptions([family, secret, plain]) == {"fs.endpoint_url", "maxopenfiles", "partsize"}
    with pytest.raises(ValueError, match="type 'text' is not one of"):
        SinkOption(("x",), "text", "", "")
    with pytest.raises(ValueError, match="a secret option keeps nothing"):
        SinkOption(("token",), "string", "", "", secret=True, kept=("token",))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_option_tables.py --write")
    for page in writeTables():
        print(f"wrote the option table of {page}")
