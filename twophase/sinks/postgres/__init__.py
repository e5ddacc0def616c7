"""The PostgreSQL sink: prepared transactions on executors, COMMIT PREPARED from the driver.

A ``PostgresWriter`` (executor) writes each task attempt's rows into one two-phase transaction
and ``PREPARE TRANSACTION``s it; the handle it returns holds the gid, the transaction's id and
where to reach the database (host, port, database, user and non-secret libpq options), never a
password. A ``PostgresCommitter`` (driver, any process) runs ``COMMIT PREPARED`` /
``ROLLBACK PREPARED``; a prepared transaction survives its session, the executor and a server
restart. ``validateTarget`` checks the server and the table before a batch. Spark-free: the
data source ``twophase.postgres`` is ``twophase.spark.postgres.PostgresSink``.

Modules by role: ``settings`` (options), ``schema`` (table checks, ``createTable``),
``statements`` (COPY, upsert), ``encoding`` (Arrow to PostgreSQL text), ``types`` (column
types), ``xid`` (gids), ``handles``, ``writer``, ``committer``, ``errors``; how to connect is
``twophase.clients.postgres``.
"""

from twophase.sinks.postgres.committer import PostgresCommitter
from twophase.sinks.postgres.errors import (
    PostgresSinkError,
    PostgresUnavailableError,
    RowRejectedError,
)
from twophase.sinks.postgres.handles import KIND
from twophase.sinks.postgres.schema import validateTarget
from twophase.sinks.postgres.settings import (
    MODES,
    SAFE_OPTIONS,
    PostgresSettings,
    parseTableName,
    publicOptionValue,
)
from twophase.sinks.postgres.statements import lastPerKey
from twophase.sinks.postgres.writer import PostgresTransaction, PostgresWriter

__all__ = [
    "KIND",
    "MODES",
    "SAFE_OPTIONS",
    "PostgresCommitter",
    "PostgresSettings",
    "PostgresSinkError",
    "PostgresTransaction",
    "PostgresUnavailableError",
    "PostgresWriter",
    "RowRejectedError",
    "lastPerKey",
    "parseTableName",
    "publicOptionValue",
    "validateTarget",
]
