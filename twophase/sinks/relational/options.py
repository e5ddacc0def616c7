"""The options the relational sinks share, read the same way with the same errors in both.

The postgres sink and the sql sink take the target as ``dbtable`` (Spark's JDBC name) or
``table``, ``mode`` with ``keyColumns``, ``createTable``, ``badRecords``,
``connectRetrySeconds`` and ``socketTimeout``; ``readShared`` parses them once. What differs
between databases (how a table name is read, how long a name may be, whether an unquoted name
folds to lower case) comes from the sink's dialect as a ``NameRule``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from twophase.options import SinkOption
from twophase.settings import TwoPhaseConfigError, boolOption, floatOption, optionOf

MODES = ("append", "upsert")
"""Values of option ``mode``: rows added (``append``), or updated where their keys exist."""

TABLE = SinkOption(
    ("dbtable", "table"),
    "string",
    "required",
    "the target, `table` or `schema.table`, in the database's identifier rules; both options "
    "given must name the same table",
)
KEY_COLUMNS = SinkOption(
    ("keyColumns",),
    "columns",
    "-",
    'the primary key or unique index columns, comma separated (a name may be quoted with `"` '
    "or backticks); required by upsert, refused in append mode",
)
CREATE_TABLE = SinkOption(
    ("createTable",),
    "boolean",
    "`false`",
    "create a missing table from the stream's schema (`keyColumns` as primary key)",
)
CONNECT = SinkOption(
    ("connectTimeout", "connectRetrySeconds"),
    "seconds",
    "`10`, `30`",
    "seconds for one connection attempt; how long tasks and the driver's checks keep retrying "
    "to connect to a server that is down or restarting (fractions allowed; 0: try once)",
)
BAD_RECORDS = SinkOption(
    ("badRecords",),
    "string",
    "`fail`",
    "`fail`: a row the database refuses fails the batch, naming the row and the fix; or the "
    "name of a dead-letter table beside the target (created when missing), e.g. "
    "`events_rejected`: refused rows go there in the task's own transaction and the query "
    "goes on",
)
PASSWORD = SinkOption(
    ("password",),
    "string",
    "from the URL",
    "overrides the URL's; never written to the checkpoint (`twophase recover` takes it again)",
    secret=True,
)
"""The option rows both relational sinks declare alike (``OPTIONS`` in their settings)."""


@dataclass(frozen=True)
class NameRule:
    """How a database takes a plain table name: at most ``maxLength`` characters, folded to
    lower case when ``folds`` (PostgreSQL's unquoted names), else kept as written."""

    maxLength: int
    folds: bool

    def plain(self, text: str) -> str | None:
        """``text`` as the database names it, or ``None`` when it is not a plain name."""
        if not re.fullmatch(rf"[A-Za-z_][A-Za-z0-9_$]{{0,{self.maxLength - 1}}}", text):
            return None
        return text.lower() if self.folds else text


@dataclass(frozen=True)
class SharedOptions:
    """The shared options of one relational sink, parsed and checked."""

    tableText: str
    """The target as given (``dbtable`` or ``table``), for the dialect to read."""
    mode: str
    keyColumns: tuple[str, ...]
    createTable: bool
    badRecords: str | None
    """The dead-letter table, as the database names it; ``None``: ``fail``."""
    connectRetrySeconds: float
    socketTimeout: float


def readShared(
    options: Mapping[str, str], *, sink: str, names: NameRule, socketTimeout: float = 120.0
) -> SharedOptions:
    """Parse the shared options of the ``sink`` sink; errors name the option and the fix."""
    tableText = tableOption(options, sink)
    mode = (optionOf(options, "mode") or "append").strip().lower()
    keysText = (optionOf(options, "keyColumns") or "").strip()
    keys = splitColumns(keysText) if keysText else ()
    checkModeAndKeys(mode, keys)
    return SharedOptions(
        tableText=tableText,
        mode=mode,
        keyColumns=keys,
        createTable=boolOption(options, "createTable", False),
        badRecords=badRecordsOption(options, names),
        connectRetrySeconds=floatOption(options, "connectRetrySeconds", 30.0, zero=True),
        socketTimeout=floatOption(options, "socketTimeout", socketTimeout, zero=True),
    )


def tableOption(options: Mapping[str, str], sink: str) -> str:
    """The target table's text: option ``dbtable`` (Spark's JDBC name) or ``table``; both
    given must name the same table."""
    text = sparkNamed(options, "dbtable", "table")
    if not text:
        raise TwoPhaseConfigError(
            f"the {sink} sink needs option dbtable (or table): the target table, e.g. "
            '.option("dbtable", "<schema>.<table>")'
        )
    return text


def sparkNamed(options: Mapping[str, str], spark: str, ours: str) -> str | None:
    """An option that has Spark's JDBC name ``spark`` and the name ``ours``: its value under
    either (stripped); both given must say the same."""
    first = (optionOf(options, spark) or "").strip()
    second = (optionOf(options, ours) or "").strip()
    if first and second and first != second:
        raise TwoPhaseConfigError(
            f"options {spark}={first!r} and {ours}={second!r} disagree; give one of them "
            f"({spark}, as Spark's JDBC writer names it, or {ours})"
        )
    return first or second or None


def checkModeAndKeys(mode: str, keys: tuple[str, ...]) -> None:
    """Refuse an unknown mode, upsert without ``keyColumns``, and ``keyColumns`` in append."""
    if mode not in MODES:
        raise TwoPhaseConfigError(f"option mode={mode!r} is not supported; use append or upsert")
    if mode == "upsert" and not keys:
        raise TwoPhaseConfigError(
            "option mode=upsert needs option keyColumns: the comma-separated columns of the "
            "table's primary key or unique index that identify a row"
        )
    if mode == "append" and keys:
        raise TwoPhaseConfigError(
            "option keyColumns is only used with mode=upsert; remove it, or set mode=upsert to "
            "update rows whose keys exist"
        )


def checkKeysInStream(keys: tuple[str, ...], columns: list[str]) -> None:
    """Driver, before a batch: every ``keyColumns`` name is a column of the stream."""
    missing = [k for k in keys if k not in columns]
    if missing:
        raise TwoPhaseConfigError(
            f"option keyColumns names {missing}, which the stream does not have (its columns: "
            f"{columns}); fix keyColumns or add the columns"
        )


def splitColumns(text: str) -> tuple[str, ...]:
    """Option ``keyColumns``: names separated by commas, each as written (a name may be
    quoted with ``"`` or backticks, which are dropped)."""
    names = tuple(_unquoted(part.strip()) for part in text.split(","))
    if not all(names) or len(set(names)) != len(names):
        raise TwoPhaseConfigError(
            f"option keyColumns={text!r} must list distinct, non-empty column names separated "
            "by commas"
        )
    return names


def _unquoted(name: str) -> str:
    if len(name) >= 2 and name[0] == name[-1] and name[0] in '"`':
        return name[1:-1]
    return name


def badRecordsOption(options: Mapping[str, str], names: NameRule) -> str | None:
    """Option ``badRecords``: ``fail`` (``None``) or the plain name of a dead-letter table
    beside the target, as the database names it."""
    raw = (optionOf(options, "badRecords") or "fail").strip()
    if raw.lower() == "fail":
        return None
    name = names.plain(raw)
    if name is None:
        raise TwoPhaseConfigError(
            f"option badRecords={raw!r} must be fail (the default: a rejected row fails the "
            "batch) or the plain name of a dead-letter table beside the target (letters, "
            f"digits, '_' or '$', at most {names.maxLength}, no schema: it lives in the "
            "target's), e.g. badRecords=orders_rejected"
        )
    return name


def checkBadRecords(badRecords: str | None, table: str, taken: Mapping[str, str]) -> None:
    """Refuse a dead-letter table that is one the sink already writes: ``taken`` maps such a
    table's name to what it is (``the target table``, ``the marker table``)."""
    if badRecords is None or badRecords not in taken:
        return
    raise TwoPhaseConfigError(
        f"option badRecords={badRecords} names {taken[badRecords]}: choose another table for "
        f"the rows the database rejects, e.g. badRecords={table}_rejected"
    )


__all__ = [
    "MODES",
    "NameRule",
    "SharedOptions",
    "badRecordsOption",
    "checkBadRecords",
    "checkKeysInStream",
    "checkModeAndKeys",
    "readShared",
    "sparkNamed",
    "splitColumns",
    "tableOption",
]
