"""What the database holds for an sql sink, for ``twophase doctor``: its prepared transactions.

One read-only query on the sink's connection: ``XA RECOVER`` (MySQL/MariaDB) or
``pg_prepared_xacts`` of the sink's database (PostgreSQL), kept to the xids that start with
the sink's prefix (``tp1:<sinkId>:``). XA keeps no preparation time, so the age is unknown
there. Nothing is changed; recovery (``SqlCommitter.recoverAndAbort``) rolls back every xid
with the prefix, so none is ``foreign``.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa

from twophase.doctor.findings import CannotCheck, Held, Inspection
from twophase.protocol import Handle
from twophase.sinks.relational.naming import TransactionName as SqlXid
from twophase.sinks.relational.naming import sinkPrefix
from twophase.sinks.sql.connections import connection, engineFor
from twophase.sinks.sql.dialect import DRIVER_ERRORS, errorMessage, preparedXids
from twophase.sinks.sql.errors import SqlSinkError
from twophase.sinks.sql.handles import KIND

if TYPE_CHECKING:
    from twophase.sinks.sql.committer import SqlCommitter


def handleKey(handle: Handle) -> str | None:
    """What a logged handle names on the server: its xid."""
    if handle.get("kind") != KIND:
        return None
    xid = handle.get("xid")
    return xid if isinstance(xid, str) else None


def inspect(committer: SqlCommitter, sinkId: str, now: datetime) -> Inspection:
    """Read-only: the sink's prepared transactions. ``CannotCheck`` names the server (never
    a password) when it cannot be reached, refuses the login or the listing."""
    s = committer.settings
    where = s.describe()
    since: dict[str, datetime] = {}
    try:
        engine = engineFor(s.url, pooled=False, connectTimeout=5, socketTimeout=s.socketTimeout)
        with connection(engine, "doctor", autocommit=True) as conn:
            xids = preparedXids(conn, s.family, sinkPrefix(sinkId))
            if s.family == "postgresql" and xids:
                rows = conn.execute(
                    sa.text("SELECT gid, prepared FROM pg_prepared_xacts WHERE gid = ANY(:g)"),
                    {"g": xids},
                )
                since = {str(g): p for g, p in rows}
    except SqlSinkError as exc:
        raise CannotCheck(
            f"{exc}. Fix: start the server, or give the connection again "
            "(--sink-option url=..., --sink-option password=...)"
        ) from None
    except DRIVER_ERRORS as exc:
        raise CannotCheck(
            f"sql at {where}: cannot list prepared transactions: {errorMessage(exc)}. Fix: "
            "connect as the sink's user (MySQL 8 needs XA_RECOVER_ADMIN)"
        ) from None
    inspection = Inspection("sql", where)
    for xid in xids:
        parts = SqlXid.parse(xid)
        ours = parts is not None and parts.sinkId == sinkId
        inspection.held.append(
            Held(
                system="sql",
                key=xid,
                what="prepared transaction",
                batchId=parts.batchId if ours and parts else None,
                partitionId=parts.partitionId if ours and parts else None,
                since=since.get(xid),
                detail=f"{s.url.get_backend_name()} database {s.url.database}",
                madeBySink=ours,
            )
        )
    return inspection


__all__ = ["handleKey", "inspect"]
