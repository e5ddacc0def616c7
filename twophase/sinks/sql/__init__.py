"""The sql sink: two-phase transactions through SQLAlchemy, prepared on executors, committed
by the driver.

A ``SqlWriter`` (executor) writes each task attempt's rows into one two-phase transaction (the
dialect's: XA on MySQL/MariaDB, ``PREPARE TRANSACTION`` on PostgreSQL) with a commit marker,
and prepares it; the handle holds the xid and the URL without its password. A
``SqlCommitter`` (driver, any process) commits or rolls it back by xid from another connection,
and tells an already committed xid (its marker is there) from a lost one. ``validateTarget``
checks the server and the table before a batch. Spark-free: the registry declares it as
``twophase.sql``.

Modules by role: ``settings`` (options), ``dialect`` (what differs between MySQL and
PostgreSQL; what the sink shares with ``twophase.postgres`` is ``twophase.sinks.relational``),
``connections``, ``answers`` (PostgreSQL's answers bounded), ``sessions`` (task connections a
worker keeps), ``schema`` (checks, ``createTable``), ``handles``, ``writer``, ``committer``,
``inspect`` (``twophase doctor``), ``errors``, ``rejections`` (a refused row's position,
column and fix).
"""

from twophase.imports import importWithoutJars

importWithoutJars("psycopg")  # before the modules below import it (twophase.imports)
# ruff: noqa: E402

from twophase.sinks.sql.committer import SqlCommitter
from twophase.sinks.sql.errors import (
    RowRejectedError,
    SqlSinkError,
    SqlUnavailableError,
    XidTooLongError,
)
from twophase.sinks.sql.handles import KIND
from twophase.sinks.sql.schema import validateTarget
from twophase.sinks.sql.settings import MODES, SAFE_OPTIONS, SqlSettings, publicOptionValue
from twophase.sinks.sql.writer import SqlTransaction, SqlWriter

__all__ = [
    "KIND",
    "MODES",
    "SAFE_OPTIONS",
    "RowRejectedError",
    "SqlCommitter",
    "SqlSettings",
    "SqlSinkError",
    "SqlTransaction",
    "SqlUnavailableError",
    "SqlWriter",
    "XidTooLongError",
    "publicOptionValue",
    "validateTarget",
]
