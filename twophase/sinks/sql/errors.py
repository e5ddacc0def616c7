"""The sql sink's errors: a fix is needed (``SqlSinkError``) or the server is away for now.

``SqlSinkError`` means retrying the same work will not help (a missing privilege, a table on an
engine without XA, an xid too long); ``SqlUnavailableError`` means the server could not be
reached and a retry may succeed (Spark retries the task, the coordinator retries a commit).
"""

from __future__ import annotations


class SqlSinkError(RuntimeError):
    """The sql sink cannot go on until something is fixed; the message says what."""


class SqlUnavailableError(SqlSinkError):
    """The database could not be reached or dropped the connection; a retry may succeed."""


class XidTooLongError(SqlSinkError):
    """A transaction id would not fit the server's limit (MySQL/MariaDB: 64-byte gtrid)."""


class RowRejectedError(SqlSinkError):
    """The database refused a row (NULL, duplicate key, too long, a constraint): names the
    batch, partition, the row's position in its task, the column or key and the fix, never the
    row's values; the driver's error is chained without them (see ``rejections``)."""


__all__ = ["RowRejectedError", "SqlSinkError", "SqlUnavailableError", "XidTooLongError"]
