"""The sql sink's options, parsed and checked once into ``SqlSettings``.

Also says which options may be written to the checkpoint's ``sink.json`` (``SAFE_OPTIONS``, in
the form ``publicOptionValue`` gives them): what a committer needs to commit, abort or recover
from there alone, and no secret (the ``url`` is kept without its password).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from twophase.options import SinkOption, keptOptions
from twophase.settings import TwoPhaseConfigError, intOption, optionOf
from twophase.sinks.relational.options import (
    BAD_RECORDS,
    CONNECT,
    CREATE_TABLE,
    KEY_COLUMNS,
    MODES,
    PASSWORD,
    TABLE,
    checkBadRecords,
    checkModeAndKeys,
    readShared,
)
from twophase.sinks.sql.dialect import NAMES, parseTableName

FAMILIES = {"mysql": "mysql", "mariadb": "mysql", "postgresql": "postgresql"}
"""SQLAlchemy dialect names the sink supports, and the family whose statements they take."""

OPTIONS = (
    SinkOption(
        ("url",),
        "string",
        "required",
        "an SQLAlchemy URL: `mysql+pymysql://user:pw@host:3306/db` or "
        "`postgresql+psycopg://user:pw@host:5432/db`; kept without its password",
    ),
    TABLE,
    SinkOption(("user",), "string", "from the URL", "overrides the URL's"),
    PASSWORD,
    SinkOption(
        ("mode",),
        "choice",
        "`append`",
        "`append`, or `upsert` on `keyColumns` (`INSERT ... ON DUPLICATE KEY UPDATE` on "
        "MySQL/MariaDB, `ON CONFLICT ... DO UPDATE` on PostgreSQL)",
    ),
    KEY_COLUMNS,
    SinkOption(
        ("batchsize",),
        "integer",
        "`1000`",
        "rows per multi-row `INSERT` (as Spark's JDBC writer's option)",
    ),
    CREATE_TABLE,
    SinkOption(
        ("markerTable",),
        "string",
        "`twophase_sql_commits`",
        "the commit markers' table, created beside the target",
    ),
    CONNECT,
    BAD_RECORDS,
    SinkOption(
        ("socketTimeout",),
        "seconds",
        "`120`",
        "how long to wait for the server to answer one statement or take one: MySQL/MariaDB "
        "through PyMySQL's `read_timeout` and `write_timeout` (unless the URL sets them); "
        "PostgreSQL, whose libpq has no read timeout, by cutting the connection; above "
        "InnoDB's 50 s lock wait (0: no limit)",
    ),
)
"""The sql sink's options, declared once (docs/sql.md's table comes from it)."""

SAFE_OPTIONS = keptOptions(OPTIONS)
"""Options (lower-cased) that may be persisted: never ``password``; ``url`` without it."""

_SECRET_PARAMETER = re.compile(r"pass|secret|key|token|credential", re.IGNORECASE)


def publicOptionValue(key: str, value: str) -> str | None:
    """How an allowed option is written to ``sink.json``: ``url`` without any password."""
    if key.lower() != "url":
        return value
    try:
        return withoutPassword(parseUrl(value))
    except TwoPhaseConfigError:
        return None


def withoutPassword(url: URL) -> str:
    """``url`` as text with no password (``URL.set`` cannot remove one), nor a query
    parameter that may hold a secret (``password``, ``passwd``, ``ssl_key``...)."""
    query = {k: v for k, v in url.query.items() if not _SECRET_PARAMETER.search(k)}
    bare = URL.create(
        url.drivername,
        username=url.username,
        host=url.host,
        port=url.port,
        database=url.database,
        query=query,
    )
    return bare.render_as_string(hide_password=False)


def parseUrl(text: str) -> URL:
    """An SQLAlchemy URL of a supported dialect; ``TwoPhaseConfigError`` names the fix."""
    try:
        url = make_url(text)
    except ArgumentError:
        url = None
    example = "mysql+pymysql://user:password@host:3306/db or postgresql+psycopg://user@host/db"
    if url is None or not url.database:
        raise TwoPhaseConfigError(
            f"option url must be an SQLAlchemy URL naming a database, e.g. {example}; got "
            f"{_shown(text)}"
        )
    if url.get_backend_name() not in FAMILIES:
        raise TwoPhaseConfigError(
            f"option url: dialect {url.get_backend_name()!r} is not supported by twophase.sql "
            f"(two-phase commit through SQLAlchemy is tested on MySQL/MariaDB XA and "
            f"PostgreSQL); use e.g. {example}"
        )
    return url


def _shown(text: str) -> str:
    return repr(text.split("@")[-1]) if "@" in text else repr(text)


@dataclass(frozen=True)
class SqlSettings:
    """The sql sink's options (``SqlSettings.fromOptions``).

    - ``url`` (required): an SQLAlchemy URL, ``mysql+pymysql://user:pw@host:port/db``
      (MariaDB or MySQL) or ``postgresql+psycopg://user:pw@host:port/db``; ``user`` and
      ``password`` options override the URL's.
    - ``dbtable`` or ``table`` (required; both given must agree): the target table, ``name``
      or ``schema.name``.
    - ``mode``: ``append`` (default) or ``upsert`` on ``keyColumns`` (``ON DUPLICATE KEY
      UPDATE`` / ``ON CONFLICT``); ``keyColumns`` is refused in ``append``.
    - ``batchsize``: rows per multi-row ``INSERT`` (default 1000).
    - ``createTable``: create a missing table from the stream's schema (default false).
    - ``markerTable``: the table of commit markers next to the target (default
      ``twophase_sql_commits``).
    - ``connectTimeout``: seconds to wait for a connection (default 10).
    - ``connectRetrySeconds``: how long tasks and the driver's checks keep retrying to
      connect to a server that is down or restarting (default 30; 0: no retry).
    - ``socketTimeout``: seconds to wait for the server's answer to one statement, or to
      send one (default 120, above InnoDB's 50 s lock wait; 0: no limit): PyMySQL's
      ``read_timeout``/``write_timeout`` (those in the URL win), PostgreSQL's connection cut
      (``answers``). A frozen or unreachable server then fails the task or the commit instead
      of holding it forever.
    - ``badRecords``: ``fail`` (default: a row the database rejects fails the batch, naming
      the row, the column and the fix) or the name of a dead-letter table beside the target
      (created when missing): each rejected row goes there instead, as JSON with its position
      and the reason, in the task's own transaction, so it is committed with the batch and
      exactly once.
    """

    url: URL = field(repr=False)
    schema: str | None
    table: str
    mode: str = "append"
    keyColumns: tuple[str, ...] = ()
    batchsize: int = 1000
    createTable: bool = False
    markerTable: str = "twophase_sql_commits"
    connectTimeout: int = 10
    connectRetrySeconds: float = 30.0
    socketTimeout: float = 120.0
    badRecords: str | None = None
    """The dead-letter table of rows the database rejects; ``None``: fail the batch."""

    def __post_init__(self) -> None:
        checkModeAndKeys(self.mode, self.keyColumns)
        if not NAMES.plain(self.markerTable):
            raise TwoPhaseConfigError(
                f"option markerTable={self.markerTable!r} is not a plain table name"
            )
        taken = {self.table: "the target table", self.markerTable: "the marker table"}
        checkBadRecords(self.badRecords, self.table, taken)

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> SqlSettings:
        raw = optionOf(options, "url")
        if not raw:
            raise TwoPhaseConfigError(
                "option url is required: an SQLAlchemy URL such as "
                "mysql+pymysql://user:password@host:3306/db"
            )
        url = parseUrl(raw)
        user = optionOf(options, "user")
        password = optionOf(options, "password")
        if user:
            url = url.set(username=user)
        if password is not None:
            url = url.set(password=password)
        shared = readShared(options, sink="sql", names=NAMES)
        schema, table = parseTableName(shared.tableText)
        return cls(
            url=url,
            schema=schema,
            table=table,
            mode=shared.mode,
            keyColumns=shared.keyColumns,
            batchsize=intOption(options, "batchsize", 1000, minimum=1),
            createTable=shared.createTable,
            markerTable=(optionOf(options, "markerTable") or "twophase_sql_commits").strip(),
            connectTimeout=intOption(options, "connectTimeout", 10, minimum=1),
            connectRetrySeconds=shared.connectRetrySeconds,
            socketTimeout=shared.socketTimeout,
            badRecords=shared.badRecords,
        )

    @property
    def family(self) -> str:
        """``mysql`` (MySQL, MariaDB) or ``postgresql``: which statements to use."""
        return FAMILIES[self.url.get_backend_name()]

    @property
    def qualifiedName(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table

    @property
    def publicUrl(self) -> str:
        """The URL without its password: for handles, logs and ``sink.json``."""
        return withoutPassword(self.url)

    def describe(self) -> str:
        u = self.url
        return f"{u.get_backend_name()} {u.host or 'localhost'}:{u.port or ''}/{u.database}"


__all__ = ["FAMILIES", "MODES", "SAFE_OPTIONS", "SqlSettings", "parseUrl", "publicOptionValue"]
