"""The Iceberg sink's options: parsed and checked once into a frozen ``IcebergSettings``.

The data files are the files sink's Parquet files, so their options are its options under the
same names; where they go is the table's location, which only the catalog knows: the driver
resolves it before the tasks run (``LOCATION_OPTION``). ``SAFE_OPTIONS`` says which options
may be written to the checkpoint's ``sink.json``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import fsspec

from twophase.options import SinkOption, keptOptions
from twophase.redaction import redact
from twophase.settings import intOption
from twophase.sinks.files.settings import (
    KEPT_STORAGE_OPTIONS,
    STORAGE_PREFIX,
    TABLE_FILE_OPTIONS,
    FilesSettings,
)

CATALOG_PREFIX = "catalog."
"""Options ``catalog.<property>`` go to pyiceberg's ``load_catalog`` as ``<property>``."""

LOCATION_OPTION = "twophase.iceberg.location"
"""The table's location as the driver found it in the catalog, for the tasks (set by the
Spark binding before a task runs; never written to the checkpoint)."""

_KEPT_CATALOG = (
    "catalog.type",
    "catalog.uri",
    "catalog.warehouse",
    "catalog.s3.endpoint",
    "catalog.s3.region",
    "catalog.s3.path-style-access",
)

OPTIONS = (
    SinkOption(("table",), "string", "required", "`namespace.name` in the catalog"),
    SinkOption(
        ("catalog.*",),
        "prefix",
        "",
        "pyiceberg catalog properties: `catalog.type` (`sql`, `rest`, `glue`...), "
        "`catalog.uri` (`sqlite:///...`, `postgresql+psycopg://...`), `catalog.warehouse` "
        "(`file:///...`, `s3://...`), `catalog.s3.endpoint`...; the checkpoint keeps "
        f"{', '.join(f'`{n}`' for n in _KEPT_CATALOG)} (`catalog.uri` without its password)",
        kept=_KEPT_CATALOG,
    ),
    SinkOption(
        ("catalogName",),
        "string",
        "`default`",
        "the name pyiceberg reads other properties under (`.pyiceberg.yaml`, "
        "`PYICEBERG_CATALOG__<NAME>__*`)",
    ),
    SinkOption(
        ("partitionBy",),
        "columns",
        "the table's",
        "comma-separated columns: identity partitions of a new table; for an existing table, "
        "leave it out or give its own",
    ),
    SinkOption(
        ("createTable",),
        "boolean",
        "`true`",
        "create a missing table (and namespace) from the stream's schema; `false` refuses to "
        "start without one",
    ),
    *TABLE_FILE_OPTIONS,
    SinkOption(
        ("retainSnapshots",),
        "integer",
        "`0` (keep all)",
        "`N`: once the table holds `2N` snapshots, expire all but the newest `N` after a "
        "batch's commit (best effort: a failure is logged and tried again after the next "
        "batch); the data files stay, every row stays",
    ),
    SinkOption(
        ("connectTimeout", "socketTimeout"),
        "seconds",
        "`10`, `120`",
        "seconds a SQL catalog on PostgreSQL may take to connect, and to answer one statement "
        "(`0`: no bound)",
    ),
    SinkOption(
        ("stagingPath",),
        "path",
        "under the table",
        "where tasks stage files until the commit, on the same filesystem, outside `data/`",
    ),
    SinkOption(
        ("fs.*",),
        "prefix",
        "",
        "for a warehouse on S3, s3fs's options for the data files (`fs.endpoint_url`, "
        "`fs.key`, `fs.secret`, `fs.token`), given to pyiceberg's FileIO too under its names "
        "(`s3.endpoint`, `s3.access-key-id`...) unless `catalog.s3.*` sets them; kept as in "
        "`twophase.files`",
        kept=KEPT_STORAGE_OPTIONS,
    ),
)
"""The Iceberg sink's options, declared once (docs/iceberg.md's table comes from it)."""

SAFE_OPTIONS = keptOptions(OPTIONS)
"""Options (lower-case) the committer rebuilds itself from: the catalog's address (``uri``
without its password), the table and the file options; no key, secret, token or credential
(``twophase recover`` takes those from the environment: ``PGPASSWORD``, ``AWS_*``)."""

_FILES_OPTIONS = ("compression", "maxrecordsperfile", "maxopenfiles", "partsize")
_PROTOCOLS = (None, "file", "local", "s3", "s3a")
_TABLE_NAME = re.compile(r"^[^.\s]+(\.[^.\s]+)+$")
_FROM_FS = {
    "endpoint_url": "s3.endpoint",
    "key": "s3.access-key-id",
    "secret": "s3.secret-access-key",
    "token": "s3.session-token",
}
"""s3fs's options (``fs.*``, as ``twophase.files`` takes them) and pyiceberg's FileIO names."""


@dataclass(frozen=True)
class IcebergSettings:
    """The Iceberg sink's options (names case-insensitive, values strings as Spark passes them):

    - ``table`` (required): ``namespace.name`` in the catalog.
    - ``catalogName``: the catalog's name for pyiceberg (``default``), which also reads its
      configuration (``.pyiceberg.yaml``, ``PYICEBERG_CATALOG__<NAME>__*``).
    - ``catalog.<property>``: pyiceberg catalog properties (``catalog.type=sql``,
      ``catalog.uri=sqlite:///...`` or ``postgresql+psycopg://...``,
      ``catalog.warehouse=file:///...`` or ``s3://...``, ``catalog.s3.endpoint``...).
    - ``partitionBy``: comma-separated columns, identity partitions of a new table; an existing
      table's own must be the same (or the option left out).
    - ``createTable``: ``true`` (default) creates a missing table (and namespace) from the
      stream's schema; ``false`` refuses to start without one.
    - ``compression``, ``maxRecordsPerFile``, ``maxOpenFiles``, ``partSize``: the data files',
      as in ``twophase.files``; ``stagingPath`` where tasks stage them (default: beside the
      table's ``data`` directory, under its location).
    - ``retainSnapshots``: ``0`` (default) leaves snapshots alone; ``N`` expires all but the
      newest ``N`` once the table holds ``2 N`` (its commit time grows with their number).
    - ``fs.<name>``: s3fs's options for data files on S3, also given to the catalog's FileIO
      under its names (``fs.endpoint_url`` is ``s3.endpoint``...) unless ``catalog.*`` sets
      them.
    - ``connectTimeout`` (default 10), ``socketTimeout`` (default 120, 0: none): seconds to
      wait for a connection to a SQL catalog on PostgreSQL (``catalog.uri``), and for its answer
      to one statement; a partitioned or frozen catalog server fails the call then, retryably.
    """

    table: str
    catalogName: str = "default"
    catalog: dict[str, str] = field(default_factory=dict, hash=False, repr=False)
    """pyiceberg's catalog properties; may hold credentials, so never written anywhere."""
    createTable: bool = True
    partitionBy: tuple[str, ...] = ()
    partitionGiven: bool = False
    """Whether ``partitionBy`` was set (an existing table's partitioning is checked against it)."""
    fileOptions: dict[str, str] = field(default_factory=dict, hash=False, repr=False)
    """The files sink's options for the data files, without ``path`` (may hold ``fs.*``
    credentials, so never written anywhere)."""
    location: str = ""
    """The table's location when the driver has resolved it (``LOCATION_OPTION``)."""
    retainSnapshots: int = 0
    connectTimeout: int = 10
    socketTimeout: int = 120

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> IcebergSettings:
        """Parse Spark-style string options; ``ValueError`` names the bad option and the fix."""
        lowered = {key.lower(): str(value) for key, value in options.items()}
        table = lowered.get("table", "").strip()
        if not table:
            raise ValueError(
                "option table is required: set .option('table', '<namespace>.<name>'), the "
                "Iceberg table in the catalog"
            )
        if not _TABLE_NAME.match(table):
            raise ValueError(
                f"option table={table!r} must be <namespace>.<name> (e.g. 'analytics.events')"
            )
        createText = lowered.get("createtable", "true").strip().lower()
        if createText not in ("true", "false"):
            raise ValueError(f"option createTable={createText!r} must be true or false")
        catalog: dict[str, str] = {}
        fileOptions = {key: lowered[key] for key in _FILES_OPTIONS if key in lowered}
        for key, value in options.items():
            if key.lower().startswith(STORAGE_PREFIX) and len(key) > len(STORAGE_PREFIX):
                fileOptions[key] = str(value)
                name = _FROM_FS.get(key[len(STORAGE_PREFIX) :].lower())
                if name is not None:
                    catalog[name] = str(value)
        for key, value in options.items():
            if key.lower().startswith(CATALOG_PREFIX) and len(key) > len(CATALOG_PREFIX):
                catalog[key[len(CATALOG_PREFIX) :].lower()] = str(value)
        if lowered.get("stagingpath", "").strip():
            fileOptions["stagingpath"] = lowered["stagingpath"].strip()
        retainText = lowered.get("retainsnapshots", "0").strip() or "0"
        if not retainText.isdigit():
            raise ValueError(
                f"option retainSnapshots={retainText!r} must be a number of snapshots (0: keep "
                "them all)"
            )
        partitionText = lowered.get("partitionby", "").strip()
        partitionBy = tuple(c.strip() for c in partitionText.split(",")) if partitionText else ()
        settings = cls(
            table=table,
            catalogName=lowered.get("catalogname", "").strip() or "default",
            catalog=catalog,
            createTable=createText == "true",
            partitionBy=partitionBy,
            partitionGiven=bool(partitionText),
            fileOptions=fileOptions,
            location=lowered.get(LOCATION_OPTION, "").strip(),
            retainSnapshots=int(retainText),
            connectTimeout=intOption(options, "connectTimeout", 10, minimum=1),
            socketTimeout=intOption(options, "socketTimeout", 120, minimum=0),
        )
        settings.filesAt(settings.location or "file:///checked")  # option errors now
        return settings

    def withLocation(self, location: str) -> IcebergSettings:
        return dataclasses.replace(self, location=location)

    def filesAt(self, location: str) -> FilesSettings:
        """The files sink's settings for a table at ``location``: Parquet under ``data/``,
        the partition columns kept in the files (Iceberg readers read them there)."""
        protocol = fsspec.core.split_protocol(location)[0]
        if protocol not in _PROTOCOLS:
            raise ValueError(
                redact(
                    f"the Iceberg table {self.table} is at {location}: twophase.iceberg writes "
                    f"tables on a local or mounted filesystem or on S3; {protocol}:// is not "
                    "supported: give the catalog a warehouse on one of those"
                )
            )
        files = FilesSettings.fromOptions(
            {
                **self.fileOptions,
                "path": location.rstrip("/") + "/data",
                "format": "parquet",
                "partitionby": ",".join(self.partitionBy),
            }
        )
        return dataclasses.replace(files, tableFiles=True)

    @property
    def files(self) -> FilesSettings:
        """The data files' settings at the resolved location (tasks, and the committer once it
        has found the table)."""
        if not self.location:
            raise RuntimeError(
                f"twophase.iceberg: the location of table {self.table} was not resolved on the "
                "driver before the task ran (the sink's validate sets it)"
            )
        return self.filesAt(self.location)


__all__ = ["CATALOG_PREFIX", "LOCATION_OPTION", "SAFE_OPTIONS", "IcebergSettings"]
