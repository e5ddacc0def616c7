"""What PostgreSQL holds for a postgres sink, for ``twophase doctor``: prepared and staged work.

The committer's own listing (``PostgresCommitter.listPrepared``, what its sweep aborts from),
two read-only queries on the sink's connection: ``pg_prepared_xacts`` rows whose gid starts
with the sink's prefix (``tp1:<sinkId>:``, in every database of the server; the age comes from
``prepared``), and the staging table's tokens with that prefix (rows committed by a task, not
moved into the target yet; the table keeps no time, so their age is unknown). Nothing is
changed. Then the grants the sink's options need (``privileges``), read with
``has_table_privilege`` and ``has_schema_privilege``: doctor names any that is missing.
Recovery rolls back every gid and deletes every token with the prefix in its own database, so
only a prepared transaction in another database is ``foreign``.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from twophase.clients.postgres import PostgresSinkError, errorText
from twophase.doctor.findings import CannotCheck, Inspection
from twophase.doctor.listing import listedHeld
from twophase.protocol import TransientCommitError
from twophase.protocol.errors import SinkFailure
from twophase.sinks.postgres.committer import preparedNames
from twophase.sinks.postgres.privileges import checkPrivileges

if TYPE_CHECKING:
    from twophase.sinks.postgres.committer import PostgresCommitter

handleKey = preparedNames
"""What a logged handle names on the server, as the committer's sweep names it."""


def inspect(committer: PostgresCommitter, sinkId: str, now: datetime) -> Inspection:
    """Read-only: the sink's prepared transactions (any database) and staged tokens, as the
    committer lists them for its sweep.

    Raises ``CannotCheck`` naming the server (never a password) when it cannot be reached or
    refuses the sink's credentials.
    """
    where = committer.settings.target.describe()
    try:
        inspection = Inspection("postgres", where, listedHeld(committer, "postgres", sinkId))
    except (PostgresSinkError, TransientCommitError) as exc:
        raise CannotCheck(
            f"{exc}. Fix: start the server, or give the connection again "
            "(--sink-option url=..., --sink-option password=..., or PGPASSWORD / ~/.pgpass)"
        ) from None
    except Exception as exc:  # psycopg errors: one line, redacted
        raise CannotCheck(
            f"postgres at {where}: cannot read pg_prepared_xacts or the staging table: "
            f"{errorText(exc)}. Fix: connect as the sink's user (or one that may read them)"
        ) from None
    inspection.grants, inspection.grantsMissing = grantsOf(committer)
    return inspection


def grantsOf(committer: PostgresCommitter) -> tuple[str, bool]:
    """What the sink's role lacks of the grants it needs (``privileges``), read-only, in
    one line, and whether anything is missing; or why it could not look."""
    try:
        with committer._connection("doctor's check of the grants") as conn:
            checkPrivileges(conn, committer.settings)
    except PostgresSinkError as exc:
        if exc.reason is SinkFailure.CREDENTIALS:
            return str(exc), True
        return f"cannot look: {exc}", False
    except Exception as exc:  # psycopg errors: one line, redacted
        return f"cannot look: {type(exc).__name__}: {errorText(exc)}", False
    return "the sink's role holds every grant its options need (docs/security.md)", False
