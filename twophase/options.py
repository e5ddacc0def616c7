"""Options declared once: name, type, default, whether the checkpoint may keep it, one line of doc.

The options every sink shares are declared here (``SHARED_OPTIONS``); each built-in sink
declares its own as a tuple of ``SinkOption`` (``OPTIONS`` in its ``settings`` module). Two
things come from a declaration: the allow-list of what the checkpoint's ``sink.json`` keeps
(``keptOptions``: never a secret, never an option nobody declared) and the option table in
docs/ (``optionsTable``; a test fails when a page's table and the declaration disagree,
``make docs-options`` writes the tables).
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

SHARED_OPTIONS = (
    SinkOption(
        ("checkpointLocation",),
        "path",
        "required",
        "the decision log lives in `<checkpointLocation>/twophase/<sinkId>/`",
    ),
    SinkOption(
        ("sinkId",),
        "string",
        "derived from the checkpoint location",
        "names the log and every transaction id: 1-48 letters, digits, `_`, `.`, `-`",
    ),
    SinkOption(
        ("twophase.logLocation",),
        "path",
        "under the checkpoint",
        "put the log elsewhere (any fsspec URL)",
    ),
    SinkOption(
        ("twophase.resetLog",),
        "boolean",
        "`false`",
        "take over a log written by another query id (after finishing its decisions)",
    ),
    SinkOption(
        ("twophase.unfencedLogStore",),
        "boolean",
        "`false`",
        "`true` accepts a log store without a create-if-absent (not local disk or S3), where "
        "two drivers running at once could both decide a batch; otherwise such a store is "
        "refused ([protocol.md](protocol.md) section 5a)",
    ),
    SinkOption(
        ("commitRetries", "commitTimeoutSeconds"),
        "integer",
        "`8`, `120`",
        "bounds of the driver's retries of `TransientCommitError`: retries of one handle, and "
        "seconds for one batch's commits, retries included",
    ),
    SinkOption(("logRetentionBatches",), "integer", "`100`", "finished batches kept in the log"),
    SinkOption(
        ("twophase.rewriteMismatch",),
        "choice",
        "`fail`",
        "`write` accepts, once, a replay that gives other records for a lost Kafka "
        "transaction ([kafka.md](kafka.md)); not kept: give it again for the start that needs it",
        kept=(),
    ),
)
"""The options the framework reads for every sink (``twophase.settings.SinkSettings``)."""

SHARED_ROW = (
    "| `checkpointLocation`, `sinkId`, `commitRetries`, `commitTimeoutSeconds`, "
    "`logRetentionBatches` | | | as for every twophase sink "
    "([writing-a-sink.md](writing-a-sink.md#options-every-sink-understands)) |"
)
"""The last row of every table: the options the framework reads for every sink."""


SHARED_NAME = "every twophase sink"
"""The name of the shared options' block (docs/writing-a-sink.md)."""


def optionsTable(options: Iterable[SinkOption], shared: bool = True) -> str:
    """The markdown table of a sink's options, as its docs page shows it; ``shared`` adds the
    row that points at the options every sink shares."""
    rows = [o.row() for o in options]
    return "\n".join([TABLE_HEAD, *rows, *([SHARED_ROW] if shared else [])])


BEGIN = "<!-- options of {name}: written from its declaration by `make docs-options` -->"
END = "<!-- end of options -->"


def tableBlock(name: str, options: Iterable[SinkOption]) -> str:
    """The block of a docs page that holds sink ``name``'s table, markers included (the shared
    options' own block, ``SHARED_NAME``, has no row pointing at itself)."""
    table = optionsTable(options, shared=name != SHARED_NAME)
    return f"{BEGIN.format(name=name)}\n{table}\n{END}"


__all__ = [
    "BEGIN",
    "END",
    "SHARED_NAME",
    "SHARED_OPTIONS",
    "SHARED_ROW",
    "TYPES",
    "SinkOption",
    "keptOptions",
    "optionsTable",
    "tableBlock",
]
