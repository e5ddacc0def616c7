"""A bound on every wait for PostgreSQL's answer through SQLAlchemy: the sql sink's engines,
and the engine of an Iceberg SQL catalog on PostgreSQL.

libpq has no read timeout, and TCP's own timeouts never fire while a frozen server's kernel
still acknowledges packets, so a statement sent to a stopped or paused server would wait
forever. ``boundAnswers`` arms ``AnswerWatch`` (the postgres sink's socket cut) around every
statement of an engine and around the ping of a pooled or kept session: after
``socketTimeout`` seconds the connection is cut, the call fails as a disconnect, and
``timedOut`` tells that error apart from a server that went away. PyMySQL has its own
``read_timeout``/``write_timeout`` and needs none of this.
"""

from __future__ import annotations

import weakref
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from twophase.clients.postgres import AnswerWatch, PostgresUnavailableError

_WATCH = "twophase.answerWatch"
_NO_ANSWER = "twophase_no_answer"
_bounds: weakref.WeakKeyDictionary[Engine, float] = weakref.WeakKeyDictionary()


def boundAnswers(
    engine: Engine,
    seconds: float,
    *,
    pingOnCheckout: bool,
    what: str = "a statement of the sql sink",
) -> None:
    """Bound each statement of ``engine`` (PostgreSQL) by ``seconds`` (0: no bound); with
    ``pingOnCheckout`` (a pool) ping each session taken from the pool, bounded too, and let
    the pool replace one that fails (SQLAlchemy's ``pool_pre_ping`` pings unbounded).
    ``what`` names the statements in the error a cut raises."""
    if not seconds:
        return
    _bounds[engine] = seconds

    def arm(conn: sa.Connection, *_: Any) -> None:
        raw: Any = conn.connection.dbapi_connection
        conn.info[_WATCH] = AnswerWatch(seconds, lambda: raw, what).__enter__()

    def disarm(conn: sa.Connection, *_: Any) -> None:
        watch = conn.info.pop(_WATCH, None)
        if watch is not None:
            watch.__exit__(None, None, None)

    def failed(context: sa.engine.ExceptionContext) -> None:
        conn = context.connection
        watch = conn.info.pop(_WATCH, None) if conn is not None else None
        if watch is None:
            return
        watch.__exit__(None, None, None)
        if watch.fired:
            setattr(context.original_exception, _NO_ANSWER, True)
            context.is_disconnect = True

    sa.event.listen(engine, "before_cursor_execute", arm)
    sa.event.listen(engine, "after_cursor_execute", disarm)
    sa.event.listen(engine, "handle_error", failed)
    if pingOnCheckout:

        def ping(dbapiConnection: Any, record: Any, proxy: Any) -> None:
            if not pingAnswers(engine, dbapiConnection):
                raise sa.exc.DisconnectionError("the pooled session did not answer its ping")

        sa.event.listen(engine.pool, "checkout", ping)


def pingAnswers(engine: Engine, dbapiConnection: Any) -> bool:
    """Whether ``dbapiConnection`` answers the dialect's ping within the engine's bound."""
    try:
        with AnswerWatch(_bounds.get(engine, 0), lambda: dbapiConnection, "a session's ping"):
            return bool(engine.dialect.do_ping(dbapiConnection))
    except (psycopg.Error, PostgresUnavailableError):
        return False


def timedOut(exc: BaseException) -> bool:
    """``exc`` ended a statement whose answer did not come within the bound."""
    return bool(getattr(getattr(exc, "orig", None), _NO_ANSWER, False))


__all__ = ["boundAnswers", "pingAnswers", "timedOut"]
