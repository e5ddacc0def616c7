"""The postgres handle: what a task's ``preCommit`` returns and what a committer reads back.

Format (JSON, in the decision log)::

    {"kind": "postgres", "gid": <gid or null when the task had no rows>,
     "xid": <the transaction's id, text>, "batchId": N, "partitionId": p,
     "attempt": a, "rows": n, "table": "<schema>.<table>",
     "connection": {"host": ..., "port": ..., "dbname": ..., "user": ..., ...}}

A task that staged its rows (commit path ``staged``, see ``staging``) returns instead::

    {"kind": "postgres", "path": "staged", "token": <the attempt's gid-formatted token>,
     "staging": [<schema>, <staging table>], "markers": [<schema>, <marker table>],
     "columns": [<stream columns>], "keys": [<upsert keys, empty in append mode>],
     "batchId": N, "partitionId": p, "attempt": a, "rows": n, "table": ...,
     "connection": {...}}

The ``connection`` is a password-free ``ConnectionTarget``, so any process can reach the server
the transaction was prepared on; ``xid`` lets a committer ask the server what became of a
transaction that is no longer prepared (``xactStatus``).
"""

from __future__ import annotations

from typing import Any

import psycopg

from twophase.clients.postgres import ConnectionTarget, Secrets
from twophase.coordinator.formats import checkHandleVersion
from twophase.protocol import Handle, TransactionContext
from twophase.sinks.postgres.settings import PostgresSettings
from twophase.sinks.relational.naming import TransactionName, taskOf

KIND = "postgres"
"""The ``kind`` of every handle of the postgres sink."""

STAGED = "staged"
"""The ``path`` of a handle whose rows wait in the staging table (absent: prepared)."""


def isStaged(handle: Handle) -> bool:
    return handle.get("path") == STAGED


def stagedHandle(
    ctx: TransactionContext,
    s: PostgresSettings,
    token: str,
    names: tuple[list[str], list[str]],
    columns: list[str],
    rows: int,
) -> Handle:
    """The handle of a task attempt that committed ``rows`` staged rows under ``token``."""
    handle: Handle = {
        "kind": KIND,
        "path": STAGED,
        "token": token,
        "staging": names[0],
        "markers": names[1],
        "columns": columns,
        "keys": list(s.keyColumns) if s.mode == "upsert" else [],
    }
    return _ofTask(handle, ctx, s, rows)


def briefStagedHandle(token: str, rows: int, s: PostgresSettings) -> Handle:
    """A handle for staged rows found by recovery (swept): token, rows, no columns."""
    handle: Handle = {"kind": KIND, "path": STAGED, "token": token, "rows": rows}
    return _found(handle, token, s)


def preparedHandle(
    ctx: TransactionContext, s: PostgresSettings, gid: str | None, xid: str | None, rows: int
) -> Handle:
    """The handle of one task attempt (``gid`` is ``None`` when it had no rows)."""
    return _ofTask({"kind": KIND, "gid": gid, "xid": xid}, ctx, s, rows)


def _ofTask(handle: Handle, ctx: TransactionContext, s: PostgresSettings, rows: int) -> Handle:
    """``handle`` with the task attempt that wrote it, its row count and the target."""
    handle.update(
        batchId=ctx.batchId,
        partitionId=ctx.partitionId,
        attempt=ctx.attemptNumber,
        rows=rows,
        table=s.qualifiedName,
        connection=s.target.toJson(),
    )
    return handle


def briefHandle(gid: str, s: PostgresSettings) -> Handle:
    """A handle for a prepared transaction found on the server (by recovery): no rows, no xid."""
    return _found({"kind": KIND, "gid": gid}, gid, s)


def _found(handle: Handle, gid: str, s: PostgresSettings) -> Handle:
    """``handle`` with the target, and the batch, partition and attempt its gid names."""
    handle.update(table=s.qualifiedName, connection=s.target.toJson(), **taskOf(gid))
    return handle


def checkHandle(handle: Handle) -> Handle:
    """Refuse anything that is not a well-formed postgres handle before touching the server."""
    if handle.get("kind") != KIND:
        raise ValueError(f"not a postgres handle (kind={handle.get('kind')!r})")
    checkHandleVersion(handle, KIND)
    if "path" in handle and handle["path"] != STAGED:
        raise ValueError(f"postgres handle has an unknown path {handle['path']!r}")
    if isStaged(handle):
        token = handle.get("token")
        if not isinstance(token, str) or TransactionName.parse(token) is None:
            raise ValueError(f"staged postgres handle has a bad token {token!r}")
        for key in ("columns", "keys"):
            value = handle.get(key)
            if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
                raise ValueError(f"staged postgres handle has bad {key} {value!r}")
        if not handle["columns"] or not isinstance(handle.get("rows"), int):
            raise ValueError("staged postgres handle has no columns or no row count")
        ConnectionTarget.fromJson(handle.get("connection"))
        return handle
    gid = handle.get("gid")
    if gid is not None and (not isinstance(gid, str) or TransactionName.parse(gid) is None):
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
