"""The Iceberg sink: Parquet files staged by the tasks, one snapshot per batch.

Tasks write the batch's rows as the files sink does, staged under the table's location
(:class:`twophase.sinks.files.FilesWriter`, partition columns kept in the files); once the
batch is decided, the driver moves them into the table's ``data`` directory, where no reader
sees a file no manifest names, and appends them all in one catalog commit that also records the
batch in the table's properties, so the table itself tells a replay what it holds
(:class:`IcebergCommitter`). Plain Python through pyiceberg (an extra);
``twophase.spark.iceberg`` binds it as ``twophase.iceberg``.

Modules by role: ``settings`` (options), ``table`` (every pyiceberg call) and ``committer``.
"""

from twophase.sinks.iceberg.committer import IcebergCommitter
from twophase.sinks.iceberg.settings import LOCATION_OPTION, SAFE_OPTIONS, IcebergSettings
from twophase.sinks.iceberg.table import IcebergTableError, catalogOf, ensureTable, loadCatalog

__all__ = [
    "LOCATION_OPTION",
    "SAFE_OPTIONS",
    "IcebergCommitter",
    "IcebergSettings",
    "IcebergTableError",
    "catalogOf",
    "ensureTable",
    "loadCatalog",
]
