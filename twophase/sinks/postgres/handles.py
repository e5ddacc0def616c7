"""The postgres handle: what a task's ``preCommit`` returns and what a committer reads back.

Format (JSON, in the decision log)::

    {"kind": "postgres", "gid": <gid or null when the task had no rows>,
     "xid": <the transaction's id, text>, "batchId": N, "partitionId": p,
     "attempt": a, "rows": n, "table": "<schema>.<table>",
     "connection": {"host": ..., "port": ..., "dbname": ..., "user": ..., ...}}

The ``connection`` is a password-free ``ConnectionTarget``, so any process can reach the server
the transaction was prepared on; ``xid`` lets a committer ask the server what became of a
transaction that is no longer prepared (``xactStatus``).
"""

from __future__ import annotations

from typing import Any

import psycopg

from twophase.clients.postgres import ConnectionTarget, Secrets
from twophase.protocol import Handle, TransactionContext
from twophase.sinks.postgres.settings import PostgresSettings
from twophase.sinks.postgres.xid import GlobalXid

KIND = "postgres"
"""The ``kind`` of every handle of the postgres sink."""


def preparedHandle(
    ctx: TransactionContext, s: PostgresSettings, gid: str | None, xid: str | None, rows: int
) -> Handle:
    """The handle of one task attempt (``gid`` is ``None`` when it had no rows)."""
    return {
        "kind": KIND,
        "gid": gid,
        "xid": xid,
        "batchId": ctx.batchId,
        "partitionId": ctx.partitionId,
        "attempt": ctx.attemptNumber,
        "rows": rows,
        "table": s.qualifiedName,
        "connection": s.target.toJson(),
    }


def briefHandle(gid: str, s: PostgresSettings) -> Handle:
    """A handle for a prepared transaction found on the server (by recovery): no rows, no xid."""
    parts = GlobalXid.parse(gid)
    handle: Handle = {
        "kind": KIND,
        "gid": gid,
        "table": s.qualifiedName,
        "connection": s.target.toJson(),
    }
    if parts is not None:
        handle.update(batchId=parts.batchId, partitionId=parts.partitionId, attempt=parts.attempt)
    return handle


def checkHandle(handle: Handle) -> Handle:
    """Refuse anything that is not a well-formed postgres handle before touching the server."""
    if handle.get("kind") != KIND:
        raise ValueError(f"not a postgres handle (kind={handle.get('kind')!r})")
    gid = handle.get("gid")
    if gid is not None and (not isinstance(gid, str) or GlobalXid.parse(gid) is None):
        raise ValueError(f"postgres handle has a bad gid {gid!r}")
    ConnectionTarget.fromJson(handle.get("connection"))
    return handle


def handleTarget(handle: Handle, s: PostgresSettings) -> tuple[ConnectionTarget, Secrets]:
    """Where the handle's transaction lives, with the sink's secrets when they apply there."""
    target = ConnectionTarget.fromJson(handle.get("connection"))
    secrets = s.secrets if target.samePlace(s.target) else ()
    return target, secrets


def currentXid(conn: psycopg.Connection[Any]) -> str:
    """The id of the connection's open transaction, as text (for the handle's ``xid``)."""
    query = (
        "SELECT pg_current_xact_id()::text"
        if conn.info.server_version >= 130000
        else "SELECT txid_current()::text"
    )
    row = conn.execute(query).fetchone()
    return str(row[0]) if row else ""


def xactStatus(conn: psycopg.Connection[Any], xid: Any) -> str | None:
    """``committed``, ``aborted``, ``in progress``, or ``None`` when the server cannot tell."""
    if not isinstance(xid, str) or not xid.isdigit():
        return None
    query = (
        "SELECT pg_xact_status(%s::xid8)"
        if conn.info.server_version >= 130000
        else "SELECT txid_status(%s::bigint)"
    )
    try:
        row = conn.execute(query, (xid,)).fetchone()
    except psycopg.DatabaseError:  # too old, or from another server: nothing to learn
        return None
    return str(row[0]) if row and row[0] is not None else None
