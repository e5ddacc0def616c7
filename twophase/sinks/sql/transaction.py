"""The sql sink's task transaction: what one task attempt holds while it writes and prepares."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
from sqlalchemy.engine import Connection, Engine

from twophase.protocol import Handle, TransactionContext


@dataclass(frozen=True)
class SentRows:
    """The rows of the ``INSERT`` running: the task's row of its first, how many, and how to
    send rows ``start:stop`` of them again on their own (to find the one refused)."""

    first: int
    count: int
    send: Callable[[int, int], None]


@dataclass(eq=False)
class SqlTransaction:
    """One task attempt's transaction: its xid, connection and insert statement.

    Lives in one executor task only (holds a connection); never pickled. The connection is
    taken at the first non-empty record batch, so an empty partition costs nothing; ``begun``
    while the two-phase transaction is open (neither prepared nor rolled back).
    """

    ctx: TransactionContext
    xid: str
    conn: Connection | None = None
    engine: Engine | None = None
    begun: bool = False
    schema: pa.Schema | None = None
    statement: str = ""
    parts: tuple[str, str] = ("", "")
    backslashEscapes: bool = True
    rows: int = 0
    state: str = "open"
    handle: Handle | None = None
    batch: pa.RecordBatch | None = None
    """The record batch being written (its first row is the task's row ``rows``)."""
    sent: SentRows | None = None


__all__ = ["SentRows", "SqlTransaction"]
