"""Engines and connections of the sql sink: one engine per URL and process, clear errors.

Executors use unpooled engines (a MySQL/MariaDB task's connection ends with its prepared
transaction, which must leave the session for another connection to commit it; PostgreSQL
task sessions are kept by ``sessions``); the driver's committer keeps a pool as large as the
coordinator's parallel commits (16). MySQL/MariaDB sessions use ``time_zone = '+00:00'`` so
``DATETIME`` values are UTC, and an engine makes PyMySQL's default TLS choice once (see
``_TlsChoice``): the engine, its dialect and that choice serve every task of a Python worker.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import sqlalchemy as sa
import tenacity
from sqlalchemy.engine import URL, Connection, Engine

from twophase.clients.postgres_answers import boundAnswers, timedOut
from twophase.clients.postgres_tls import isTlsFailure
from twophase.clients.tlsverify import certificateProblem
from twophase.protocol.errors import SinkFailure
from twophase.resources import Resources
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.sql.dialect import MYSQL_ACCESS_DENIED, errorMessage, mysqlCode, pgState
from twophase.sinks.sql.errors import SqlSinkError, SqlUnavailableError
from twophase.sinks.sql.settings import FAMILIES


class _TlsChoice:
    """PyMySQL's default TLS choice for one engine, made at its first connection and reused.

    Without TLS options PyMySQL "prefers" TLS: every new connection builds a fresh default
    ``SSLContext`` (which loads the system's CA certificates, though it verifies nothing) and
    uses TLS only if the server offers it. A task connects once per XA transaction, so that
    context was most of a task's cost. The engine's first connection is made PyMySQL's way and
    the outcome kept: later connections get that connection's context (TLS, unverified, as
    before) or ``ssl_disabled`` when the server offered no TLS. A failed connection attempt
    forgets the choice and is tried again at once PyMySQL's way (the server may have been
    restarted with other settings). URLs that set any ``ssl`` option are left alone.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known = False
        self._context: object | None = None

    def apply(self, cparams: dict[str, Any]) -> None:
        """``do_connect``: connect the way the first connection did, when that is known.
        Only engines whose URL sets no ``ssl`` option get here, so any such key is ours (an
        older SQLAlchemy may keep it from the previous connection)."""
        with self._lock:
            cparams.pop("ssl", None)
            cparams.pop("ssl_disabled", None)
            if not self._known:
                return
            if self._context is None:
                cparams["ssl_disabled"] = True
            else:
                cparams["ssl"] = self._context

    def learn(self, dbapiConnection: Any) -> None:
        """``connect``: keep what PyMySQL's default gave the first connection (no round trip:
        PyMySQL encrypts when it wanted TLS and the server's handshake offered it)."""
        from pymysql.constants import CLIENT

        wanted = getattr(dbapiConnection, "ssl", None)
        offered = getattr(dbapiConnection, "server_capabilities", None)
        if wanted is None or offered is None:
            return  # another PyMySQL: keep its default for every connection
        encrypted = bool(wanted) and bool(offered & CLIENT.SSL)
        context = getattr(dbapiConnection, "ctx", None) if encrypted else None
        if encrypted and context is None:
            return
        with self._lock:
            if not self._known:
                self._known, self._context = True, context

    def forget(self) -> bool:
        """Drop the choice; whether there was one (then a retry connects PyMySQL's way)."""
        with self._lock:
            known = self._known
            self._known, self._context = False, None
            return known


def _reuseTlsChoice(engine: Engine, resources: Resources) -> None:
    """Make PyMySQL's default TLS choice once for ``engine`` (``_TlsChoice``, kept in
    ``resources`` beside the engine)."""
    choice = resources.get(("sql.tlsChoice", engine), _TlsChoice)

    @sa.event.listens_for(engine, "do_connect")
    def _apply(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        choice.apply(cparams)

    @sa.event.listens_for(engine, "connect")
    def _learn(dbapiConnection: Any, record: Any) -> None:
        choice.learn(dbapiConnection)


def _setsTls(url: URL) -> bool:
    return any(k == "ssl" or k.startswith("ssl_") for k in url.query)


def engineFor(
    url: URL,
    *,
    pooled: bool,
    connectTimeout: int = 10,
    socketTimeout: float = 0,
    resources: Resources | None = None,
) -> Engine:
    """The engine for ``url`` (created once, kept and disposed of by ``resources``, the
    process's unless given); ``pooled`` for the committer.

    ``socketTimeout`` (0: none) bounds the wait for one statement's answer: MySQL/MariaDB
    through PyMySQL's ``read_timeout``/``write_timeout`` (unless the URL sets them),
    PostgreSQL through ``answers``.
    """
    key = (url.render_as_string(hide_password=False), pooled, connectTimeout, socketTimeout)

    def open() -> Engine:
        family = FAMILIES[url.get_backend_name()]
        args: dict[str, object] = {"connect_timeout": connectTimeout}
        if family == "mysql":
            args["init_command"] = "SET time_zone = '+00:00'"
            for name in ("read_timeout", "write_timeout"):
                if socketTimeout and name not in url.query:
                    args[name] = socketTimeout
        else:
            # A partition ends the wait through TCP; a frozen server only through
            # ``answers`` (its kernel still acknowledges every packet).
            args["tcp_user_timeout"] = connectTimeout * 1000
            args["keepalives"] = 1
        # PostgreSQL pools ping on checkout through ``answers`` (bounded) instead.
        prePing = family == "mysql" or not socketTimeout
        extra: dict[str, object] = (
            {"pool_size": 4, "max_overflow": 16, "pool_pre_ping": prePing}
            if pooled
            else {"poolclass": sa.pool.NullPool}
        )
        try:
            engine = sa.create_engine(url, connect_args=args, **extra)
        except ModuleNotFoundError as exc:
            raise TwoPhaseConfigError(
                f"option url: the {url.drivername} dialect needs the {exc.name} package; "
                "install it (pip install 'twophase[mysql]' for mysql+pymysql)"
            ) from None
        if family == "mysql" and url.get_driver_name() == "pymysql" and not _setsTls(url):
            _reuseTlsChoice(engine, owner)
        if family == "postgresql":
            boundAnswers(engine, socketTimeout, pingOnCheckout=pooled)
        return engine

    owner = resources or Resources.ofProcess()
    return owner.get(("sql.engine", key), open, Engine.dispose)


def isUnavailable(exc: BaseException) -> bool:
    """A connection-level failure: server down, unreachable or gone mid-statement."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    if type(exc).__name__ in ("InterfaceError",) and type(exc).__module__.startswith("pymysql"):
        return True  # pymysql's "(0, '')": the connection is gone
    code = mysqlCode(exc)
    if code is not None:
        return code in (2002, 2003, 2006, 2013, 2055, 1927, 1053)
    state = pgState(exc)
    if state is not None:
        return state.startswith("08") or state in ("57P01", "57P02", "57P03")
    return isinstance(exc, sa.exc.OperationalError | psycopg.OperationalError)


def isTimeout(exc: BaseException) -> bool:
    """The server's answer did not come within ``socketTimeout``: PyMySQL gave up
    (``read_timeout``/``write_timeout``), or ``answers`` cut a PostgreSQL connection."""
    return (mysqlCode(exc) == 2013 and "timed out" in str(exc)) or timedOut(exc)


def noAnswer(socketTimeout: float) -> str:
    """How an error says the server did not answer within ``socketTimeout``."""
    return (
        f"no answer within socketTimeout={socketTimeout:g} s (the server is frozen, overloaded "
        "or unreachable)"
    )


def isAccessDenied(exc: BaseException) -> bool:
    code = mysqlCode(exc)
    if code is not None:
        return code in MYSQL_ACCESS_DENIED
    return pgState(exc) in ("42501", "28P01", "28000")


def isTls(exc: BaseException) -> bool:
    """A connection that failed in the TLS handshake or its certificate check (PyMySQL
    reports it as error 2003 with the ``ssl`` module's words; libpq in words only)."""
    text = errorMessage(exc)
    if mysqlCode(exc) is not None:
        return mysqlCode(exc) == 2003 and ("SSL" in text or "certificate" in text)
    orig = getattr(exc, "orig", exc)
    return isinstance(orig, psycopg.OperationalError) and isTlsFailure(text)


_SYSTEMS = {"mysql": "MySQL", "mariadb": "MariaDB", "postgresql": "PostgreSQL"}
"""The system an error names, by SQLAlchemy's backend name."""


def connect(
    engine: Engine, what: str, retrySeconds: float = 0.0, resources: Resources | None = None
) -> Connection:
    """A new connection of ``engine`` (kept in ``resources``, the process's unless given),
    retried while the server is unreachable for up to ``retrySeconds`` (a restarting server);
    then ``SqlUnavailableError``. A refused login is ``SqlSinkError`` at once. Both name
    ``what`` and the server (never a password)."""
    where = f"{engine.url.get_backend_name()} at {engine.url.host}:{engine.url.port}"
    attempts = tenacity.Retrying(
        stop=tenacity.stop_after_delay(retrySeconds),
        wait=tenacity.wait_exponential(multiplier=0.2, max=2.0),
        retry=tenacity.retry_if_exception(
            lambda e: isinstance(e, sa.exc.DBAPIError) and not isAccessDenied(e) and not isTls(e)
        ),
        reraise=True,
    )
    owner = resources or Resources.ofProcess()
    choice: _TlsChoice | None = owner.peek(("sql.tlsChoice", engine))

    def attempt() -> Connection:
        try:
            return engine.connect()
        except sa.exc.DBAPIError:
            if choice is None or not choice.forget():
                raise
        return engine.connect()  # PyMySQL's default TLS choice again

    system = _SYSTEMS.get(engine.url.get_backend_name(), SqlSinkError.system)
    try:
        return attempts(attempt)
    except sa.exc.DBAPIError as exc:
        if isTls(exc):  # the same certificate fails the same way: never retried
            query = engine.url.query
            ca = query.get("ssl_ca") or query.get("sslrootcert") or "the default CAs"
            problem = certificateProblem(
                errorMessage(exc),
                name=str(engine.url.host),
                ca=str(ca),
                caOption="the url's ssl_ca=<file> (sslrootcert=<file> on PostgreSQL)",
            )
            raise SqlSinkError(
                f"sql sink: {what}: cannot connect to {where} over TLS: {problem}",
                system=system,
                reason=SinkFailure.CREDENTIALS,
            ) from None
        if isAccessDenied(exc):
            raise SqlSinkError(
                f"sql sink: {what}: {where} refused the login of user "
                f"{engine.url.username!r}: {errorMessage(exc)}. Check the user and password "
                "(url, or options user/password).",
                system=system,
                reason=SinkFailure.CREDENTIALS,
            ) from None
        raise SqlUnavailableError(
            f"sql sink: {what}: cannot connect to {where}: {errorMessage(exc)}", system=system
        ) from None


@contextmanager
def connection(
    engine: Engine,
    what: str,
    *,
    autocommit: bool = False,
    retrySeconds: float = 0.0,
    resources: Resources | None = None,
) -> Iterator[Connection]:
    """``connect``, closed at the end of the block; ``autocommit`` for XA and DDL."""
    conn = connect(engine, what, retrySeconds, resources)
    try:
        if autocommit:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn
    finally:
        conn.close()


__all__ = [
    "connect",
    "connection",
    "engineFor",
    "isAccessDenied",
    "isTls",
    "isTimeout",
    "isUnavailable",
    "noAnswer",
]
