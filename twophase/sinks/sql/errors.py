"""The sql sink's errors: a fix is needed (``SqlSinkError``) or the server is away for now.

``SqlSinkError`` means retrying the same work will not help (a missing privilege, a table on an
engine without XA, an xid too long); ``SqlUnavailableError`` means the server could not be
reached and a retry may succeed (Spark retries the task, the coordinator retries a commit).
Both say their system and the fix the command line gives (``SinkSystemError``).
"""

from __future__ import annotations

from types import MappingProxyType

from twophase.protocol.errors import SinkFailure, SinkSystemError

MYSQL_CREDENTIALS = (1044, 1045, 1698)
"""MySQL/MariaDB error numbers of a refused login: database access denied, access denied for
the user (a wrong or missing password), a user that may not log in with a password."""

MYSQL_UNREACHABLE = (2002, 2003, 2005, 2006, 2013, 2055)
"""MySQL/MariaDB client error numbers of a server that did not answer: cannot connect
(socket, TCP), unknown host, server gone, connection lost (twice)."""

PG_CREDENTIALS = ("28P01", "28000")
"""PostgreSQL SQLSTATEs of refused credentials."""


class SqlSinkError(SinkSystemError, RuntimeError):
    """The sql sink cannot go on until something is fixed; the message says what."""

    system = "the SQL database"
    fixes = MappingProxyType(
        {
            SinkFailure.UNREACHABLE: (
                "Fix: start the server, or give its address as the query did: --sink-option "
                "url=mysql+pymysql://user@host:port/db (the password: --sink-option-file)."
            ),
            SinkFailure.CREDENTIALS: (
                "Fix: give the password the query used: --sink-option password=... or a "
                "--sink-option-file only you can read."
            ),
        }
    )

    @classmethod
    def classify(cls, exc: BaseException) -> SinkFailure | None:
        """A driver error (pymysql's, or SQLAlchemy's around it) by its MySQL error number or
        PostgreSQL SQLSTATE; ``None`` for one without."""
        orig = getattr(exc, "orig", None) or exc
        args = getattr(orig, "args", ())
        if args and isinstance(args[0], int) and type(orig).__module__.startswith("pymysql"):
            if args[0] in MYSQL_CREDENTIALS:
                return SinkFailure.CREDENTIALS
            return SinkFailure.UNREACHABLE if args[0] in MYSQL_UNREACHABLE else None
        state = getattr(orig, "sqlstate", None)
        if isinstance(state, str):
            if state in PG_CREDENTIALS:
                return SinkFailure.CREDENTIALS
            return SinkFailure.UNREACHABLE if state.startswith("08") else None
        return None


class SqlUnavailableError(SqlSinkError):
    """The database could not be reached or dropped the connection; a retry may succeed."""

    reason = SinkFailure.UNREACHABLE


class XidTooLongError(SqlSinkError):
    """A transaction id would not fit the server's limit (MySQL/MariaDB: 64-byte gtrid)."""


class RowRejectedError(SqlSinkError):
    """The database refused a row (NULL, duplicate key, too long, a constraint): names the
    batch, partition, the row's position in its task, the column or key and the fix, never the
    row's values; the driver's error is chained without them (see ``rejections``)."""


__all__ = [
    "MYSQL_CREDENTIALS",
    "MYSQL_UNREACHABLE",
    "RowRejectedError",
    "SqlSinkError",
    "SqlUnavailableError",
    "XidTooLongError",
]
