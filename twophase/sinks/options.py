"""A sink's options, declared once: name, type, default, whether the checkpoint may keep it, doc.

Each built-in sink declares its options as a tuple of ``SinkOption`` (``OPTIONS`` in its
``settings`` module). Two things come from that one declaration: the allow-list of what the
checkpoint's ``sink.json`` keeps (``keptOptions``: never a secret, never an option nobody
declared) and the option table of the sink's page in docs/ (``optionsTable``; a test fails
when a page's table and the declaration disagree, ``make docs-options`` writes the tables).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

TYPES = ("string", "path", "integer", "seconds", "bytes", "boolean", "columns", "choice", "prefix")
"""The words a table's type column uses: ``prefix`` is a family of options (``fs.*``)."""


@dataclass(frozen=True)
class SinkOption:
    """One row of a sink's option table: one option, or several read alike, or a family.

    ``names`` are the documented spellings (camelCase as Spark's connectors; a family as
    ``fs.*``). Options are read case-insensitively, so what the checkpoint keeps is compared
    lower-cased. ``kept``: the names ``sink.json`` may keep; ``None`` keeps every name of a
    row that is not ``secret``, a family keeps only the members it lists.
    """

    names: tuple[str, ...]
    type: str
    default: str
    doc: str
    secret: bool = False
    kept: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"option {self.names}: type {self.type!r} is not one of {TYPES}")
        if self.secret and self.kept:
            raise ValueError(f"option {self.names}: a secret option keeps nothing")

    @property
    def isFamily(self) -> bool:
        return any(n.endswith(".*") for n in self.names)

    def keptNames(self) -> frozenset[str]:
        """The lower-cased names of this row that ``sink.json`` may keep."""
        if self.secret:
            return frozenset()
        if self.kept is not None:
            return frozenset(n.lower() for n in self.kept)
        if self.isFamily:
            return frozenset()
        return frozenset(n.lower() for n in self.names)

    def row(self) -> str:
        """The row of the docs table."""
        names = ", ".join(f"`{n}`" for n in self.names)
        return f"| {names} | {self.type} | {self.default} | {self.doc} |"


def keptOptions(options: Iterable[SinkOption]) -> frozenset[str]:
    """The allow-list of what ``sink.json`` keeps (lower-cased), from the declarations."""
    kept: set[str] = set()
    for option in options:
        kept |= option.keptNames()
    return frozenset(kept)


TABLE_HEAD = "| option | type | default | meaning |\n| --- | --- | --- | --- |"

SHARED_ROW = (
    "| `checkpointLocation`, `sinkId`, `commitRetries`, `commitTimeoutSeconds`, "
    "`logRetentionBatches` | | | as for every twophase sink "
    "([writing-a-sink.md](writing-a-sink.md#options-every-sink-understands)) |"
)
"""The last row of every table: the options the framework reads for every sink."""


def optionsTable(options: Iterable[SinkOption]) -> str:
    """The markdown table of a sink's options, as its docs page shows it."""
    return "\n".join([TABLE_HEAD, *(o.row() for o in options), SHARED_ROW])


BEGIN = "<!-- options of {name}: written from its declaration by `make docs-options` -->"
END = "<!-- end of options -->"


def tableBlock(name: str, options: Iterable[SinkOption]) -> str:
    """The block of a docs page that holds sink ``name``'s table, markers included."""
    return f"{BEGIN.format(name=name)}\n{optionsTable(options)}\n{END}"


__all__ = [
    "BEGIN",
    "END",
    "SHARED_ROW",
    "TYPES",
    "SinkOption",
    "keptOptions",
    "optionsTable",
    "tableBlock",
]
