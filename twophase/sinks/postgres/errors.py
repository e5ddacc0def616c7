"""The postgres sink's errors: each names the batch, the table and the fix.

``PostgresSinkError`` (retrying the same work will not fix it) and
``PostgresUnavailableError`` (the server could not be reached) come from the PostgreSQL client,
which raises them while connecting; ``RowRejectedError`` and ``PreparedLimitError`` are the
sink's own.
"""

from __future__ import annotations

from twophase.clients.postgres import PostgresSinkError, PostgresUnavailableError


class RowRejectedError(PostgresSinkError):
    """PostgreSQL refused a row (constraint, NOT NULL, bad value); names batch, column, fix."""


class PreparedLimitError(PostgresSinkError):
    """A task would need more prepared transactions than the server allows; names the limit,
    the numbers and the fixes (commitMode, max_prepared_transactions, fewer partitions)."""


__all__ = [
    "PostgresSinkError",
    "PostgresUnavailableError",
    "PreparedLimitError",
    "RowRejectedError",
]
