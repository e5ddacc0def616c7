"""The postgres sink's options, parsed and checked once into ``PostgresSettings``.

Also says which options may be written to the checkpoint's ``sink.json`` (``SAFE_OPTIONS``, in
the form ``publicOptionValue`` gives them): every option a committer needs to commit, abort or
recover from there alone, and no secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from psycopg import sql

from twophase.clients.postgres import (
    PUBLIC_LIBPQ_KEYWORDS,
    ConnectionTarget,
    Secrets,
    connectionOf,
    publicConninfo,
)
from twophase.options import SinkOption, keptOptions
from twophase.settings import TwoPhaseConfigError, floatOption, intOption, optionOf
from twophase.sinks.postgres.dialect import NAMES, parseTableName, quoteIdent
from twophase.sinks.relational.options import (
    BAD_RECORDS,
    CONNECT,
    CREATE_TABLE,
    KEY_COLUMNS,
    TABLE,
    checkBadRecords,
    checkModeAndKeys,
    readShared,
    sparkNamed,
)

COMMIT_MODES = ("auto", "prepared", "staged")
"""Values of option ``commitMode``: how a task's rows wait for the driver's decision."""

OPTIONS = (
    SinkOption(
        ("url",),
        "string",
        "required",
        "`postgresql://user[:password]@host:port/dbname?sslmode=...` (a `jdbc:` prefix is "
        "accepted) or a libpq `key=value` string; kept without its password",
    ),
    TABLE,
    SinkOption(
        ("mode",),
        "choice",
        "`append`",
        "`append` (`COPY`) or `upsert` on `keyColumns` (`INSERT ... ON CONFLICT`)",
    ),
    KEY_COLUMNS,
    CREATE_TABLE,
    SinkOption(
        ("commitMode",),
        "choice",
        "`auto`",
        "`prepared`: every task holds a prepared transaction until the driver commits; "
        "`staged`: tasks commit into a staging table and the driver moves the rows; `auto`: "
        "partitions below `maxPreparedPartitions` prepared, the others staged",
    ),
    SinkOption(
        ("maxPreparedPartitions",),
        "integer",
        "half the server's `max_prepared_transactions`",
        "in `auto`, how many partitions (ids `0..n-1`) use a prepared transaction",
    ),
    SinkOption(
        ("batchsize", "upsertBatchRows"),
        "integer",
        "`20000`",
        "rows per `INSERT ... ON CONFLICT` statement (Spark's JDBC name, or ours); `COPY` "
        "sends a record batch whole",
    ),
    BAD_RECORDS,
    SinkOption(
        ("user", "sslmode", "sslrootcert", "sslcert", "sslcrl", "targetSessionAttrs"),
        "string",
        "from the URL",
        "override the URL's libpq parameters",
    ),
    SinkOption(("applicationName",), "string", "`twophase`", "the session's `application_name`"),
    SinkOption(
        ("password", "sslpassword", "sslkey"),
        "string",
        "from the URL, `PGPASSWORD`, `~/.pgpass`",
        "never written to the checkpoint: `twophase recover` takes them from the environment "
        "or `--sink-option`",
        secret=True,
    ),
    SinkOption(
        ("pg.*",),
        "prefix",
        "",
        "any other libpq parameter (`pg.keepalives`); the checkpoint keeps only those that "
        "cannot hold a secret",
        kept=tuple(f"pg.{keyword}" for keyword in sorted(PUBLIC_LIBPQ_KEYWORDS)),
    ),
    CONNECT,
    SinkOption(
        ("lockTimeoutSeconds",),
        "seconds",
        "`60`",
        "a task waiting longer for a row lock fails, naming the prepared transactions it "
        "waits for (0: waits forever)",
    ),
    SinkOption(
        ("socketTimeout",),
        "seconds",
        "`120`",
        "how long a task or the driver waits for the server to answer one call before "
        "dropping the connection and failing, retryably (0: no limit)",
    ),
)
"""The postgres sink's options, declared once (docs/postgres.md's table comes from it)."""

SAFE_OPTIONS = keptOptions(OPTIONS)
"""Options (lower-cased) that may be persisted: never ``password``, ``sslpassword``, ``sslkey``
or a ``pg.*`` keyword that can hold a secret. ``url`` is persisted without its password."""


def publicOptionValue(key: str, value: str) -> str | None:
    """How an allowed option is written to ``sink.json``: ``url`` as a ``key=value`` string
    without any password (``None`` when it cannot be read), every other option as given."""
    if key.lower() == "url":
        return publicConninfo(value)
    return value


def _batchsizeName(options: Mapping[str, str]) -> str:
    """Which of ``batchsize`` (Spark's JDBC name) and ``upsertBatchRows`` to read: the one
    given (both given must agree)."""
    sparkNamed(options, "batchsize", "upsertBatchRows")
    return "batchsize" if optionOf(options, "batchsize") is not None else "upsertBatchRows"


@dataclass(frozen=True)
class PostgresSettings:
    """The postgres sink's options, parsed and checked once (``PostgresSettings.fromOptions``).

    - ``url`` (required): ``postgresql://user[:password]@host:port/dbname?sslmode=...`` (a
      ``jdbc:`` prefix is accepted) or a libpq ``key=value`` string. The password may instead
      come from the ``password`` option, ``PGPASSWORD`` or ``~/.pgpass`` (the driver's
      ``twophase recover`` relies on those: secrets are never written to the checkpoint).
    - ``dbtable`` or ``table`` (required; both given must agree): ``schema.table`` (``public``
      when unqualified); PostgreSQL's identifier rules, so ``"Quoted"`` keeps its case.
    - ``mode``: ``append`` (default, ``COPY``) or ``upsert`` (``INSERT ... ON CONFLICT``).
    - ``keyColumns``: comma-separated conflict columns, required by ``mode=upsert`` and refused
      by ``append``; the table needs a primary key or unique index on exactly them.
    - ``createTable``: ``true`` creates a missing table from the stream's schema (a primary key
      on ``keyColumns`` in upsert mode); default ``false``.
    - ``user``, ``password``, ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``,
      ``sslcrl``, ``sslpassword``, ``applicationName`` (default ``twophase``),
      ``targetSessionAttrs``, and ``pg.<keyword>`` for any other libpq parameter: override the
      URL's.
    - ``connectTimeout``: seconds for one connection attempt (default 10).
    - ``connectRetrySeconds``: how long tasks and the driver's checks keep retrying to connect
      while the server is unreachable (default 30; 0 tries once).
    - ``lockTimeoutSeconds``: a task waiting longer than this for a row lock fails with an
      error naming the prepared transactions it waits for (default 60; 0 waits forever).
    - ``socketTimeout``: seconds a task or the driver waits for the server to answer one
      call (a statement, a chunk of COPY) before dropping the connection and failing,
      retryably (default 120, above ``lockTimeoutSeconds``; 0: no limit). Bounds a frozen or
      partitioned server, which libpq alone waits for forever (``clients.postgres.AnswerWatch``).
    - ``batchsize`` (Spark's JDBC name) or ``upsertBatchRows``: rows per ``INSERT ... ON
      CONFLICT`` statement (default 20000; ``COPY`` in append mode sends a record batch whole).
    - ``commitMode``: ``auto`` (default), ``prepared`` or ``staged``. ``prepared``: every task
      holds one prepared transaction until the driver commits, so a batch needs one slot of
      the server's ``max_prepared_transactions`` per partition. ``staged``: every task commits
      its rows into the staging table next to the target, and the driver moves them in one
      transaction (see ``staging``). ``auto``: partitions below ``maxPreparedPartitions`` are
      prepared, the others staged.
    - ``maxPreparedPartitions``: in ``auto``, how many partitions (ids ``0..n-1``) use a
      prepared transaction; default half the server's ``max_prepared_transactions`` (0 on a
      server without prepared transactions: everything staged), never more than it.
    - ``badRecords``: ``fail`` (default: a row PostgreSQL rejects fails the batch, naming it)
      or the name of a dead-letter table in the target's schema, created when missing: rows
      PostgreSQL rejects go there in the task's own prepared transaction (``deadletter``).
      Every partition then holds a prepared transaction: ``commitMode=staged`` is refused.
    """

    target: ConnectionTarget
    schema: str
    table: str
    mode: str = "append"
    keyColumns: tuple[str, ...] = ()
    createTable: bool = False
    connectRetrySeconds: float = 30.0
    lockTimeoutSeconds: float = 60.0
    socketTimeout: float = 120.0
    upsertBatchRows: int = 20000
    commitMode: str = "auto"
    maxPreparedPartitions: int | None = None
    badRecords: str | None = None
    """The dead-letter table (in ``schema``); ``None``: ``fail``."""
    secrets: Secrets = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        checkModeAndKeys(self.mode, self.keyColumns)
        if self.commitMode not in COMMIT_MODES:
            raise TwoPhaseConfigError(
                f"option commitMode={self.commitMode!r} is not supported; use auto (prepared "
                "transactions up to a budget, staged beyond it), prepared or staged"
            )
        if self.maxPreparedPartitions is not None and self.commitMode != "auto":
            raise TwoPhaseConfigError(
                "option maxPreparedPartitions only applies to commitMode=auto; remove it, or "
                "set commitMode=auto"
            )
        if self.badRecords is not None and self.commitMode == "staged":
            raise TwoPhaseConfigError(
                f"option badRecords={self.badRecords} sets rejected rows aside in the task's "
                "prepared transaction, and commitMode=staged has none (staged rows are "
                "committed before the batch is decided); use commitMode=auto or prepared, or "
                "badRecords=fail"
            )
        if self.badRecords is not None and self.maxPreparedPartitions is not None:
            raise TwoPhaseConfigError(
                "option maxPreparedPartitions does not apply with badRecords: every partition "
                "holds a prepared transaction; remove one of the two"
            )
        checkBadRecords(self.badRecords, self.table, {self.table: "the target table"})

    @property
    def qualifiedName(self) -> str:
        """The table as SQL text (quoted where needed), for messages."""
        return f"{quoteIdent(self.schema)}.{quoteIdent(self.table)}"

    @property
    def tableIdentifier(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.table)

    def preparedBudget(self, serverLimit: int) -> int:
        """How many partitions (ids ``0..n-1``) use a prepared transaction on a server whose
        ``max_prepared_transactions`` is ``serverLimit``."""
        if self.commitMode == "staged":
            return 0
        if self.commitMode == "prepared" or self.badRecords is not None:
            return serverLimit
        wanted = (
            serverLimit // 2 if self.maxPreparedPartitions is None else self.maxPreparedPartitions
        )
        return max(0, min(wanted, serverLimit))

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> PostgresSettings:
        """Parse Spark-style string options; errors name the option and the fix."""
        target, secrets = connectionOf(options)
        shared = readShared(options, sink="postgres", names=NAMES)
        schema, table = parseTableName(shared.tableText)
        return cls(
            target=target,
            schema=schema,
            table=table,
            mode=shared.mode,
            keyColumns=shared.keyColumns,
            createTable=shared.createTable,
            connectRetrySeconds=shared.connectRetrySeconds,
            lockTimeoutSeconds=floatOption(options, "lockTimeoutSeconds", 60.0, zero=True),
            socketTimeout=shared.socketTimeout,
            upsertBatchRows=intOption(options, _batchsizeName(options), 20000, minimum=1),
            commitMode=(optionOf(options, "commitMode") or "auto").strip().lower(),
            maxPreparedPartitions=(
                intOption(options, "maxPreparedPartitions", 0, minimum=0)
                if optionOf(options, "maxPreparedPartitions") is not None
                else None
            ),
            badRecords=shared.badRecords,
            secrets=secrets,
        )
