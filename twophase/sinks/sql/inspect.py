"""What the database holds for an sql sink, for ``twophase doctor``: its prepared transactions.

The committer's own listing (``SqlCommitter.listPrepared``, what its sweep aborts from), one
read-only query on the sink's connection: ``XA RECOVER`` (MySQL/MariaDB) or
``pg_prepared_xacts`` of the sink's database (PostgreSQL), kept to the xids that start with
the sink's prefix (``tp1:<sinkId>:``). XA keeps no preparation time, so the age is unknown
there. Nothing is changed; recovery rolls back every xid with the prefix, so none is
``foreign``.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from twophase.doctor.findings import CannotCheck, Inspection
from twophase.doctor.listing import listedHeld
from twophase.protocol import TransientCommitError
from twophase.sinks.sql.committer import preparedNames
from twophase.sinks.sql.dialect import DRIVER_ERRORS, errorMessage
from twophase.sinks.sql.errors import SqlSinkError

if TYPE_CHECKING:
    from twophase.sinks.sql.committer import SqlCommitter

handleKey = preparedNames
"""What a logged handle names on the server, as the committer's sweep names it."""


def inspect(committer: SqlCommitter, sinkId: str, now: datetime) -> Inspection:
    """Read-only: the sink's prepared transactions. ``CannotCheck`` names the server (never
    a password) when it cannot be reached, refuses the login or the listing."""
    where = committer.settings.describe()
    try:
        return Inspection("sql", where, listedHeld(committer, "sql", sinkId))
    except (SqlSinkError, TransientCommitError) as exc:
        raise CannotCheck(
            f"{exc}. Fix: start the server, or give the connection again "
            "(--sink-option url=..., --sink-option password=...)"
        ) from None
    except DRIVER_ERRORS as exc:
        raise CannotCheck(
            f"sql at {where}: cannot list prepared transactions: {errorMessage(exc)}. Fix: "
            "connect as the sink's user (MySQL 8 needs XA_RECOVER_ADMIN)"
        ) from None


__all__ = ["handleKey", "inspect"]
