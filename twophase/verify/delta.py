"""What a ``twophase.delta`` table holds: the rows of its latest version, read through delta-rs.

``twophase verify --sink delta --sink-option path=...`` reads here. A Delta reader sees only
the files the table's log names, so files moved into the table's directory for a batch whose
commit has not happened yet are not counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from twophase.redaction import redact
from twophase.settings import optionOf
from twophase.verify.errors import VerifyInputError, inputErrors


def actualFromDelta(
    path: str,
    columns: Sequence[str] | None = None,
    options: Mapping[str, str] | None = None,
) -> pa.Table:
    """The rows (``columns``, default all) of the Delta table at ``path``; ``options`` are the
    sink's own (``fs.*``, ``storage.*`` for a table on S3)."""
    return readDelta({**(options or {}), "path": path}, columns)[0]


def readDelta(options: Mapping[str, str], columns: Sequence[str] | None) -> tuple[pa.Table, str]:
    """:func:`actualFromDelta` from the sink's options, and a description for the report."""
    from twophase.sinks.delta import DeltaSettings
    from twophase.sinks.delta.table import deltalake, openTable

    path = (optionOf(options, "path") or "").strip()
    if not path:
        raise VerifyInputError("delta sink: give the table's directory as --sink-option path=...")
    with inputErrors("delta sink", ValueError):
        settings = DeltaSettings.fromOptions(options)
    module = deltalake()
    with inputErrors("delta sink", module.exceptions.DeltaError, OSError):
        table = openTable(settings.tableUri, settings.storage)
        if table is None:
            raise VerifyInputError(redact(f"delta sink: there is no Delta table at {path}"))
        names = list(columns) if columns else None
        missing = [c for c in names or () if c not in table.schema().to_arrow().names]
        if missing:
            raise VerifyInputError(
                f"delta sink: the table at {path} has no column {', '.join(missing)}"
            )
        rows = pa.table(table.to_pyarrow_table(columns=names))
    return rows, redact(f"delta {path} (version {table.version()})")


def readDeltaSink(
    options: Mapping[str, str], columns: Sequence[str] | None, hints: pa.Schema | None
) -> tuple[pa.Table, str]:
    """The Delta sink's reader for verify (a table's types are its own: ``hints`` unused)."""
    return readDelta(options, columns)


__all__ = ["actualFromDelta", "readDelta", "readDeltaSink"]
