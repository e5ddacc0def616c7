"""MySQL/MariaDB append mode: a record batch sent by ``LOAD DATA LOCAL INFILE``, kept only
when the server took every row without a warning, else undone for the ``INSERT`` path.

With ``LOCAL`` the server cannot stop the client's transfer, so it turns what would refuse a
row (a duplicate key, a value too long, NULL into ``NOT NULL``, a bad number) into a warning
and skips or alters the row. ``loadBatch`` therefore runs the load under a savepoint inside
the task's XA transaction and keeps it only when the server's count of rows equals the rows
sent and it raised no warning (notes included); otherwise it rolls back to the savepoint and
answers ``False``: the writer sends the batch as multi-row ``INSERT``s, which raise the exact
error, or set rows aside with ``badRecords``, as without this module.

PyMySQL sends a file by name, so the rows (tab-separated lines built by Arrow's compute
kernels, written from the Arrow buffer) go to an anonymous in-memory file on Linux
(``memfd_create``, named by ``/proc/self/fd``): nothing of them reaches a disk or outlives a
killed task. Elsewhere they go to a temporary file, removed at once. An engine's
connections announce the ``LOCAL`` capability but PyMySQL answers a server's file request
only while ``loadBatch`` runs its own statement. A server that refuses ``LOCAL`` turns this
off for the engine for good.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from twophase.redaction import getLogger
from twophase.resources import Resources
from twophase.sinks.sql.dialect import mysqlCode, quote, tableText
from twophase.sinks.sql.transaction import SqlTransaction

log = getLogger(__name__)

MIN_ROWS = 1000
"""Smallest record batch loaded: below it the extra statements cost more than they save
(measured on MariaDB 10.11: 100-row tasks 15% slower, 1,000-row ones 3% faster)."""

LOCAL_REFUSED = (1148, 3948, 4166)
"""The server or the session does not allow ``LOCAL``: "command not allowed" (MySQL),
"loading local data is disabled" (MySQL 8), "local infile capability disabled" (MariaDB)."""

_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"), ("\x00", "\\0"))
"""``LOAD DATA``'s escapes with its default ``ESCAPED BY '\\'``; backslash first."""

_HEX = np.frombuffer(b"".join(b"%02x" % i for i in range(256)), np.uint8).reshape(256, 2)


class LocalInfile:
    """Per engine: whether ``LOCAL`` still works. Its connections connect with PyMySQL's
    ``local_infile`` (the capability flag is sent at login), then answer no file request
    until ``loadBatch`` allows one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.usable = True

    def refused(self, exc: BaseException) -> None:
        with self._lock:
            if not self.usable:
                return
            self.usable = False
        log.debug("sql: the server refuses LOAD DATA LOCAL (%s); rows go as INSERT", exc)


def enable(engine: Engine, resources: Resources | None) -> LocalInfile:
    """``engine``'s ``LocalInfile``, created with the listeners that set it up on first use."""

    def open() -> LocalInfile:
        state = LocalInfile()

        @sa.event.listens_for(engine, "do_connect")
        def _announce(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
            cparams.setdefault("local_infile", True)

        @sa.event.listens_for(engine, "connect")
        def _closed(dbapiConnection: Any, record: Any) -> None:
            _allowFiles(dbapiConnection, False)

        return state

    owner = resources or Resources.ofProcess()
    return owner.get(("sql.localInfile", engine), open)


def _allowFiles(raw: Any, allowed: bool) -> None:
    """Whether PyMySQL answers the server's next request for a client file."""
    if hasattr(raw, "_local_infile"):
        raw._local_infile = allowed


def linesText(batch: pa.RecordBatch) -> tuple[pa.Array, list[bool]] | None:
    """Each row of ``batch`` as one ``LOAD DATA`` line (fields tab-separated, ending in a
    newline), and which columns went as hex; ``None`` when a column's type has no exact text
    form here (the caller then uses ``INSERT``). NULL is ``\\N``, an empty string an empty
    field; numbers, dates and timestamps (UTC wall time, as ``dialect.valuesText``) as Arrow
    writes them, booleans as 1 and 0, binary as hex (``UNHEX`` on the server)."""
    texts, hexed = [], []
    for column in batch.columns:
        t = column.type
        isHex = False
        if pa.types.is_timestamp(t):
            column = column.cast(pa.timestamp(t.unit))
        if (
            pa.types.is_integer(t)
            or pa.types.is_floating(t)
            or pa.types.is_decimal(t)
            or pa.types.is_date(t)
            or pa.types.is_timestamp(t)
        ):
            text = column.cast(pa.string())
        elif pa.types.is_boolean(t):
            text = pc.if_else(column, "1", "0")
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            text = column.cast(pa.string())
            for raw, escaped in _ESCAPES:
                text = pc.replace_substring(text, raw, escaped)
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
            text, isHex = _hex(column), True
        else:
            return None
        texts.append(pc.fill_null(text, "\\N"))
        hexed.append(isHex)
    if len(texts) == 1:
        return pc.binary_join_element_wise(texts[0], "\n", ""), hexed
    return pc.binary_join_element_wise(*texts, "\n", "\t"), hexed


def _hex(column: pa.Array) -> pa.Array:
    """Binary values as lowercase hex text (numpy over the value buffer, no Python per
    value); nulls stay null."""
    values = column.cast(pa.large_binary())
    validity, offsetsBuffer, data = values.buffers()
    offsets = np.frombuffer(offsetsBuffer, np.int64)[
        values.offset : values.offset + len(values) + 1
    ]
    first, last = int(offsets[0]), int(offsets[-1])
    octets = (
        np.frombuffer(data, np.uint8)[first:last] if data is not None else np.zeros(0, np.uint8)
    )
    digits = _HEX[octets].reshape(-1)
    shifted = pa.Array.from_buffers(
        pa.large_string(),
        len(values),
        [None, pa.py_buffer((offsets - first) * 2), pa.py_buffer(digits.tobytes())],
    )
    if validity is not None:
        shifted = pc.if_else(values.is_valid(), shifted, pa.scalar(None, pa.large_string()))
    return shifted.cast(pa.string())


def _fileBytes(lines: pa.Array) -> memoryview:
    """The lines' UTF-8 text as it sits in the Arrow buffer (no copy)."""
    _, offsetsBuffer, data = lines.buffers()
    offsets = np.frombuffer(offsetsBuffer, np.int32)[lines.offset : lines.offset + len(lines) + 1]
    return memoryview(data)[int(offsets[0]) : int(offsets[-1])]


def loadBatch(
    txn: SqlTransaction, state: LocalInfile, schema: str | None, table: str, batch: pa.RecordBatch
) -> bool:
    """Send ``batch`` into ``txn``'s open transaction by ``LOAD DATA LOCAL INFILE``: ``True``
    when every row went in without a warning; ``False`` with nothing of it left (the caller
    sends it by ``INSERT``). Raises only when the savepoint cannot be restored (the
    connection is gone): then the load's own error."""
    assert txn.conn is not None
    if not state.usable or batch.num_rows < MIN_ROWS or not txn.backslashEscapes:
        return False
    raw: Any = txn.conn.connection.dbapi_connection
    if str(getattr(raw, "charset", "")) != "utf8mb4":
        return False  # the file is UTF-8: load only when the session's text is too
    encoded = linesText(batch)
    if encoded is None:
        return False
    lines, hexed = encoded
    dialect = txn.conn.dialect
    targets, sets = [], []
    for index, (name, isHex) in enumerate(zip(batch.schema.names, hexed, strict=True)):
        column = quote(dialect, name)
        if isHex:
            targets.append(f"@v{index}")
            sets.append(f"{column} = UNHEX(@v{index})")
        else:
            targets.append(column)
    with _rowsFile(_fileBytes(lines)) as path:
        statement = (
            f"LOAD DATA LOCAL INFILE {raw.escape(path)} INTO TABLE "
            f"{tableText(dialect, schema, table)} CHARACTER SET utf8mb4 "
            f"({', '.join(targets)})" + (f" SET {', '.join(sets)}" if sets else "")
        )
        with raw.cursor() as cursor:
            cursor.execute("SAVEPOINT twophase_load")
            try:
                _allowFiles(raw, True)
                try:
                    loaded = cursor.execute(statement)
                finally:
                    _allowFiles(raw, False)
                warnings = _warnings(raw, cursor)
            except Exception as exc:
                if mysqlCode(exc) in LOCAL_REFUSED:
                    state.refused(exc)
                try:
                    cursor.execute("ROLLBACK TO SAVEPOINT twophase_load")
                except Exception:
                    raise exc from None
                return False
            if loaded != batch.num_rows or warnings:
                cursor.execute("ROLLBACK TO SAVEPOINT twophase_load")
                return False
            cursor.execute("RELEASE SAVEPOINT twophase_load")
            return True


@contextmanager
def _rowsFile(data: memoryview) -> Iterator[str]:
    """A name PyMySQL can open that reads ``data``: an in-memory file where the system has
    them (gone with the process, even a killed one), else a temporary file."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("twophase-load", os.MFD_CLOEXEC)
        try:
            with os.fdopen(fd, "wb", closefd=False) as file:
                file.write(data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    fd, path = tempfile.mkstemp(prefix="twophase-load-", suffix=".tsv")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        yield path
    finally:
        os.unlink(path)


def _warnings(raw: Any, cursor: Any) -> int:
    """The load's warnings and notes, from its OK packet (PyMySQL keeps it), else asked."""
    result = getattr(raw, "_result", None)
    count = getattr(result, "warning_count", None)
    if isinstance(count, int):
        return count
    cursor.execute("SELECT @@warning_count")
    return int(cursor.fetchone()[0])


__all__ = ["MIN_ROWS", "LocalInfile", "enable", "linesText", "loadBatch"]
