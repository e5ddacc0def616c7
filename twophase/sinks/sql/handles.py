"""The sql handle: what a task's ``preCommit`` returns and what a committer reads back.

Format (JSON, in the decision log)::

    {"kind": "sql", "xid": <xid, or null when the task had no rows>, "batchId": N,
     "partitionId": p, "attempt": a, "rows": n, "table": "<dbtable>",
     "url": "<SQLAlchemy URL without password>", "session": <server thread id>}

The ``url`` says where the transaction lives; the committer adds its own password only when
the handle's URL is the one it was configured with. ``session`` (MySQL family, absent in
handles of earlier versions) is the server's id of the session that prepared the xid: the
committer waits for it to end before ``XA COMMIT`` (``committer.SESSION_END_WAIT_SECONDS``).
"""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url

from twophase.coordinator.formats import checkHandleVersion
from twophase.protocol import Handle, TransactionContext
from twophase.sinks.relational.naming import TransactionName, taskOf
from twophase.sinks.sql.settings import SqlSettings

KIND = "sql"


def taskHandle(
    ctx: TransactionContext, s: SqlSettings, xid: str | None, rows: int, session: int | None = None
) -> Handle:
    """The handle of one task attempt (``xid`` is ``None`` when it had no rows; ``session`` the
    preparing session's server id, when the server's XA needs it)."""
    handle: Handle = {
        "kind": KIND,
        "xid": xid,
        "batchId": ctx.batchId,
        "partitionId": ctx.partitionId,
        "attempt": ctx.attemptNumber,
        "rows": rows,
        "table": s.qualifiedName,
        "url": s.publicUrl,
    }
    if session is not None:
        handle["session"] = session
    return handle


def foundHandle(xid: str, s: SqlSettings) -> Handle:
    """A handle for a prepared transaction found by recovery (no row count)."""
    return {
        "kind": KIND,
        "xid": xid,
        "table": s.qualifiedName,
        "url": s.publicUrl,
        **taskOf(xid),
    }


def checkHandle(handle: Handle) -> Handle:
    """Refuse anything that is not a well-formed sql handle before touching the server."""
    if handle.get("kind") != KIND:
        raise ValueError(f"not an sql handle (kind={handle.get('kind')!r})")
    checkHandleVersion(handle, KIND)
    xid = handle.get("xid")
    if xid is not None and (not isinstance(xid, str) or TransactionName.parse(xid) is None):
        raise ValueError(f"sql handle has a bad xid {xid!r}")
    if not isinstance(handle.get("url"), str):
        raise ValueError("sql handle has no url")
    session = handle.get("session")
    if session is not None and (not isinstance(session, int) or isinstance(session, bool)):
        raise ValueError(f"sql handle has a bad session {session!r}")
    return handle


def preparingSession(handle: Handle) -> int | None:
    """The server id of the session that prepared the handle's xid, when it was recorded."""
    session = handle.get("session")
    return session if isinstance(session, int) else None


def handleUrl(handle: Handle, s: SqlSettings) -> URL:
    """Where the handle's transaction lives, with the sink's password when it is the sink's."""
    text = str(handle["url"])
    if text == s.publicUrl:
        return s.url
    return make_url(text)


__all__ = ["KIND", "checkHandle", "foundHandle", "handleUrl", "preparingSession", "taskHandle"]
