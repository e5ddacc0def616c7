"""The PostgreSQL sink: prepared or staged transactions on executors, committed by the driver.

A ``PostgresWriter`` (executor) writes each task attempt's rows into one two-phase transaction
and ``PREPARE TRANSACTION``s it, or (``commitMode``: partitions beyond the server's budget of
prepared transactions) commits them into a staging table next to the target; the handle it
returns holds the gid (or staging token), the transaction's id and where to reach the database
(host, port, database, user and non-secret libpq options), never a password. A
``PostgresCommitter`` (driver, any process) runs ``COMMIT PREPARED`` / ``ROLLBACK PREPARED``,
or moves staged rows into the target with a marker in one transaction (``staging``); a prepared
transaction survives its session, the executor and a server restart. ``validateTarget`` checks
the server and the table before a batch. Spark-free: the registry declares it as
``twophase.postgres``.

Modules by role: ``settings`` (options), ``dialect`` (what is PostgreSQL's own: names, gids;
what it shares with ``twophase.sql`` is ``twophase.sinks.relational``), ``schema`` (table
checks, ``createTable``), ``statements`` (COPY, upsert), ``encoding`` (Arrow to PostgreSQL
text), ``types`` (column types), ``staging`` (the staged path's tables and statements),
``sessions`` (task connections reused within a worker), ``handles``, ``writer``,
``committer``, ``errors``, ``rejections`` (a refused row's position, column and fix); how to
connect is ``twophase.clients.postgres``.
"""

from twophase.imports import importWithoutJars

importWithoutJars("psycopg")  # before the modules below import it (twophase.imports)
# ruff: noqa: E402

from twophase.sinks.postgres.committer import PostgresCommitter
from twophase.sinks.postgres.dialect import parseTableName
from twophase.sinks.postgres.errors import (
    PostgresSinkError,
    PostgresUnavailableError,
    PreparedLimitError,
    RowRejectedError,
)
from twophase.sinks.postgres.handles import KIND
from twophase.sinks.postgres.schema import validateTarget
from twophase.sinks.postgres.settings import (
    COMMIT_MODES,
    SAFE_OPTIONS,
    PostgresSettings,
    publicOptionValue,
)
from twophase.sinks.postgres.staging import StagingNames
from twophase.sinks.postgres.statements import lastPerKey
from twophase.sinks.postgres.writer import PostgresTransaction, PostgresWriter
from twophase.sinks.relational.options import MODES

__all__ = [
    "COMMIT_MODES",
    "KIND",
    "MODES",
    "SAFE_OPTIONS",
    "PostgresCommitter",
    "PostgresSettings",
    "PostgresSinkError",
    "PostgresTransaction",
    "PostgresUnavailableError",
    "PostgresWriter",
    "PreparedLimitError",
    "RowRejectedError",
    "StagingNames",
    "lastPerKey",
    "parseTableName",
    "publicOptionValue",
    "validateTarget",
]
