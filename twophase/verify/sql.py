"""What a ``twophase.sql`` table holds: its committed rows, read through SQLAlchemy.

``twophase verify --sink sql --sink-option url=... --sink-option dbtable=...`` reads here; the
options are the sink's own (``url`` an SQLAlchemy URL, ``user``/``password`` overriding it).
A plain connection only sees committed rows, so prepared transactions are not counted. With
the sink's ``badRecords`` option, the rows it set aside in that table count as held too (their
JSON read back into the columns).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from twophase.redaction import getLogger, redact
from twophase.settings import TwoPhaseConfigError
from twophase.verify.errors import VerifyInputError, inputErrors

log = getLogger(__name__)


def actualFromSql(
    url: str,
    table: str,
    *,
    columns: Sequence[str] | None = None,
    options: Mapping[str, str] | None = None,
) -> pa.Table:
    """The committed rows of the table (``columns``, default all) at the SQLAlchemy ``url``."""
    return readSql({**(options or {}), "url": url, "dbtable": table}, columns, None)[0]


def readSql(
    options: Mapping[str, str], columns: Sequence[str] | None, hints: pa.Schema | None
) -> tuple[pa.Table, str]:
    """:func:`actualFromSql` and a description for the report; columns cast to ``hints``'
    types where they have one (the source's side), so both sides compare alike."""
    from twophase.sinks.sql import SqlSettings
    from twophase.sinks.sql.dialect import tableText

    with inputErrors("sql sink", TwoPhaseConfigError):
        s = SqlSettings.fromOptions(options)
    where = f"sql table {s.qualifiedName} at {s.describe()}"
    engine = sa.create_engine(s.url, poolclass=sa.pool.NullPool)
    started = time.monotonic()
    try:
        with engine.connect() as conn:
            present = [c["name"] for c in sa.inspect(conn).get_columns(s.table, schema=s.schema)]
            if not present:
                raise VerifyInputError(f"{where}: no such table; check dbtable and the url")
            wanted = list(columns) if columns is not None else present
            absent = [c for c in wanted if c not in present]
            if absent:
                raise VerifyInputError(
                    f"{where}: no column {', '.join(absent)} (it has {', '.join(present)}); "
                    "name the sink's columns with --sink-columns"
                )
            quoted = ", ".join(str(engine.dialect.identifier_preparer.quote(c)) for c in wanted)
            result = conn.exec_driver_sql(
                f"SELECT {quoted} FROM {tableText(engine.dialect, s.schema, s.table)}"
            )
            rows: list[Any] = list(result.fetchall())
            if s.badRecords is not None:
                aside = _setAside(conn, engine.dialect, s.schema, s.badRecords, wanted)
                where += f" and {len(aside)} row(s) set aside in {s.badRecords}"
                rows = [*rows, *aside]
    except sa.exc.NoSuchTableError:
        raise VerifyInputError(f"{where}: no such table; check dbtable and the url") from None
    except sa.exc.SQLAlchemyError as exc:
        text = redact(str(getattr(exc, "orig", exc)).split("\n")[0])
        raise VerifyInputError(
            f"{where}: {text}; check the url, the credentials and the server"
        ) from None
    finally:
        engine.dispose()
    arrays = []
    for i, name in enumerate(wanted):
        values = [r[i] for r in rows]
        kind = hints.field(name).type if hints is not None and name in hints.names else None
        try:
            arrays.append(pa.array(values, kind) if kind is not None else pa.array(values))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            arrays.append(pa.array([None if v is None else str(v) for v in values], pa.string()))
    table = pa.table(arrays, names=wanted)
    log.info("%d rows of %s in %.2f s", table.num_rows, where, time.monotonic() - started)
    return table, where


def _setAside(
    conn: sa.Connection, dialect: sa.Dialect, schema: str | None, table: str, wanted: list[str]
) -> list[tuple[object, ...]]:
    """The rows the sink set aside in its ``badRecords`` table (committed ones only), as
    ``wanted``'s values read from their JSON: they count as held, once each."""
    from twophase.sinks.sql.dialect import tableText

    records = conn.exec_driver_sql(
        f"SELECT record FROM {tableText(dialect, schema, table)}"
    ).scalars()
    rows = []
    for text in records:
        record = json.loads(text) if text else None
        if not isinstance(record, dict):
            continue
        rows.append(tuple(record.get(c) for c in wanted))
    return rows


__all__ = ["actualFromSql", "readSql"]
