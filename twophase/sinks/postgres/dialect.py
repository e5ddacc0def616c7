"""What is PostgreSQL's own in the postgres sink: how it reads and quotes names, and its gids.

The options, transaction naming, modes and key columns the sink shares with ``twophase.sql``
live in ``twophase.sinks.relational``; this module holds PostgreSQL's side of them: a table
name read by PostgreSQL's identifier rules (unquoted parts fold to lower case), an identifier
quoted for messages, the plain-name rule of a dead-letter table (63 characters, folded), and a
task attempt's gid (the shared layout with the run field, under the 200-byte ``GIDSIZE``). The
gid is not in psycopg's XA form (``<format>_<gtrid>_<bqual>``), so psycopg passes it as is.
"""

from __future__ import annotations

import re

from twophase.protocol import TransactionContext
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.relational.naming import TransactionName
from twophase.sinks.relational.options import NameRule

MAX_GID_BYTES = 199
"""PostgreSQL keeps gids in a 200-byte buffer that includes the terminating NUL."""

NAMES = NameRule(maxLength=63, folds=True)
"""A plain table name as PostgreSQL takes it unquoted: 63 characters, folded to lower case."""

_IDENT_PART = re.compile(r'\s*(?:"((?:[^"]|"")+)"|([^".\s]+))\s*')


def gidFor(ctx: TransactionContext) -> TransactionName:
    """A fresh gid for one task attempt: the shared layout with the run field."""
    gid = TransactionName.forContext(ctx, withRun=True)
    if len(str(gid).encode()) > MAX_GID_BYTES:  # cannot happen with validated parts
        raise ValueError(f"gid {gid} is longer than {MAX_GID_BYTES} bytes")
    return gid


def parseTableName(text: str) -> tuple[str, str]:
    """``schema.table`` as PostgreSQL reads it: unquoted parts fold to lower case, ``"Quoted"``
    parts keep their case (``""`` is a quote). An unqualified name means schema ``public``."""
    parts: list[str] = []
    pos = 0
    while True:
        match = _IDENT_PART.match(text, pos)
        if match is None or match.end() == pos:
            raise TwoPhaseConfigError(
                f"option dbtable={text!r} is not a table name; use <schema>.<table> (quote parts "
                'with double quotes to keep upper case or dots: "MySchema"."My Table")'
            )
        quoted, plain = match.group(1), match.group(2)
        parts.append(quoted.replace('""', '"') if quoted is not None else plain.lower())
        pos = match.end()
        if pos == len(text):
            break
        if text[pos] != ".":
            raise TwoPhaseConfigError(f"option dbtable={text!r}: unexpected {text[pos]!r}")
        pos += 1
    if len(parts) == 1:
        return "public", parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise TwoPhaseConfigError(
        f"option dbtable={text!r} has {len(parts)} parts; use <schema>.<table> (the database "
        "comes from the url)"
    )


def quoteIdent(name: str) -> str:
    """An identifier as SQL text, quoted only when PostgreSQL needs it (for messages)."""
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


__all__ = ["MAX_GID_BYTES", "NAMES", "gidFor", "parseTableName", "quoteIdent"]
