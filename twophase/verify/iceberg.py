"""What a ``twophase.iceberg`` table holds: the rows of its current snapshot, read by pyiceberg.

``twophase verify --sink iceberg --sink-option table=ns.name --sink-option catalog.type=sql
...`` reads here. An Iceberg reader sees only the files the current snapshot's manifests name,
so files moved under the table for a batch whose commit has not happened yet are not counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from twophase.redaction import redact
from twophase.verify.errors import VerifyInputError, inputErrors


def actualFromIceberg(
    table: str, options: Mapping[str, str], columns: Sequence[str] | None = None
) -> pa.Table:
    """The rows (``columns``, default all) of the Iceberg table ``table`` (``namespace.name``);
    ``options`` are the sink's own (``catalog.*``, ``fs.*``)."""
    return readIceberg({**options, "table": table}, columns)[0]


def readIceberg(options: Mapping[str, str], columns: Sequence[str] | None) -> tuple[pa.Table, str]:
    """:func:`actualFromIceberg` from the sink's options, and a description for the report."""
    from twophase.sinks.iceberg import IcebergSettings, catalogOf
    from twophase.sinks.iceberg.table import openTable

    with inputErrors("iceberg sink", ValueError):
        settings = IcebergSettings.fromOptions(options)
    with inputErrors("iceberg sink", ValueError, OSError):
        table = openTable(catalogOf(settings), settings.table)
        if table is None:
            raise VerifyInputError(
                redact(f"iceberg sink: there is no Iceberg table {settings.table} in the catalog")
            )
        names = [f.name for f in table.schema().fields]
        missing = [c for c in columns or () if c not in names]
        if missing:
            raise VerifyInputError(
                f"iceberg sink: the table {settings.table} has no column {', '.join(missing)}"
            )
        scan = table.scan(selected_fields=tuple(columns) if columns else ("*",))
        rows = scan.to_arrow()
        snapshot = table.current_snapshot()
    where = f"snapshot {snapshot.snapshot_id}" if snapshot is not None else "no snapshot"
    return rows, redact(f"iceberg {settings.table} ({where})")


def readIcebergSink(
    options: Mapping[str, str], columns: Sequence[str] | None, hints: pa.Schema | None
) -> tuple[pa.Table, str]:
    """The Iceberg sink's reader for verify (a table's types are its own: ``hints`` unused)."""
    return readIceberg(options, columns)


__all__ = ["actualFromIceberg", "readIceberg", "readIcebergSink"]
