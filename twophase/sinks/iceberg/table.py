"""The Iceberg table itself, through pyiceberg: its catalog, created, checked, appended to.

Every call into the ``pyiceberg`` package lives here. A batch becomes visible in one snapshot
that appends its data files; the same catalog commit sets the table property
``twophase.batch.<sinkId>`` to the batch id, so the table itself says which batches it holds
(snapshot expiry keeps properties) and a replayed commit finds its batch there and does
nothing. The snapshot's summary carries the sink and the batch too, for people and tools.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from sqlalchemy.engine import make_url

from twophase.clients.postgres_answers import boundAnswers
from twophase.protocol.errors import SinkFailure, SinkSystemError
from twophase.resources import Resources
from twophase.sinks.files.formats import utcTimestamps
from twophase.sinks.files.trust import verifyHandshake

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from twophase.sinks.iceberg.settings import IcebergSettings

BATCH_PROPERTY_PREFIX = "twophase.batch."
"""Table property ``twophase.batch.<sinkId>``: the last batch this sink appended."""

_NO_LIBRARY_RETRY = {"commit.retry.num-retries": "0"}
"""pyiceberg retries a conflicting commit by appending again on top of the new snapshot; the
sink retries itself instead, reading the batch property first, so that a batch another process
committed meanwhile is never appended twice."""

_ICEBERG_DEFAULTS = {"commit.manifest-merge.enabled": "true"}
"""Iceberg's defaults where pyiceberg has other ones, for a table that sets none: appends merge
small manifests (else every snapshot's manifest list names one manifest per batch ever)."""

CREATED_TABLE_PROPERTIES = {"write.metadata.delete-after-commit.enabled": "true"}
"""Set on a table the sink creates: each commit writes a metadata file holding every snapshot,
so older metadata files beyond ``write.metadata.previous-versions-max`` are deleted."""


class IcebergTableError(SinkSystemError, ValueError):
    """The table cannot take the stream: it is missing, differs from it, or is partitioned in a
    way this sink does not write; the message names the table, the difference and the fix.
    Holds the fixes the command line gives for the catalog; ``classify`` reads a REST catalog's
    refusals and an SQL catalog's database errors by type and code."""

    system = "Iceberg"
    fixes = MappingProxyType(
        {
            SinkFailure.UNREACHABLE: (
                "Fix: make the catalog reachable with the options the query used (catalog.uri, "
                "catalog.*), as --sink-option KEY=VALUE or --sink-option-file PATH."
            ),
            SinkFailure.CREDENTIALS: (
                "Fix: give the catalog's credentials the query used in a --sink-option-file "
                "only you can read."
            ),
        }
    )

    @classmethod
    def classify(cls, exc: BaseException) -> SinkFailure | None:
        """pyiceberg's refusals of the credentials (401, 403, an expired token); an SQL
        catalog's database that refused the login (SQLSTATE 28P01/28000, MySQL 1044/1045) or
        did not answer (SQLAlchemy's ``OperationalError``, ``InterfaceError``)."""
        kind = type(exc)
        if kind.__module__.startswith("pyiceberg"):
            names = {t.__name__ for t in kind.__mro__}
            refused = {"UnauthorizedError", "ForbiddenError", "AuthorizationExpiredError"}
            return SinkFailure.CREDENTIALS if names & refused else None
        if not kind.__module__.startswith("sqlalchemy"):
            return None
        import sqlalchemy.exc

        if not isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
            return None
        orig: Any = getattr(exc, "orig", None)
        code = orig.args[0] if orig is not None and orig.args else None
        if getattr(orig, "sqlstate", None) in ("28P01", "28000") or code in (1044, 1045):
            return SinkFailure.CREDENTIALS
        return SinkFailure.UNREACHABLE


def pyiceberg() -> Any:
    """The ``pyiceberg`` package, or an error that says how to install it."""
    try:
        import pyiceberg as module
        import pyiceberg.catalog
        import pyiceberg.exceptions
        import pyiceberg.io.pyarrow
        import pyiceberg.table  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "twophase.iceberg needs pyiceberg with pyarrow and SQLAlchemy: "
            "pip install 'twophase[iceberg]'"
        ) from exc
    return module


def batchProperty(sinkId: str) -> str:
    return f"{BATCH_PROPERTY_PREFIX}{sinkId}"


def loadCatalog(
    name: str,
    properties: Mapping[str, str],
    *,
    connectTimeout: int = 10,
    socketTimeout: int = 120,
) -> Catalog:
    """The catalog from ``catalog.*`` options (pyiceberg's ``load_catalog`` properties), one
    per process for the same name and properties: the driver asks before every batch, and a
    SQL catalog keeps its connection pool.

    A SQL catalog on PostgreSQL gets bounded waits, which libpq has none of: ``connect_timeout``
    and ``tcp_user_timeout`` in its URI (unless the URI sets them) and every statement cut after
    ``socketTimeout`` seconds without an answer (a frozen server's kernel still acknowledges
    TCP, so nothing else ends the wait)."""
    key = (name, tuple(sorted(properties.items())), connectTimeout, socketTimeout)

    def open() -> Catalog:
        module = pyiceberg()
        given = dict(properties)
        uri = given.get("uri", "")
        onPostgres = _isPostgres(uri)
        if onPostgres:
            given["uri"] = _boundedUri(uri, connectTimeout)
        catalog = module.catalog.load_catalog(name, **given)
        engine = getattr(catalog, "engine", None)
        if onPostgres and engine is not None:
            boundAnswers(
                engine,
                socketTimeout,
                pingOnCheckout=True,
                what="a statement of the Iceberg catalog",
            )
        return catalog

    return Resources.ofProcess().get(("iceberg.catalog", key), open, _closeCatalog)


def _closeCatalog(catalog: Catalog) -> None:
    """Close a SQL catalog's connections (other catalogs hold none of ours)."""
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()


def catalogOf(settings: IcebergSettings) -> Catalog:
    """The catalog the sink's options name, with their ``connectTimeout`` and ``socketTimeout``;
    first, an ``https://`` S3 endpoint's certificate checked as pyiceberg's FileIO will see it
    (:func:`checkFileIoTrust`)."""
    checkFileIoTrust(settings.catalog)
    return loadCatalog(
        settings.catalogName,
        settings.catalog,
        connectTimeout=settings.connectTimeout,
        socketTimeout=settings.socketTimeout,
    )


def checkFileIoTrust(properties: Mapping[str, str]) -> None:
    """Before the catalog is opened (and anything written): pyiceberg's FileIO, pyarrow's S3
    client, takes no CA option from twophase; it trusts the system's store or the PEM bundle
    ``SSL_CERT_FILE`` names, as Python's default TLS context does. An ``https://``
    ``s3.endpoint`` whose certificate that store does not verify is one ``FilesTrustError``
    naming the endpoint and the fix."""
    endpoint = properties.get("s3.endpoint", "")
    if endpoint.lower().startswith("https://"):
        verifyHandshake(
            endpoint,
            None,
            who="pyiceberg's FileIO, which takes no CA option: set SSL_CERT_FILE to a PEM "
            "bundle with the endpoint's CA (fs.ca_bundle's file) in the environment of the "
            "driver's processes before Spark starts",
        )


def _isPostgres(uri: str) -> bool:
    return uri.split(":", 1)[0].split("+", 1)[0].lower() in ("postgresql", "postgres")


def _boundedUri(uri: str, connectTimeout: int) -> str:
    """``uri`` with libpq's connection bounds added where it sets none: a connection attempt
    ends after ``connectTimeout`` seconds, and so does unacknowledged data (a partition)."""
    url = make_url(uri)
    bounds = {
        "connect_timeout": str(connectTimeout),
        "tcp_user_timeout": str(connectTimeout * 1000),
        "keepalives": "1",
    }
    added = {k: v for k, v in bounds.items() if k not in url.query}
    return url.update_query_dict(added).render_as_string(hide_password=False)


def openTable(catalog: Catalog, identifier: str) -> Table | None:
    """The table named ``identifier`` (``namespace.name``), or ``None`` when there is none."""
    module = pyiceberg()
    try:
        return catalog.load_table(identifier)
    except (module.exceptions.NoSuchTableError, module.exceptions.NoSuchNamespaceError):
        return None


def _utcTimestamps(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_type(utcTimestamps(f.type)) for f in schema])


def icebergSchemaOf(schema: pa.Schema) -> Any:
    """The Iceberg schema of the stream (fresh field ids); a type Iceberg has no name for
    raises ``IcebergTableError`` naming the column."""
    module = pyiceberg()
    convert = module.io.pyarrow
    fixed = _utcTimestamps(schema)
    for field in fixed:
        try:
            convert.visit_pyarrow(pa.schema([field]), convert._ConvertToIcebergWithoutIDs())
        except Exception as exc:  # pyiceberg's errors for an unknown type have no common base
            raise IcebergTableError(
                f"column {field.name!r} has type {field.type}, which an Iceberg table cannot "
                f"hold ({str(exc).splitlines()[0]}); cast it to a type Iceberg has"
            ) from None
    return module.catalog.Catalog._convert_schema_if_needed(fixed)


def _describe(schema: Any) -> str:
    return ", ".join(
        f"{f.name} {f.field_type}{' not null' if f.required else ''}" for f in schema.fields
    )


def checkTable(table: Table, name: str, stream: Any, partitionBy: Sequence[str] | None) -> None:
    """Refuse a table the stream cannot be appended to as its data files: other columns or
    types, required columns the stream may leave null, or a partitioning other than identity
    partitions on ``partitionBy`` (or on the table's own, when it is ``None``)."""
    schema = table.schema()
    mine = [(f.name, str(f.field_type)) for f in stream.fields]
    theirs = [(f.name, str(f.field_type)) for f in schema.fields]
    if mine != theirs:
        raise IcebergTableError(
            f"the stream's columns do not match the Iceberg table {name}: the stream has "
            f"({_describe(stream)}), the table has ({_describe(schema)}); select and cast the "
            "stream's columns to the table's, in its order, or write to a new table"
        )
    required = [
        t.name
        for s, t in zip(stream.fields, schema.fields, strict=True)
        if t.required and not s.required
    ]
    if required:
        raise IcebergTableError(
            f"the Iceberg table {name} has required columns {', '.join(required)} that the "
            "stream may hold nulls in, and twophase.iceberg does not check rows against them: "
            "make the columns non-nullable in the stream (e.g. coalesce), or make them "
            "optional in the table"
        )
    columns = tablePartitionColumns(table, name)
    if partitionBy is not None and list(partitionBy) != columns:
        raise IcebergTableError(
            f"option partitionBy={','.join(partitionBy)!r} differs from the Iceberg table "
            f"{name}, partitioned by {','.join(columns) or 'nothing'}: set partitionBy to the "
            "table's columns or leave it out"
        )


def tablePartitionColumns(table: Table, name: str) -> list[str]:
    """The source columns of the table's identity partitions; another transform (days,
    bucket, truncate...) raises ``IcebergTableError``: its values are not directory names."""
    module = pyiceberg()
    identity = module.transforms.IdentityTransform
    schema = table.schema()
    columns = []
    for field in table.spec().fields:
        column = schema.find_column_name(field.source_id)
        if not isinstance(field.transform, identity):
            raise IcebergTableError(
                f"the Iceberg table {name} is partitioned by {field.transform}({column}); "
                "twophase.iceberg writes identity partitions only (partitionBy columns): "
                "write to a table partitioned by columns, or unpartitioned"
            )
        columns.append(str(column))
    return columns


def ensureTable(
    catalog: Catalog,
    name: str,
    schema: pa.Schema,
    partitionBy: Sequence[str] | None,
    create: bool,
) -> Table:
    """Driver, before any task writes: the table exists (created from the stream's schema,
    with its namespace, when ``create``) and can take the stream. ``partitionBy`` ``None``:
    the table's own."""
    module = pyiceberg()
    stream = icebergSchemaOf(schema)
    table = openTable(catalog, name)
    if table is None:
        if not create:
            raise IcebergTableError(
                f"there is no Iceberg table {name} in the catalog: create it, or set option "
                "createTable to true to create it from the stream's schema"
            )
        namespace = name.rsplit(".", 1)[0]
        catalog.create_namespace_if_not_exists(namespace)
        try:
            with catalog.create_table_transaction(name, schema=stream) as create_:
                if partitionBy:
                    with create_.update_spec() as spec:
                        for column in partitionBy:
                            spec.add_identity(column)
                create_.set_properties(
                    {
                        module.table.TableProperties.DEFAULT_NAME_MAPPING: (
                            create_.table_metadata.schema().name_mapping.model_dump_json()
                        ),
                        **CREATED_TABLE_PROPERTIES,
                    }
                )
        except module.exceptions.TableAlreadyExistsError:
            pass  # another creator won: checked below like any existing table
        table = catalog.load_table(name)
    checkTable(table, name, streamAgainst(table, schema, name), partitionBy)
    return table


def streamAgainst(table: Table, schema: pa.Schema, name: str) -> Any:
    """The stream's Iceberg schema with the table's field ids, matched by column name."""
    module = pyiceberg()
    try:
        return module.io.pyarrow.pyarrow_to_schema(
            _utcTimestamps(schema), name_mapping=table.schema().name_mapping
        )
    except ValueError:
        stream = icebergSchemaOf(schema)
        raise IcebergTableError(
            f"the stream's columns do not match the Iceberg table {name}: the stream has "
            f"({_describe(stream)}), the table has ({_describe(table.schema())}); select and "
            "cast the stream's columns to the table's, in its order, or write to a new table"
        ) from None


def committedBatch(table: Table, sinkId: str) -> int | None:
    """The last batch id this sink appended to the table (its batch property)."""
    value = table.properties.get(batchProperty(sinkId))
    return None if value is None else int(value)


def _forTheSink(table: Table) -> Table:
    """``table`` as the sink's commit sees it: pyiceberg's commit retry off, Iceberg's defaults
    where the table sets nothing (not written to the table: a commit sends only its own
    updates)."""
    module = pyiceberg()
    properties = {**_ICEBERG_DEFAULTS, **table.metadata.properties, **_NO_LIBRARY_RETRY}
    metadata = table.metadata.model_copy(update={"properties": properties})
    copy: Table = module.table.Table(
        table._identifier, metadata, table.metadata_location, table.io, table.catalog
    )
    return copy


def appendFiles(table: Table, sinkId: str, batchId: int, paths: Sequence[str]) -> Table:
    """One catalog commit: a snapshot appending the Parquet files at ``paths`` (absolute, as
    the table's FileIO names them) and the sink's batch property set to ``batchId``.

    A concurrent commit makes it fail (``CommitFailedException``) rather than append on top
    of it: the caller reads the table again and decides. Returns the table after the commit.
    """
    transaction = _forTheSink(table).transaction()
    transaction.set_properties({batchProperty(sinkId): str(batchId)})
    transaction.add_files(
        list(paths),
        snapshot_properties={"twophase.sinkId": sinkId, "twophase.batchId": str(batchId)},
        check_duplicate_files=False,
    )
    committed: Table = transaction.commit_transaction()
    return committed


def expireSnapshots(table: Table, keep: int) -> int:
    """Expire every snapshot but the newest ``keep`` (and those a branch or tag names); the
    data files stay (the current snapshot still names what it holds). The count expired."""
    snapshots = sorted(table.snapshots(), key=lambda s: (s.timestamp_ms, s.sequence_number))
    named = {ref.snapshot_id for ref in table.metadata.refs.values()}
    old = [s.snapshot_id for s in snapshots[: max(0, len(snapshots) - keep)]]
    old = [snapshotId for snapshotId in old if snapshotId not in named]
    if old:
        table.maintenance.expire_snapshots().by_ids(old).commit()
    return len(old)


__all__ = [
    "BATCH_PROPERTY_PREFIX",
    "IcebergTableError",
    "appendFiles",
    "batchProperty",
    "checkTable",
    "committedBatch",
    "ensureTable",
    "expireSnapshots",
    "icebergSchemaOf",
    "loadCatalog",
    "openTable",
    "pyiceberg",
    "streamAgainst",
    "tablePartitionColumns",
]
