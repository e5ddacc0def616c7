"""The sql sink's least privileges on MySQL/MariaDB: which grants it needs, checked before a batch.

The driver reads the grants of the session's user (and its current role) from
``information_schema`` (``USER_PRIVILEGES``, ``SCHEMA_PRIVILEGES``, ``TABLE_PRIVILEGES``: each
user sees its own) before any task writes, and names every missing one with the ``GRANT`` that
fixes it. What is needed (docs/security.md has the table as tested on MariaDB 10.11):

- the target: ``INSERT``; ``mode=upsert`` adds ``SELECT`` and ``UPDATE`` (``ON DUPLICATE KEY
  UPDATE c = VALUES(c)`` reads the columns it sets); a
  missing target with ``createTable=true``: ``CREATE`` on the database instead;
- the marker table (``markerTable``): ``INSERT`` (each task's marker), ``SELECT`` (a commit
  that finds its xid finished reads it) and ``DELETE`` (old markers are pruned); when it is
  missing, ``CREATE`` and those three on the database (MariaDB gives a table's creator no
  privilege on it), or an administrator makes it;
- ``badRecords``: ``INSERT`` on the dead-letter table, or ``CREATE`` to make it;
- XA: nothing. On MariaDB 10.11 any user lists every prepared XA transaction (``XA RECOVER``)
  and commits or rolls back one another session prepared; MySQL 8 needs ``XA_RECOVER_ADMIN``,
  which ``schema`` checks by running ``XA RECOVER``.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from twophase.protocol.errors import SinkFailure
from twophase.sinks.sql.errors import SqlSinkError
from twophase.sinks.sql.settings import SqlSettings


@dataclass(frozen=True)
class Need:
    """One privilege the sink's user needs on ``table`` (``None``: on the database)."""

    privilege: str
    table: str | None
    why: str


def _visible(conn: Connection, schema: str, table: str) -> bool:
    return (
        conn.execute(
            sa.text(
                "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = :s "
                "AND TABLE_NAME = :t"
            ),
            {"s": schema, "t": table},
        ).first()
        is not None
    )


def needed(conn: Connection, s: SqlSettings, schema: str) -> list[Need]:
    """The grants ``s`` needs, given which of its tables the user sees already."""
    needs: list[Need] = []
    if _visible(conn, schema, s.table):
        needs.append(Need("INSERT", s.table, f"mode={s.mode} writes the rows"))
        if s.mode == "upsert":
            why = "ON DUPLICATE KEY UPDATE reads and updates existing keys"
            needs.append(Need("SELECT", s.table, why))
            needs.append(Need("UPDATE", s.table, why))
    elif s.createTable:
        needs.append(Need("CREATE", None, "createTable=true creates the table"))
    else:
        return []  # the table checks that follow say it is missing, or not visible
    if _visible(conn, schema, s.markerTable):
        for privilege, why in (
            ("INSERT", "each task writes its commit marker"),
            ("SELECT", "a commit whose xid is finished reads its marker"),
            ("DELETE", "old markers are pruned"),
        ):
            needs.append(Need(privilege, s.markerTable, why))
    else:
        # MariaDB gives the creator of a table no privilege on it: the grants the marker
        # table needs must then be held on the database (or an administrator makes it).
        made = f"on the marker table {s.markerTable} it creates"
        needs.append(Need("CREATE", None, f"the marker table {s.markerTable} is created"))
        needs.extend(Need(p, None, made) for p in ("INSERT", "SELECT", "DELETE"))
    if s.badRecords is not None:
        if _visible(conn, schema, s.badRecords):
            needs.append(Need("INSERT", s.badRecords, "badRecords sets rows aside there"))
        else:
            needs.append(Need("CREATE", None, f"badRecords creates {s.badRecords}"))
    return needs


def held(conn: Connection, schema: str, table: str | None) -> set[str]:
    """The privileges the session's user and current role hold on ``table`` of ``schema``
    (or on the database), globally, on the database (patterns too) or on the table."""
    me = conn.execute(sa.text("SELECT CURRENT_USER(), CURRENT_ROLE()")).one()
    user, _, host = str(me[0]).rpartition("@")
    grantees = [f"'{user}'@'{host}'"]
    if me[1]:
        grantees += [f"'{me[1]}'", f"'{me[1]}'@''"]
    params = {"g": grantees, "s": schema, "t": table or ""}
    rows = conn.execute(
        sa.text(
            "SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES WHERE GRANTEE IN :g "
            "UNION SELECT PRIVILEGE_TYPE FROM information_schema.SCHEMA_PRIVILEGES "
            "WHERE GRANTEE IN :g AND :s LIKE TABLE_SCHEMA "
            "UNION SELECT PRIVILEGE_TYPE FROM information_schema.TABLE_PRIVILEGES "
            "WHERE GRANTEE IN :g AND TABLE_SCHEMA = :s AND TABLE_NAME = :t"
        ).bindparams(sa.bindparam("g", expanding=True)),
        params,
    )
    return {str(r[0]).upper() for r in rows}


def checkPrivileges(conn: Connection, s: SqlSettings) -> None:
    """Driver, before a batch (MySQL/MariaDB): every grant ``needed`` is held, else one
    ``SqlSinkError`` (reason ``CREDENTIALS``: never retried) naming each missing grant, the
    user and the ``GRANT`` statements that fix it."""
    schema = s.schema or str(conn.execute(sa.text("SELECT DATABASE()")).scalar() or "")
    if not schema:
        return
    missing = [n for n in needed(conn, s, schema) if n.privilege not in held(conn, schema, n.table)]
    if not missing:
        return
    who = str(conn.execute(sa.text("SELECT CURRENT_USER()")).scalar())
    user, _, host = who.rpartition("@")

    def on(n: Need) -> str:
        return f"`{schema}`.`{n.table}`" if n.table else f"`{schema}`.*"

    lacks = "; ".join(
        f"{n.privilege} on {'table ' + schema + '.' + n.table if n.table else 'database ' + schema}"
        f" ({n.why})"
        for n in missing
    )
    grants = "; ".join(f"GRANT {n.privilege} ON {on(n)} TO '{user}'@'{host}'" for n in missing)
    raise SqlSinkError(
        f"sql sink, table {s.qualifiedName}: user '{user}'@'{host}' at {s.describe()} lacks "
        f"{lacks}. Nothing was written. Fix: have an administrator run {grants}; or connect "
        "as a user that holds them (docs/security.md lists what each option needs).",
        system="MariaDB" if s.url.get_backend_name() == "mariadb" else "MySQL",
        reason=SinkFailure.CREDENTIALS,
    )


__all__ = ["Need", "checkPrivileges", "held", "needed"]
