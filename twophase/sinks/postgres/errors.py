"""The postgres sink's errors: each names the batch, the table and the fix.

``PostgresSinkError`` (retrying the same work will not fix it) and
``PostgresUnavailableError`` (the server could not be reached) come from the PostgreSQL client,
which raises them while connecting; ``RowRejectedError`` and ``PreparedLimitError`` are the
sink's own. Each is a ``SinkSystemError`` naming PostgreSQL and the fix the command line gives.
"""

from __future__ import annotations

from twophase.clients.postgres import PostgresSinkError, PostgresUnavailableError


class RowRejectedError(PostgresSinkError):
    """PostgreSQL refused a row (constraint, NOT NULL, a value too long): names the batch,
    partition, the row's position in its task, the column or constraint and the fix, never
    the row's values; the server's error is chained without them (see ``rejections``)."""


class PreparedLimitError(PostgresSinkError):
    """A task would need more prepared transactions than the server allows; names the limit,
    the numbers and the fixes (commitMode, max_prepared_transactions, fewer partitions)."""


__all__ = [
    "PostgresSinkError",
    "PostgresUnavailableError",
    "PreparedLimitError",
    "RowRejectedError",
]
