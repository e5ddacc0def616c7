"""The files sink: Parquet, JSON lines or CSV files made visible by rename, or on S3 by
completing a multipart upload.

Each task attempt streams its rows into part files under a staging path outside the output
path, beside it by default (:class:`FilesWriter`); the driver renames them to their final
names once the batch is decided (:class:`FilesCommitter`), so no reader of the output path
(DuckDB and polars ``**`` globs included) sees a staged row. On ``s3://`` each file is
instead a multipart upload to its final key, invisible until the commit completes it
(``multipart``; docs/files.md has the table of commits by file system). Plain Python: no
Spark here; the registry (``twophase.sinks.registry``) declares it as ``twophase.files``.

Modules by role: ``settings`` (options), ``formats`` (encoders), ``layout`` (staging and final
names), ``partitioning`` (Hive directories), ``jsonlines`` (JSON encoding), ``storage`` (the
filesystem), ``durability`` (the fsyncs), ``s3`` and ``multipart`` (the S3 path),
``handles`` (what the decision log holds), ``errors``, ``writer`` and ``committer``.
"""

from twophase.sinks.files.committer import FilesCommitter
from twophase.sinks.files.errors import FilesNotWritableError, FilesUnavailableError
from twophase.sinks.files.formats import FORMATS
from twophase.sinks.files.handles import KIND, StagedFile, stagedFiles
from twophase.sinks.files.layout import (
    LEGACY_STAGING_ROOT,
    STAGING_DIR_NAME,
    defaultStagingPath,
    finalFileName,
    sinkTag,
)
from twophase.sinks.files.settings import SAFE_OPTIONS, FilesSettings
from twophase.sinks.files.writer import (
    FilesTransaction,
    FilesWriter,
    checkWritable,
    validateTarget,
)

__all__ = [
    "FORMATS",
    "KIND",
    "LEGACY_STAGING_ROOT",
    "SAFE_OPTIONS",
    "STAGING_DIR_NAME",
    "FilesCommitter",
    "FilesNotWritableError",
    "FilesSettings",
    "FilesUnavailableError",
    "FilesTransaction",
    "FilesWriter",
    "StagedFile",
    "checkWritable",
    "defaultStagingPath",
    "finalFileName",
    "sinkTag",
    "stagedFiles",
    "validateTarget",
]
