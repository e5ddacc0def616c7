"""The postgres sink's least privileges: which grants its options need, checked before a batch.

The driver asks the server (``has_schema_privilege``, ``has_table_privilege``) for each grant
the sink's role needs, before any task writes, and names every missing one with the ``GRANT``
that fixes it. What is needed (docs/security.md has the table as tested):

- always: ``USAGE`` on the target's schema;
- the target: ``INSERT``; ``mode=upsert`` adds ``SELECT`` (``ON CONFLICT`` reads the key) and
  ``UPDATE``; a missing target with ``createTable=true``: ``CREATE`` on the schema instead;
- ``commitMode=staged``: ``SELECT``, ``INSERT``, ``DELETE`` on the staging and marker tables
  when an administrator made them; else ``CREATE`` on the schema and ``SELECT`` on the target
  (``CREATE TABLE ... LIKE`` reads it), which ``staging.ensureStagingTables`` finds by trying,
  naming the role and the DDL an administrator can run instead (``auto`` only warns);
- ``badRecords``: ``INSERT`` on the dead-letter table, or ``CREATE`` on the schema to make it.

``COMMIT PREPARED`` and ``ROLLBACK PREPARED`` need no grant but must be run by the role that
prepared the transaction (or a superuser): ``finishRefused`` says so naming both roles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from twophase.protocol.errors import SinkFailure
from twophase.sinks.postgres.dialect import quoteIdent
from twophase.sinks.postgres.errors import PostgresSinkError
from twophase.sinks.postgres.settings import PostgresSettings
from twophase.sinks.postgres.staging import StagingNames


@dataclass(frozen=True)
class Need:
    """One privilege the sink's role needs: ``privilege`` on ``kind`` ``name`` (SQL text),
    and ``why``, for the message."""

    privilege: str
    kind: str
    name: str
    why: str

    def grant(self, role: str) -> str:
        on = "SCHEMA " if self.kind == "schema" else ""
        return f"GRANT {self.privilege} ON {on}{self.name} TO {quoteIdent(role)}"


def _exists(conn: psycopg.Connection[Any], name: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


def needed(conn: psycopg.Connection[Any], s: PostgresSettings) -> list[Need]:
    """The grants ``s`` needs on this server beside ``USAGE`` on the schema, given which of its
    tables exist already."""
    schema = quoteIdent(s.schema)
    target = s.qualifiedName
    needs: list[Need] = []
    if _exists(conn, target):
        needs.append(Need("INSERT", "table", target, f"mode={s.mode} writes the rows"))
        if s.mode == "upsert":
            needs.append(Need("SELECT", "table", target, "INSERT ... ON CONFLICT reads the keys"))
            needs.append(Need("UPDATE", "table", target, "mode=upsert updates existing keys"))
    elif s.createTable:
        needs.append(Need("CREATE", "schema", schema, "createTable=true creates the table"))
        return needs
    if s.commitMode == "staged" and s.badRecords is None:
        names = StagingNames.of(s)
        if _exists(conn, names.stagingText) and _exists(conn, names.markersText):
            for table in (names.stagingText, names.markersText):
                for privilege in ("SELECT", "INSERT", "DELETE"):
                    needs.append(
                        Need(privilege, "table", table, "commitMode=staged moves staged rows")
                    )
    if s.badRecords is not None:
        deadLetter = f"{schema}.{quoteIdent(s.badRecords)}"
        if _exists(conn, deadLetter):
            needs.append(Need("INSERT", "table", deadLetter, "badRecords sets rows aside there"))
        else:
            needs.append(Need("CREATE", "schema", schema, "badRecords creates its table"))
    return needs


def _has(conn: psycopg.Connection[Any], need: Need) -> bool:
    if need.kind == "schema":
        row = conn.execute(
            "SELECT has_schema_privilege(oid, %s) FROM pg_namespace WHERE nspname = %s",
            (need.privilege, need.name.strip('"').replace('""', '"')),
        ).fetchone()
    else:
        row = conn.execute(
            "SELECT has_table_privilege(%s, %s)", (need.name, need.privilege)
        ).fetchone()
    return bool(row and row[0])


def checkPrivileges(conn: psycopg.Connection[Any], s: PostgresSettings) -> None:
    """Driver, before a batch: every grant ``needed`` is held by the session's role, else one
    ``PostgresSinkError`` (reason ``CREDENTIALS``: never retried) naming each missing grant,
    the role and the ``GRANT`` statements that fix it. A schema that does not exist is left to
    the table checks that follow (they name it)."""
    exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (s.schema,)).fetchone()
    if exists is None:
        return
    row = conn.execute("SELECT current_user").fetchone()
    role = str(row[0]) if row else s.target.get("user")
    usage = Need("USAGE", "schema", quoteIdent(s.schema), "every statement names the table in it")
    # Without USAGE no name in the schema can be looked up: that one is all there is to say.
    missing = (
        [usage] if not _has(conn, usage) else [n for n in needed(conn, s) if not _has(conn, n)]
    )
    if not missing:
        return
    lacks = "; ".join(f"{n.privilege} on {n.kind} {n.name} ({n.why})" for n in missing)
    grants = "; ".join(n.grant(role) for n in missing)
    raise PostgresSinkError(
        f"postgres sink, table {s.qualifiedName}: role {role!r} at {s.target.describe()} "
        f"lacks {lacks}. Nothing was written. Fix: have the owner or an administrator run "
        f"{grants}; or connect as a role that holds them (docs/security.md lists what each "
        "option needs).",
        reason=SinkFailure.CREDENTIALS,
    )


def finishRefused(
    conn: psycopg.Connection[Any], gid: str, verb: str, what: str
) -> PostgresSinkError:
    """The error for ``COMMIT PREPARED`` or ``ROLLBACK PREPARED`` (``verb``) refused to this
    session's role: only the role that prepared ``gid`` (or a superuser) may finish it."""
    row = conn.execute(
        "SELECT current_user, (SELECT owner FROM pg_prepared_xacts WHERE gid = %s)", (gid,)
    ).fetchone()
    me, owner = (str(row[0]), str(row[1])) if row else ("?", "?")
    return PostgresSinkError(
        f"postgres: {what}: role {me!r} may not run {verb} of {gid}: it was prepared by role "
        f"{owner!r}, and only that role (or a superuser) may finish it. Fix: give the driver "
        f"the same user as the tasks (option user or url: {owner}), with its password; the "
        "decision is kept and the next start commits it.",
        reason=SinkFailure.CREDENTIALS,
    )


__all__ = ["Need", "checkPrivileges", "finishRefused", "needed"]
