"""The postgres sink's errors: each names the batch, the table and the fix.

``PostgresSinkError`` (retrying the same work will not fix it) and
``PostgresUnavailableError`` (the server could not be reached) come from the PostgreSQL client,
which raises them while connecting; ``RowRejectedError`` is the sink's own.
"""

from __future__ import annotations

from twophase.clients.postgres import PostgresSinkError, PostgresUnavailableError


class RowRejectedError(PostgresSinkError):
    """PostgreSQL refused a row (constraint, NOT NULL, bad value); names batch, column, fix."""


__all__ = ["PostgresSinkError", "PostgresUnavailableError", "RowRejectedError"]
