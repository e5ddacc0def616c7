"""How to reach PostgreSQL: a password-free target, connecting, answers bounded, errors.

Shared by the postgres sink (its tasks and the driver's commits) and ``twophase verify``. A
``ConnectionTarget`` holds libpq connection parameters without any secret, so it can travel in
a handle, a log line or ``sink.json``; the secrets (``password``, ``sslpassword``) travel apart
and come from the options of the process, else from libpq's usual places (``PGPASSWORD``,
``~/.pgpass``). Every error text built here from a server or driver error is redacted.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from twophase.clients.postgres_tls import tlsProblem
from twophase.protocol.errors import SinkFailure, SinkSystemError
from twophase.redaction import REDACTED, getLogger, redact, redactForms
from twophase.settings import TwoPhaseConfigError, intOption, optionOf

log = getLogger(__name__)

Secrets = tuple[tuple[str, str], ...]
"""libpq parameters that are secrets, as sorted ``(keyword, value)`` pairs."""

SECRET_PARAMS = frozenset({"password", "sslpassword"})
"""libpq parameters that never leave the process: not in handles, logs or errors."""

OPTION_PARAMS = {
    "user": "user",
    "password": "password",
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "sslcrl": "sslcrl",
    "sslpassword": "sslpassword",
    "applicationName": "application_name",
    "targetSessionAttrs": "target_session_attrs",
}
"""Options passed to libpq under another (or the same) name; ``pg.<keyword>`` passes any."""

PUBLIC_LIBPQ_KEYWORDS = frozenset(
    {
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "passfile",
        "require_auth",
        "channel_binding",
        "connect_timeout",
        "client_encoding",
        "options",
        "application_name",
        "fallback_application_name",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
        "gssencmode",
        "gssdelegation",
        "sslmode",
        "sslnegotiation",
        "requiressl",
        "sslcompression",
        "sslcert",
        "sslcertmode",
        "sslrootcert",
        "sslcrl",
        "sslcrldir",
        "sslsni",
        "requirepeer",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "krbsrvname",
        "gsslib",
        "service",
        "target_session_attrs",
        "load_balance_hosts",
        "oauth_issuer",
        "oauth_client_id",
        "oauth_scope",
    }
)
"""libpq keywords whose values are never secrets (``sslkey`` is left out: it names key material)."""

_CREDENTIALS_STATES = ("28P01", "28000")
"""SQLSTATEs of refused credentials: invalid_password, invalid_authorization_specification."""

# libpq reports a failed connection without a SQLSTATE (psycopg's ``sqlstate`` is ``None``:
# the server's FATAL reaches libpq as text only), so these words of libpq's and the server's
# are all there is to tell refused credentials, and a connection refused for good, from a
# server that did not answer. The SQLSTATE decides whenever there is one.
_CREDENTIALS_CONNECT = (
    "password authentication failed",
    "no password supplied",
    "authentication failed",
    "no pg_hba.conf entry",
    "permission denied",
)
_REFUSED_CONNECT = ("does not exist", "certificate", "invalid ")


class PostgresSinkError(SinkSystemError):
    """A PostgreSQL problem that retrying the same work will not fix.

    Named for the sink, its first user; connecting (``connect``) raises it for verify too, with
    ``reason`` ``CREDENTIALS`` when the server refused the login. Holds the fixes the command
    line gives for PostgreSQL, as ``twophase recover`` takes options.
    """

    system = "PostgreSQL"
    fixes = MappingProxyType(
        {
            SinkFailure.UNREACHABLE: (
                "Fix: start the server, or give its address as the query did: --sink-option "
                "url=postgresql://user@host:port/db (the password: PGPASSWORD, ~/.pgpass or "
                "--sink-option-file)."
            ),
            SinkFailure.CREDENTIALS: (
                "Fix: give the password the query used: --sink-option password=..., a "
                "--sink-option-file only you can read, PGPASSWORD or ~/.pgpass."
            ),
        }
    )

    @classmethod
    def classify(cls, exc: BaseException) -> SinkFailure | None:
        """A psycopg error by its SQLSTATE (``28P01``/``28000``: credentials; class ``08``
        and the server shutting down: unreachable); a failed connection, which has none, by
        libpq's words."""
        if not isinstance(exc, psycopg.Error):
            return None
        state = exc.sqlstate
        if state is not None:
            if state in _CREDENTIALS_STATES:
                return SinkFailure.CREDENTIALS
            if state.startswith("08") or state in ("57P01", "57P02", "57P03"):
                return SinkFailure.UNREACHABLE
            return SinkFailure.REJECTED
        if not isinstance(exc, psycopg.OperationalError):
            return None
        text = str(exc).lower()
        if any(marker in text for marker in _CREDENTIALS_CONNECT):
            return SinkFailure.CREDENTIALS
        return SinkFailure.UNREACHABLE


class PostgresUnavailableError(PostgresSinkError, ConnectionError):
    """The server could not be reached (or the connection broke) while working."""

    reason = SinkFailure.UNREACHABLE


def errorText(exc: BaseException) -> str:
    """A driver or server error as one redacted line, for messages and logs."""
    return " ".join(redact(str(exc)).split())


@dataclass(frozen=True)
class ConnectionTarget:
    """Where to reach the database: libpq connection parameters without any secret.

    Travels in every handle, so a commit from any process reaches the same server and
    database as the task that prepared the transaction. The password comes from the sink's
    options when the process has them, else from libpq's usual places (``PGPASSWORD``,
    ``~/.pgpass``).
    """

    params: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        for key, _ in self.params:
            if key in SECRET_PARAMS:
                raise ValueError(f"a connection target must not hold {key}")

    def get(self, key: str, default: str = "") -> str:
        for k, v in self.params:
            if k == key:
                return v
        return default

    def describe(self) -> str:
        """``user@host:port/dbname``: for logs and errors (never a password)."""
        host = self.get("host") or self.get("hostaddr") or "localhost"
        port = self.get("port") or "5432"
        user = self.get("user") or "<default user>"
        return f"{user}@{host}:{port}/{self.get('dbname') or '<default database>'}"

    def toJson(self) -> dict[str, str]:
        return dict(self.params)

    @classmethod
    def fromJson(cls, data: Any) -> ConnectionTarget:
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()
        ):
            raise ValueError(f"postgres handle has a bad connection: {data!r}")
        return cls(tuple(sorted((k, v) for k, v in data.items() if k not in SECRET_PARAMS)))

    def samePlace(self, other: ConnectionTarget) -> bool:
        """Same host, port, database and user: the same credentials apply."""
        return all(
            self.get(k) == other.get(k) for k in ("host", "hostaddr", "port", "dbname", "user")
        )


def _urlParams(url: str) -> dict[str, str]:
    """The libpq parameters of a URL or ``key=value`` string (a ``jdbc:`` prefix is dropped)."""
    if url.lower().startswith("jdbc:"):
        url = url[5:]
    return {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}


def connectionOf(options: Mapping[str, str]) -> tuple[ConnectionTarget, Secrets]:
    """Where the options point (``url`` overridden by ``user``, ``sslmode``..., ``pg.*`` and
    ``connectTimeout``), and the secrets kept apart; errors name the option and the fix."""
    url = (optionOf(options, "url") or "").strip()
    if not url:
        raise TwoPhaseConfigError(
            'the postgres sink needs .option("url", "postgresql://user@host:5432/dbname") '
            "(the password may come from the password option, PGPASSWORD or ~/.pgpass)"
        )
    try:
        params = _urlParams(url)
    except psycopg.ProgrammingError as exc:
        raise TwoPhaseConfigError(
            "option url is not a PostgreSQL URL (postgresql://user@host:port/dbname) or a "
            f"libpq key=value string: {redact(str(exc))}"
        ) from None
    for name, keyword in OPTION_PARAMS.items():
        value = optionOf(options, name)
        if value is not None:
            params[keyword] = value
    for key, value in options.items():
        if key.lower().startswith("pg.") and len(key) > 3:
            params[key[3:].lower()] = str(value)
    params.setdefault("application_name", "twophase")
    params["connect_timeout"] = str(intOption(options, "connectTimeout", 10, minimum=1))
    if not params.get("dbname"):
        raise TwoPhaseConfigError(
            "option url names no database; add it: postgresql://user@host:5432/<dbname>"
        )
    found = ((k, params.pop(k)) for k in SECRET_PARAMS if k in params)
    # A redacted value (a url read back from sink.json) means "not given": libpq then takes
    # the password from PGPASSWORD or ~/.pgpass, as recovery expects.
    secrets = tuple(sorted((k, v) for k, v in found if v != REDACTED))
    return ConnectionTarget(tuple(sorted(params.items()))), secrets


def publicConninfo(url: str) -> str | None:
    """``url`` as a libpq ``key=value`` string without any secret, or ``None`` if unreadable.

    Reads the URL after the redaction of its secret forms (``redactForms``: not the values
    other queries remembered, which would rewrite a database or host named like one), so a
    password libpq would misread (an unencoded ``@`` in ``postgresql://u:p@ss@host/db``)
    cannot reach the host part; then drops every secret parameter, whatever its value. The
    result connects to the same place, the password coming from ``PGPASSWORD``, ``~/.pgpass``
    or a ``password`` option given again.
    """
    try:
        params = _urlParams(redactForms(url.strip()))
    except psycopg.ProgrammingError:
        return None
    return make_conninfo(**{k: v for k, v in sorted(params.items()) if k not in SECRET_PARAMS})


def isPermanentConnectError(exc: psycopg.OperationalError) -> bool:
    """Authentication, a missing database or role, TLS trouble: retrying will not help."""
    if PostgresSinkError.classify(exc) is SinkFailure.CREDENTIALS:
        return True
    text = str(exc).lower()
    return any(marker in text for marker in _REFUSED_CONNECT)


def connect(
    target: ConnectionTarget,
    secrets: Secrets,
    *,
    autocommit: bool,
    retrySeconds: float,
    what: str,
) -> psycopg.Connection[Any]:
    """Connect, retrying unreachable-server errors with backoff for up to ``retrySeconds``.

    Authentication and missing-database errors raise ``PostgresSinkError`` at once; a server
    that stays unreachable raises ``PostgresUnavailableError``. Messages hold no secrets.
    """
    deadline = time.monotonic() + retrySeconds
    delay = 0.5
    attempt = 0
    while True:
        attempt += 1
        try:
            params: dict[str, Any] = {**dict(target.params), **dict(secrets)}
            return psycopg.connect(autocommit=autocommit, **params)
        except psycopg.OperationalError as exc:
            reason = errorText(exc)
            tls = tlsProblem(str(exc), dict(target.params))
            if tls is not None:  # the same certificate fails the same way: never retried
                raise PostgresSinkError(
                    f"postgres: {what}: cannot connect to {target.describe()} over TLS: {tls} "
                    f"(libpq: {reason})",
                    reason=SinkFailure.CREDENTIALS,
                ) from None
            if isPermanentConnectError(exc):
                raise PostgresSinkError(
                    f"postgres: {what}: cannot connect to {target.describe()}: {reason}",
                    reason=PostgresSinkError.classify(exc) or SinkFailure.UNREACHABLE,
                ) from None
            if time.monotonic() + delay > deadline:
                raise PostgresUnavailableError(
                    f"postgres: {what}: PostgreSQL at {target.describe()} is unreachable after "
                    f"{attempt} attempt(s) in {retrySeconds:.0f} s: {reason}"
                ) from None
            log.warning(
                "postgres: %s: cannot reach %s (attempt %d): %s; retrying in %.1f s",
                what,
                target.describe(),
                attempt,
                reason,
                delay,
            )
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


class AnswerWatch:
    """A bound on the wait for PostgreSQL's answer on one connection, however it is stuck.

    libpq has no read timeout, and TCP's (``tcp_user_timeout``, keepalives) never fires when
    the server's kernel still acknowledges packets: a stopped or paused server process, a
    frozen container. So after ``seconds`` inside the block the connection's socket is shut
    down from a timer thread; the call blocked in libpq then fails at once (the connection is
    broken, the server rolls back what was not prepared), and the block's psycopg error is
    raised as ``PostgresUnavailableError`` naming the wait. ``connection`` is read when the
    timer fires, so a block may open the connection itself. ``seconds`` 0: no bound.
    """

    def __init__(
        self,
        seconds: float,
        connection: Callable[[], psycopg.Connection[Any] | None],
        what: str,
    ) -> None:
        self.seconds = seconds
        self.connection = connection
        self.what = what
        self.fired = False
        self._timer: threading.Timer | None = None

    def __enter__(self) -> AnswerWatch:
        if self.seconds > 0:
            self._timer = threading.Timer(self.seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.fired and isinstance(exc, psycopg.Error):
            raise PostgresUnavailableError(
                f"{self.what}: no answer within socketTimeout={self.seconds:g} s (the server is "
                "frozen, overloaded or unreachable); if statements take that long on a healthy "
                "server, raise the option socketTimeout"
            ) from None

    def _expire(self) -> None:
        self.fired = True
        conn = self.connection()
        if conn is None or conn.closed:
            return
        try:
            duplicate = socket.socket(fileno=os.dup(conn.pgconn.socket))
        except (OSError, psycopg.Error):
            return  # no socket any more: nothing is waiting on it
        log.warning(
            "postgres: %s: no answer within %g s; dropping the connection", self.what, self.seconds
        )
        try:
            duplicate.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            duplicate.close()


__all__ = [
    "AnswerWatch",
    "OPTION_PARAMS",
    "PUBLIC_LIBPQ_KEYWORDS",
    "SECRET_PARAMS",
    "ConnectionTarget",
    "PostgresSinkError",
    "PostgresUnavailableError",
    "Secrets",
    "connect",
    "connectionOf",
    "errorText",
    "isPermanentConnectError",
    "publicConninfo",
]
