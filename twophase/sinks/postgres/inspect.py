"""What PostgreSQL holds for a postgres sink, for ``twophase doctor``: prepared and staged work.

Two read-only queries on the sink's connection: ``pg_prepared_xacts`` rows whose gid starts
with the sink's prefix (``tp1:<sinkId>:``, in every database of the server; the age comes from
``prepared``), and the staging table's tokens with that prefix (rows committed by a task,
not moved into the target yet; the table keeps no time, so their age is unknown). Nothing is
changed. What recovery would do with each (``PostgresCommitter.recoverAndAbort``) sets the
``Held`` flags: it rolls back every gid and deletes every token with the prefix in its own
database, so only a prepared transaction in another database is ``foreign``.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from psycopg import sql

from twophase.clients.postgres import PostgresSinkError, connect, errorText
from twophase.doctor.findings import CannotCheck, Held, Inspection
from twophase.protocol import Handle
from twophase.sinks.postgres.handles import KIND, isStaged
from twophase.sinks.postgres.staging import TOKEN_COLUMN, StagingNames
from twophase.sinks.relational.naming import TransactionName as GlobalXid
from twophase.sinks.relational.naming import sinkPrefix

if TYPE_CHECKING:
    from twophase.sinks.postgres.committer import PostgresCommitter

CONNECT_SECONDS = 5
"""How long doctor waits for the server before it says it cannot check."""


def handleKey(handle: Handle) -> str | None:
    """What a logged handle names on the server: its staging token, else its gid."""
    if handle.get("kind") != KIND:
        return None
    key = handle.get("token") if isStaged(handle) else handle.get("gid")
    return key if isinstance(key, str) else None


def inspect(committer: PostgresCommitter, sinkId: str, now: datetime) -> Inspection:
    """Read-only: the sink's prepared transactions (any database) and staged tokens.

    Raises ``CannotCheck`` naming the server (never a password) when it cannot be reached or
    refuses the sink's credentials.
    """
    s = committer.settings
    where = s.target.describe()
    prefix = sinkPrefix(sinkId)
    try:
        conn = connect(s.target, s.secrets, autocommit=True, retrySeconds=0, what="doctor")
    except PostgresSinkError as exc:
        raise CannotCheck(
            f"{exc}. Fix: start the server, or give the connection again "
            "(--sink-option url=..., --sink-option password=..., or PGPASSWORD / ~/.pgpass)"
        ) from None
    try:
        with conn:
            inspection = Inspection("postgres", where)
            inspection.held.extend(_prepared(conn, prefix, sinkId))
            inspection.held.extend(_staged(conn, StagingNames.of(s), prefix, sinkId))
            return inspection
    except PostgresSinkError as exc:
        raise CannotCheck(f"postgres at {where}: {exc}") from None
    except Exception as exc:  # psycopg errors: one line, redacted
        raise CannotCheck(
            f"postgres at {where}: cannot read pg_prepared_xacts or the staging table: "
            f"{errorText(exc)}. Fix: connect as the sink's user (or one that may read them)"
        ) from None


def _prepared(conn: Any, prefix: str, sinkId: str) -> list[Held]:
    rows = conn.execute(
        "SELECT gid, prepared, database, database = current_database(), owner"
        " FROM pg_prepared_xacts WHERE starts_with(gid, %s) ORDER BY prepared",
        (prefix,),
    ).fetchall()
    held = []
    for gid, prepared, database, here, owner in rows:
        parts = GlobalXid.parse(str(gid))
        ours = parts is not None and parts.sinkId == sinkId
        held.append(
            Held(
                system="postgres",
                key=str(gid),
                what="prepared transaction",
                batchId=parts.batchId if ours and parts else None,
                partitionId=parts.partitionId if ours and parts else None,
                since=prepared,
                detail=f"database {database}, owner {owner}",
                foreign=None
                if here
                else f"it is prepared in database {database}, and recovery of this sink "
                "only connects to its own; run twophase recover with a url naming "
                f"database {database}",
                madeBySink=ours,
            )
        )
    return held


def _staged(conn: Any, names: StagingNames, prefix: str, sinkId: str) -> list[Held]:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (names.stagingText,)).fetchone()
    if row is None or not row[0]:
        return []
    like = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    rows = conn.execute(
        sql.SQL(
            "SELECT {token}, count(*) FROM {staging} WHERE {token} LIKE %s "
            "GROUP BY {token} ORDER BY {token}"
        ).format(staging=names.stagingId, token=sql.Identifier(TOKEN_COLUMN)),
        (like,),
    ).fetchall()
    held = []
    for token, count in rows:
        parts = GlobalXid.parse(str(token))
        ours = parts is not None and parts.sinkId == sinkId
        held.append(
            Held(
                system="postgres",
                key=str(token),
                what="staged rows",
                batchId=parts.batchId if ours and parts else None,
                partitionId=parts.partitionId if ours and parts else None,
                detail=f"{count} row(s) in {names.stagingText}",
                madeBySink=ours,
            )
        )
    return held
