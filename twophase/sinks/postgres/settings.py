"""The postgres sink's options, parsed and checked once into ``PostgresSettings``.

Also says which options may be written to the checkpoint's ``sink.json`` (``SAFE_OPTIONS``, in
the form ``publicOptionValue`` gives them): every option a committer needs to commit, abort or
recover from there alone, and no secret.
"""

from __future__ import annotations

import re
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
from twophase.settings import TwoPhaseConfigError, boolOption, floatOption, intOption, optionOf

MODES = ("append", "upsert")

COMMIT_MODES = ("auto", "prepared", "staged")
"""Values of option ``commitMode``: how a task's rows wait for the driver's decision."""

SAFE_OPTIONS = frozenset(
    {
        "url",
        "table",
        "dbtable",
        "mode",
        "keycolumns",
        "createtable",
        "user",
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslcrl",
        "applicationname",
        "targetsessionattrs",
        "connecttimeout",
        "connectretryseconds",
        "locktimeoutseconds",
        "sockettimeout",
        "upsertbatchrows",
        "commitmode",
        "maxpreparedpartitions",
        "badrecords",
    }
    | {f"pg.{keyword}" for keyword in PUBLIC_LIBPQ_KEYWORDS}
)
"""Options (lower-cased) that may be persisted: never ``password``, ``sslpassword``, ``sslkey``
or a ``pg.*`` keyword that can hold a secret. ``url`` is persisted without its password."""

_IDENT_PART = re.compile(r'\s*(?:"((?:[^"]|"")+)"|([^".\s]+))\s*')


def parseTableName(text: str) -> tuple[str, str]:
    """``schema.table`` as PostgreSQL reads it: unquoted parts fold to lower case, ``"Quoted"``
    parts keep their case (``""`` is a quote). An unqualified name means schema ``public``."""
    parts: list[str] = []
    pos = 0
    while True:
        match = _IDENT_PART.match(text, pos)
        if match is None or match.end() == pos:
            raise TwoPhaseConfigError(
                f"option table={text!r} is not a table name; use <schema>.<table> (quote parts "
                'with double quotes to keep upper case or dots: "MySchema"."My Table")'
            )
        quoted, plain = match.group(1), match.group(2)
        parts.append(quoted.replace('""', '"') if quoted is not None else plain.lower())
        pos = match.end()
        if pos == len(text):
            break
        if text[pos] != ".":
            raise TwoPhaseConfigError(f"option table={text!r}: unexpected {text[pos]!r}")
        pos += 1
    if len(parts) == 1:
        return "public", parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise TwoPhaseConfigError(
        f"option table={text!r} has {len(parts)} parts; use <schema>.<table> (the database "
        "comes from the url)"
    )


def quoteIdent(name: str) -> str:
    """An identifier as SQL text, quoted only when PostgreSQL needs it (for messages)."""
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


def publicOptionValue(key: str, value: str) -> str | None:
    """How an allowed option is written to ``sink.json``: ``url`` as a ``key=value`` string
    without any password (``None`` when it cannot be read), every other option as given."""
    if key.lower() == "url":
        return publicConninfo(value)
    return value


def _splitColumns(text: str) -> tuple[str, ...]:
    names = tuple(part.strip().strip('"') for part in text.split(","))
    if not all(names) or len(set(names)) != len(names):
        raise TwoPhaseConfigError(
            f"option keyColumns={text!r} must list distinct, non-empty column names separated "
            "by commas"
        )
    return names


def _nonNegative(options: Mapping[str, str], name: str, default: float) -> float:
    raw = optionOf(options, name)
    if raw is not None and raw.strip() in ("0", "0.0"):
        return 0.0
    return floatOption(options, name, default)


_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")


def _badRecordsTable(options: Mapping[str, str]) -> str | None:
    """Option ``badRecords``: ``fail`` (``None``) or a plain table name, folded to lower case
    as PostgreSQL folds an unquoted name."""
    raw = (optionOf(options, "badRecords") or "fail").strip()
    if raw.lower() == "fail":
        return None
    if not _TABLE_NAME.fullmatch(raw):
        raise TwoPhaseConfigError(
            f"option badRecords={raw!r} must be fail (the default: a rejected row fails the "
            "batch) or the name of a table beside the target (letters, digits, '_', at most 63, "
            "no schema: it lives in the target's), e.g. badRecords=orders_rejected"
        )
    return raw.lower()


@dataclass(frozen=True)
class PostgresSettings:
    """The postgres sink's options, parsed and checked once (``PostgresSettings.fromOptions``).

    - ``url`` (required): ``postgresql://user[:password]@host:port/dbname?sslmode=...`` (a
      ``jdbc:`` prefix is accepted) or a libpq ``key=value`` string. The password may instead
      come from the ``password`` option, ``PGPASSWORD`` or ``~/.pgpass`` (the driver's
      ``twophase recover`` relies on those: secrets are never written to the checkpoint).
    - ``table`` (required): ``schema.table`` (``public`` when unqualified); PostgreSQL's
      identifier rules, so ``"Quoted"`` keeps its case.
    - ``mode``: ``append`` (default, ``COPY``) or ``upsert`` (``INSERT ... ON CONFLICT``).
    - ``keyColumns``: comma-separated conflict columns, required by ``mode=upsert``; the table
      needs a primary key or unique index on exactly them.
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
    - ``upsertBatchRows``: rows per ``INSERT ... ON CONFLICT`` statement (default 20000).
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
        if self.mode not in MODES:
            raise TwoPhaseConfigError(
                f"option mode={self.mode!r} is not supported; use append or upsert"
            )
        if self.mode == "upsert" and not self.keyColumns:
            raise TwoPhaseConfigError(
                "option mode=upsert needs option keyColumns: the comma-separated columns of the "
                "table's primary key or unique index that identify a row"
            )
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
        if self.badRecords is not None and self.badRecords == self.table:
            raise TwoPhaseConfigError(
                f"option badRecords={self.badRecords} names the target table: choose another "
                f"table for the rows PostgreSQL rejects, e.g. badRecords={self.table}_rejected"
            )
        if self.mode == "append" and self.keyColumns:
            raise TwoPhaseConfigError(
                "option keyColumns is only used with mode=upsert; remove it, or set "
                "mode=upsert to update rows whose keys exist"
            )

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
        tableText = (optionOf(options, "table") or optionOf(options, "dbtable") or "").strip()
        if not tableText:
            raise TwoPhaseConfigError(
                'the postgres sink needs .option("table", "<schema>.<table>")'
            )
        schema, table = parseTableName(tableText)
        mode = (optionOf(options, "mode") or "append").strip().lower()
        keysText = (optionOf(options, "keyColumns") or "").strip()
        return cls(
            target=target,
            schema=schema,
            table=table,
            mode=mode,
            keyColumns=_splitColumns(keysText) if keysText else (),
            createTable=boolOption(options, "createTable", False),
            connectRetrySeconds=_nonNegative(options, "connectRetrySeconds", 30.0),
            lockTimeoutSeconds=_nonNegative(options, "lockTimeoutSeconds", 60.0),
            socketTimeout=_nonNegative(options, "socketTimeout", 120.0),
            upsertBatchRows=intOption(options, "upsertBatchRows", 20000, minimum=1),
            commitMode=(optionOf(options, "commitMode") or "auto").strip().lower(),
            maxPreparedPartitions=(
                intOption(options, "maxPreparedPartitions", 0, minimum=0)
                if optionOf(options, "maxPreparedPartitions") is not None
                else None
            ),
            badRecords=_badRecordsTable(options),
            secrets=secrets,
        )
