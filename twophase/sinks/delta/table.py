"""The Delta table itself, through delta-rs: created, checked against the stream, committed to.

Every call into the ``deltalake`` package lives here. A batch becomes visible in one log commit
that adds its data files and carries an application transaction (``txn``: the sink's app id,
version = batch id), so the table itself says which batches it holds: a replayed commit finds
its version there and does nothing, whoever committed to the table in between.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from twophase.protocol.errors import SinkFailure, SinkSystemError
from twophase.resources import Resources
from twophase.sinks.delta.settings import DeltaSettings
from twophase.sinks.files import checkWritable
from twophase.sinks.files.errors import FilesSinkError, isUntrusted
from twophase.sinks.files.formats import utcTimestamps
from twophase.sinks.files.trust import checkPathTrust, verifyHandshake

if TYPE_CHECKING:
    from deltalake import DeltaTable

APP_ID_PREFIX = "twophase-"
"""Application transaction ids are ``twophase-<sinkId>``."""

_REFUSED_CONFIGURATION = {
    "delta.columnMapping.mode": "column mapping (its data files name columns by id)",
}
_REFUSED_FEATURES: dict[str, str] = {
    "columnMapping": "column mapping",
    "checkConstraints": "CHECK constraints",
    "generatedColumns": "generated columns",
    "identityColumns": "identity columns",
}
"""Table features whose rules a writer of raw data files would have to apply itself; a table
with one in use is refused."""


class DeltaTableError(SinkSystemError, ValueError):
    """The table cannot take the stream: it is missing, differs from it, or uses a feature this
    sink does not write; the message names the table, the difference and the fix. Holds the
    fixes the command line gives for the table's storage (deltalake's errors carry no code, so
    only ``ConnectionError`` and ``TimeoutError`` say it did not answer)."""

    system = "Delta Lake"
    fixes = MappingProxyType(
        {
            SinkFailure.UNREACHABLE: (
                "Fix: make the table's path reachable with the options the query used, as "
                "--sink-option KEY=VALUE or --sink-option-file PATH."
            ),
            SinkFailure.CREDENTIALS: (
                "Fix: give the storage credentials the query used, in the environment or a "
                "--sink-option-file only you can read, with the S3 actions docs/security.md "
                "lists; for a certificate that did not verify, SSL_CERT_FILE and fs.ca_bundle "
                "naming the endpoint's CA."
            ),
        }
    )

    @classmethod
    def classify(cls, exc: BaseException) -> SinkFailure | None:
        """delta-rs's refusals by their words (its errors carry no code: object_store's
        ``lacked the necessary privileges``, or S3's own ``AccessDenied`` in a generic error,
        for a 403; ``invalid peer certificate``), then the
        data files' s3fs errors as ``twophase.files`` reads them."""
        text = str(exc)
        refused = ("lacked the necessary privileges", "<Code>AccessDenied</Code>", "403 Forbidden")
        if any(words in text for words in refused) or isUntrusted(exc):
            return SinkFailure.CREDENTIALS
        return FilesSinkError.classify(exc)


def deltalake() -> Any:
    """The ``deltalake`` module, or an error that says how to install it."""
    try:
        import deltalake as module
    except ImportError as exc:
        raise ImportError(
            "twophase.delta needs the deltalake package: pip install 'twophase[delta]'"
        ) from exc
    return module


def appId(sinkId: str) -> str:
    return f"{APP_ID_PREFIX}{sinkId}"


def openTable(path: str, storage: Mapping[str, str] | None = None) -> DeltaTable | None:
    """The table at ``path``, or ``None`` when there is none."""
    module = deltalake()
    try:
        return module.DeltaTable(path, storage_options=dict(storage) if storage else None)
    except module.exceptions.TableNotFoundError:
        return None


def deltaFields(schema: Any) -> list[dict[str, Any]]:
    """The fields of a Delta schema as JSON (name, type, nullable, metadata)."""
    return list(json.loads(schema.to_json())["fields"])


def deltaColumns(fields: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Those fields as columns (name, type, nullable), metadata left out."""
    return [{key: field[key] for key in ("name", "type", "nullable")} for field in fields]


def deltaSchemaOf(schema: pa.Schema) -> Any:
    """The Delta schema of the stream's Arrow schema; a type Delta has no name for raises
    ``DeltaTableError`` naming the column."""
    module = deltalake()
    fields = []
    for field in schema:
        type_ = utcTimestamps(field.type)
        try:
            module.Schema.from_arrow(pa.schema([field.with_type(type_)]))
        except Exception as exc:  # delta-rs raises a bare Exception for an unknown type
            raise DeltaTableError(
                f"column {field.name!r} has type {field.type}, which a Delta table cannot "
                f"hold ({str(exc).splitlines()[0]}); cast it to a type Delta has"
            ) from None
        fields.append(field.with_type(type_))
    return module.Schema.from_arrow(pa.schema(fields))


def _describe(columns: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(
        f"{c['name']} {json.dumps(c['type']) if not isinstance(c['type'], str) else c['type']}"
        f"{'' if c['nullable'] else ' not null'}"
        for c in columns
    )


def checkTable(
    table: DeltaTable, path: str, stream: Any, partitionBy: Sequence[str] | None
) -> None:
    """Refuse a table the stream cannot be appended to as raw data files: other columns or
    types, other partition columns, or a feature whose rules only a full writer applies."""
    metadata = table.metadata()
    for key, what in _REFUSED_CONFIGURATION.items():
        mode = metadata.configuration.get(key)
        if mode not in (None, "none"):
            raise DeltaTableError(
                f"the Delta table at {path} uses {what} ({key}={mode}); twophase.delta writes "
                "tables without it: write to another table"
            )
    protocol = table.protocol()
    for feature in protocol.writer_features or ():
        refused = _REFUSED_FEATURES.get(feature)
        if refused is not None:
            raise DeltaTableError(
                f"the Delta table at {path} uses {refused} (writer feature {feature}); "
                "twophase.delta appends data files without applying them: write to a table "
                "without that feature"
            )
    if any(key.startswith("delta.constraints.") for key in metadata.configuration):
        raise DeltaTableError(
            f"the Delta table at {path} has CHECK constraints, which twophase.delta does not "
            "apply to the rows it appends: drop them or write to another table"
        )
    tableFields = deltaFields(table.schema())
    for field in tableFields:
        computed = {
            "delta.generationExpression",
            "delta.identity.start",
            "delta.invariants",
        } & set(field["metadata"])
        if computed:
            raise DeltaTableError(
                f"the Delta table at {path} has a generated, identity or invariant column "
                f"{field['name']!r}, which twophase.delta does not compute or check: write to "
                "another table"
            )
    mine, theirs = deltaColumns(deltaFields(stream)), deltaColumns(tableFields)
    if [{**c, "nullable": True} for c in mine] != [{**c, "nullable": True} for c in theirs]:
        raise DeltaTableError(
            f"the stream's columns do not match the Delta table at {path}: the stream has "
            f"({_describe(mine)}), the table has ({_describe(theirs)}); select and cast the "
            "stream's columns to the table's, in its order, or write to a new path"
        )
    notNull = [
        t["name"] for c, t in zip(mine, theirs, strict=True) if c["nullable"] and not t["nullable"]
    ]
    if notNull:
        raise DeltaTableError(
            f"the Delta table at {path} has NOT NULL columns {', '.join(notNull)} that the "
            "stream may hold nulls in, and twophase.delta does not check rows against them: "
            "filter the nulls and make the columns non-nullable in the stream "
            "(e.g. coalesce), or allow nulls in the table"
        )
    tablePartitions = list(metadata.partition_columns)
    if partitionBy is not None and list(partitionBy) != tablePartitions:
        raise DeltaTableError(
            f"option partitionBy={','.join(partitionBy)!r} differs from the Delta table at "
            f"{path}, partitioned by {','.join(tablePartitions) or 'nothing'}: set partitionBy "
            "to the table's columns or leave it out"
        )


def createTable(
    path: str, stream: Any, partitionBy: Sequence[str], storage: Mapping[str, str] | None = None
) -> DeltaTable:
    """Create the table from the stream's schema; another creator winning the race is fine
    when its table matches (``checkTable`` follows)."""
    module = deltalake()
    table: DeltaTable = module.DeltaTable.create(
        path,
        stream,
        mode="ignore",
        partition_by=list(partitionBy) or None,
        storage_options=dict(storage) if storage else None,
    )
    return table


def ensureTable(
    path: str,
    schema: pa.Schema,
    partitionBy: Sequence[str] | None,
    create: bool,
    storage: Mapping[str, str] | None = None,
) -> None:
    """Driver, before any task writes: the table exists (created from the stream's schema when
    ``create``) and can take the stream. ``partitionBy`` ``None``: the table's own.

    Once per process for the same table and stream (the binding asks before every batch); a
    table changed later is found by the batch's commit, which reads the table again.
    """
    key = (path, schema, tuple(partitionBy) if partitionBy is not None else None)
    # tables this process has found (or made) able to take the stream
    ensured: set[tuple[str, pa.Schema, tuple[str, ...] | None]] = Resources.ofProcess().get(
        "delta.ensured", set
    )
    if key in ensured:
        return
    stream = deltaSchemaOf(schema)
    table = openTable(path, storage)
    if table is None:
        if not create:
            raise DeltaTableError(
                f"there is no Delta table at {path}: create it, or set option createTable "
                "to true to create it from the stream's schema"
            )
        table = createTable(path, stream, partitionBy or (), storage)
    checkTable(table, path, stream, partitionBy)
    ensured.add(key)


def validateTarget(settings: DeltaSettings, schema: pa.Schema, sinkId: str) -> None:
    """Driver, before each batch: the options can write the stream, and the table exists (or
    is created) and takes it."""
    checkWritable(schema, settings.files)
    checkDeltaTrust(settings)
    ensureTable(
        settings.tableUri,
        schema,
        settings.partitionBy if settings.partitionGiven else None,
        settings.createTable,
        settings.storage,
    )


def checkDeltaTrust(settings: DeltaSettings) -> None:
    """Before anything is written: an ``https://`` endpoint's certificate verifies for s3fs
    (the data files, under ``fs.ca_bundle``) and for delta-rs (the log). delta-rs takes no CA
    option: it trusts the system's store, or the bundle the environment's ``SSL_CERT_FILE``
    names, which Python's default trust store reads too."""
    checkPathTrust(settings.path, settings.files.storageOptions)
    endpoint = settings.storage.get("AWS_ENDPOINT_URL", "")
    if settings.tableUri.startswith("s3://") and endpoint.lower().startswith("https://"):
        verifyHandshake(
            endpoint,
            None,
            who="delta-rs, which takes no CA option: set SSL_CERT_FILE to a PEM bundle with "
            "the endpoint's CA (fs.ca_bundle's file) in the environment of the driver's "
            "processes before Spark starts",
        )


@dataclass(frozen=True)
class DataFile:
    """One data file of a batch for the log: its path relative to the table as the filesystem
    names it (delta-rs writes it to the log URI-encoded)."""

    path: str
    size: int
    partitionValues: dict[str, str | None]
    modificationTime: int
    rows: int


def committedVersion(table: DeltaTable, sinkId: str) -> int | None:
    """The last batch id this sink committed to the table (its ``txn`` version)."""
    version = table.transaction_version(appId(sinkId))
    return None if version is None else int(version)


def commitFiles(table: DeltaTable, sinkId: str, batchId: int, files: Sequence[DataFile]) -> None:
    """One log commit that appends ``files`` and records batch ``batchId`` for this sink."""
    module = deltalake()
    transaction = module.transaction
    adds = [
        transaction.AddAction(
            f.path,
            f.size,
            f.partitionValues,
            f.modificationTime,
            True,
            json.dumps({"numRecords": f.rows}),
        )
        for f in files
    ]
    properties = transaction.CommitProperties(
        app_transactions=[transaction.Transaction(appId(sinkId), batchId)],
        custom_metadata={"twophase.sinkId": sinkId, "twophase.batchId": str(batchId)},
    )
    table.create_write_transaction(
        adds,
        "append",
        table.schema(),
        partition_by=list(table.metadata().partition_columns) or None,
        commit_properties=properties,
    )


__all__ = [
    "APP_ID_PREFIX",
    "DataFile",
    "DeltaTableError",
    "appId",
    "checkTable",
    "commitFiles",
    "committedVersion",
    "createTable",
    "deltaColumns",
    "deltaFields",
    "deltaSchemaOf",
    "deltalake",
    "ensureTable",
    "openTable",
]
