"""What the database holds for an sql sink, for ``twophase doctor``: its prepared transactions.

The committer's own listing (``SqlCommitter.listPrepared``, what its sweep aborts from), one
read-only query on the sink's connection: ``XA RECOVER`` (MySQL/MariaDB) or
``pg_prepared_xacts`` of the sink's database (PostgreSQL), kept to the xids that start with the
sink's prefix (``tp1:<sinkId>:``). XA keeps no preparation time, so the age is unknown there.
Then, on MySQL/MariaDB, the grants the sink's options need (``privileges``, read from
``information_schema``): doctor names any that is missing. Nothing is changed; recovery rolls
back every xid with the prefix, so none is ``foreign``.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from twophase.doctor.findings import CannotCheck, Inspection
from twophase.doctor.listing import listedHeld
from twophase.protocol import TransientCommitError
from twophase.protocol.errors import SinkFailure
from twophase.sinks.sql.committer import preparedNames
from twophase.sinks.sql.dialect import DRIVER_ERRORS, errorMessage
from twophase.sinks.sql.errors import SqlSinkError
from twophase.sinks.sql.privileges import checkPrivileges

if TYPE_CHECKING:
    from twophase.sinks.sql.committer import SqlCommitter

handleKey = preparedNames
"""What a logged handle names on the server, as the committer's sweep names it."""


def inspect(committer: SqlCommitter, sinkId: str, now: datetime) -> Inspection:
    """Read-only: the sink's prepared transactions. ``CannotCheck`` names the server (never
    a password) when it cannot be reached, refuses the login or the listing."""
    where = committer.settings.describe()
    try:
        inspection = Inspection("sql", where, listedHeld(committer, "sql", sinkId))
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

    if committer.settings.family == "mysql":
        inspection.grants, inspection.grantsMissing = grantsOf(committer)
    return inspection


def grantsOf(committer: SqlCommitter) -> tuple[str, bool]:
    """What the sink's user lacks of the grants it needs (``privileges``, MySQL/MariaDB),
    read-only, in one line, and whether anything is missing; or why it could not look."""
    try:
        with committer._connection("doctor's check of the grants") as conn:
            checkPrivileges(conn, committer.settings)
    except SqlSinkError as exc:
        if exc.reason is SinkFailure.CREDENTIALS:
            return str(exc), True
        return f"cannot look: {exc}", False
    except DRIVER_ERRORS as exc:
        return f"cannot look: the grants in information_schema: {errorMessage(exc)}", False
    return "the sink's user holds every grant its options need (docs/security.md)", False


__all__ = ["grantsOf", "handleKey", "inspect"]
