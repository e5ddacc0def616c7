"""The files sink's options: parsed and checked once into a frozen ``FilesSettings``.

Errors are ``ValueError``s raised where an option is read, naming the option and the fix.
``SAFE_OPTIONS`` says which of these options may be written to the checkpoint's ``sink.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec

from twophase.options import SinkOption, keptOptions
from twophase.redaction import redact
from twophase.sinks.files.formats import (
    COMPRESSION_ALIASES,
    DEFAULT_COMPRESSION,
    EXTENSIONS,
    FORMATS,
)
from twophase.sinks.files.layout import defaultStagingPath, strippedPath
from twophase.sinks.files.s3 import MIN_PART_SIZE
from twophase.sinks.files.trust import withCaBundle

DEFAULT_PART_SIZE = 8 * 1024 * 1024
"""Bytes per uploaded part on S3 (option ``partSize``): the memory one open file holds."""

STORAGE_PREFIX = "fs."
"""Options named ``fs.<name>`` are passed to the fsspec filesystem as storage option ``<name>``."""

KEPT_STORAGE_OPTIONS = (
    "fs.anon",
    "fs.endpoint_url",
    "fs.use_ssl",
    "fs.requester_pays",
    "fs.version_aware",
    "fs.account_name",
    "fs.project",
    "fs.ca_bundle",
)
"""Storage options that address a store but cannot hold a credential. Keys, secrets, tokens,
passwords, connection strings and free-form ``fs.client_kwargs`` or ``fs.config_kwargs`` never
reach sink.json: the committer reads them from the environment (AWS_*, AZURE_STORAGE_*,
application default credentials...)."""

OPTIONS = (
    SinkOption(
        ("path",),
        "path",
        "required",
        "the output directory: a local path or any fsspec URL (`s3://bucket/prefix`, `memory://p`)",
    ),
    SinkOption(("format",), "choice", "`parquet`", "`parquet`, `json` (JSON lines) or `csv`"),
    SinkOption(
        ("compression",),
        "choice",
        "`snappy`; `none` for json and csv",
        "Parquet's `snappy`, `zstd`, `gzip`, `none`; json and csv `none` or `gzip`",
    ),
    SinkOption(
        ("partitionBy",),
        "columns",
        "-",
        "comma-separated columns: rows go to Hive-style `col=value/` directories, those "
        "columns left out of the files, as Spark does",
    ),
    SinkOption(
        ("maxRecordsPerFile",),
        "integer",
        "`0` (no limit)",
        "roll to a new part file after this many rows",
    ),
    SinkOption(
        ("maxOpenFiles",),
        "integer",
        "`32`",
        "open part files per task before the least recently used is closed",
    ),
    SinkOption(("header",), "boolean", "`true`", "csv only: write a header line"),
    SinkOption(
        ("stagingPath",),
        "path",
        "`<parent>/_twophase-staging/<name>`",
        "where task attempts stage their files until the commit, outside `path` and on the "
        "same filesystem",
    ),
    SinkOption(
        ("partSize",),
        "bytes",
        "8 MiB",
        "on `s3://`, bytes per multipart upload part (at least 5 MiB): a task holds one part "
        "in memory per open file",
    ),
    SinkOption(
        ("fs.*",),
        "prefix",
        "",
        "fsspec storage options (`fs.endpoint_url`, `fs.key`, `fs.secret`, `fs.token`...); "
        "`fs.ca_bundle`: a PEM file of the CAs an `https://` S3 endpoint is verified with "
        "(s3fs's `client_kwargs.verify`), at the same path on every executor; the checkpoint "
        "keeps only those that cannot hold a credential "
        f"({', '.join(f'`{n}`' for n in KEPT_STORAGE_OPTIONS)})",
        kept=KEPT_STORAGE_OPTIONS,
    ),
)
"""The files sink's options, declared once (docs/files.md's table comes from it)."""

TABLE_FILE_OPTIONS = (
    SinkOption(
        ("compression",), "choice", "`snappy`", "Parquet's: `snappy`, `zstd`, `gzip`, `none`"
    ),
    SinkOption(
        ("maxRecordsPerFile", "maxOpenFiles", "partSize"),
        "integer",
        "`0` (no limit), `32`, 8 MiB",
        "as in `twophase.files`",
    ),
)
"""The options of a table format's data files (Delta, Iceberg): Parquet's, as the files sink
reads them."""

SAFE_OPTIONS = keptOptions(OPTIONS)
"""Options (lower-case) the committer may rebuild itself from: every option that shapes the
output, and no storage credential."""


def decodeStorageOption(value: str) -> Any:
    """``fs.*`` values arrive as strings: ``true``/``false`` and JSON objects/arrays are decoded.

    Everything else (numbers included) stays a string, so a numeric-looking secret is never
    mangled; pass a JSON object under one key (e.g. ``fs.client_kwargs``) for typed values.
    """
    text = value.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text[:1] in ("{", "["):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return value
    return value


@dataclass(frozen=True)
class FilesSettings:
    """The files sink's options, parsed and checked once (``FilesSettings.fromOptions``).

    Options (names case-insensitive, values strings as Spark passes them):

    - ``path`` (required): output directory, any fsspec URL (``s3://b/p``, ``memory://p``) or
      a local path.
    - ``format``: ``parquet`` (default), ``json`` (JSON lines) or ``csv``.
    - ``compression``: parquet ``snappy`` (default), ``zstd``, ``gzip``, ``none``; json and
      csv ``none`` (default) or ``gzip``.
    - ``maxRecordsPerFile``: roll to a new part file after this many rows; ``0`` (default) is
      unlimited.
    - ``partitionBy``: comma-separated columns; rows go to Hive-style ``col=value/``
      directories and those columns are left out of the files, as Spark does.
    - ``maxOpenFiles``: open part files per task before the least recently used is closed
      (default 32).
    - ``header``: csv only, write a header line (``true``, default) or not.
    - ``stagingPath``: where task attempts stage their files until the commit renames them,
      outside ``path`` and on the same filesystem (default ``<parent>/_twophase-staging/<name>``
      beside ``path``; see :mod:`twophase.sinks.files.layout`).
    - ``partSize``: on ``s3://``, bytes per multipart upload part (default 8 MiB, at least
      5 MiB): a task holds one part in memory per open file (docs/files.md).
    - ``fs.<name>``: passed to the fsspec filesystem as storage option ``<name>``, but for
      ``fs.ca_bundle``, the PEM file of the CAs an ``https://`` S3 endpoint is verified with,
      which s3fs takes as ``client_kwargs={"verify": <file>}`` (:mod:`twophase.sinks.files.trust`).

    Other options (the binding's own, Spark's ``checkpointLocation``...) are ignored.
    """

    path: str
    format: str = "parquet"
    compression: str = "snappy"
    maxRecordsPerFile: int = 0
    partitionBy: tuple[str, ...] = ()
    maxOpenFiles: int = 32
    header: bool = True
    stagingPath: str = ""
    """Empty means the default beside ``path``; :attr:`staging` is the one in use."""
    partSize: int = DEFAULT_PART_SIZE
    storageOptions: dict[str, Any] = field(default_factory=dict, hash=False)
    tableFiles: bool = False
    """Files a table format names (not an option of this sink): every column in the files,
    the ``partitionBy`` ones too (the directory name is only a place), and zoned timestamps
    stored as UTC, the zone of an Iceberg ``timestamptz``."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("option path is required: set it to the output directory")
        if self.format not in FORMATS:
            raise ValueError(
                f"option format={self.format!r} is not supported; use one of {', '.join(FORMATS)}"
            )
        allowed = EXTENSIONS[self.format]
        if self.compression not in allowed:
            raise ValueError(
                f"option compression={self.compression!r} is not supported with "
                f"format={self.format}; use one of {', '.join(allowed)}"
            )
        if self.maxRecordsPerFile < 0:
            raise ValueError(
                f"option maxRecordsPerFile={self.maxRecordsPerFile} must be >= 0 "
                "(0 means unlimited)"
            )
        if self.partSize < MIN_PART_SIZE:
            raise ValueError(
                f"option partSize={self.partSize} is below S3's smallest multipart part "
                f"({MIN_PART_SIZE} bytes, 5 MiB); set it to at least that"
            )
        if self.maxOpenFiles < 1:
            raise ValueError(f"option maxOpenFiles={self.maxOpenFiles} must be >= 1")
        if len(set(self.partitionBy)) != len(self.partitionBy) or not all(self.partitionBy):
            raise ValueError(
                f"option partitionBy={','.join(self.partitionBy)!r} must list distinct, "
                "non-empty column names separated by commas"
            )
        checkStagingPath(self.path, self.staging)

    @property
    def staging(self) -> str:
        """The staging path in use: ``stagingPath`` or the default beside ``path``."""
        return self.stagingPath or defaultStagingPath(self.path)

    @property
    def extension(self) -> str:
        """File name suffix for this format and compression, e.g. ``.snappy.parquet``."""
        return EXTENSIONS[self.format][self.compression]

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> FilesSettings:
        """Parse Spark-style string options; ``ValueError`` names the bad option and the fix."""
        lowered: dict[str, str] = {}
        storage: dict[str, Any] = {}
        for key, value in options.items():
            if key.lower().startswith(STORAGE_PREFIX) and len(key) > len(STORAGE_PREFIX):
                storage[key[len(STORAGE_PREFIX) :]] = decodeStorageOption(str(value))
            else:
                lowered[key.lower()] = str(value)

        path = lowered.get("path", "").strip()
        if not path:
            raise ValueError(
                "option path is required: set .option('path', <directory or fsspec URL>) "
                "or pass it to .start(path)"
            )
        checkProtocol(path)

        fmt = lowered.get("format", "parquet").strip().lower() or "parquet"
        if fmt not in FORMATS:
            raise ValueError(
                f"option format={fmt!r} is not supported; use one of {', '.join(FORMATS)}"
            )
        compression = lowered.get("compression", "").strip().lower()
        compression = COMPRESSION_ALIASES.get(compression, compression)
        compression = compression or DEFAULT_COMPRESSION[fmt]

        maxRecords = _intOption(lowered, "maxrecordsperfile", "maxRecordsPerFile", 0)
        maxOpen = _intOption(lowered, "maxopenfiles", "maxOpenFiles", 32)
        partSize = _intOption(lowered, "partsize", "partSize", DEFAULT_PART_SIZE)

        partitionText = lowered.get("partitionby", "").strip()
        partitionBy = (
            tuple(name.strip() for name in partitionText.split(",")) if partitionText else ()
        )

        headerText = lowered.get("header", "true").strip().lower()
        if headerText not in ("true", "false"):
            raise ValueError(f"option header={headerText!r} must be true or false")

        stagingPath = lowered.get("stagingpath", "").strip()
        if stagingPath:
            checkProtocol(stagingPath, "stagingPath")

        return cls(
            path=path,
            format=fmt,
            compression=compression,
            maxRecordsPerFile=maxRecords,
            partitionBy=partitionBy,
            maxOpenFiles=maxOpen,
            header=headerText == "true",
            stagingPath=stagingPath,
            partSize=partSize,
            storageOptions=withCaBundle(storage),
        )


def _intOption(options: Mapping[str, str], key: str, name: str, default: int) -> int:
    text = options.get(key, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"option {name}={text!r} must be an integer") from None


def checkStagingPath(path: str, staging: str) -> None:
    """Refuse a staging path the commit's rename cannot use: another protocol, or overlapping.

    Staged files must stay outside ``path`` (DuckDB and polars read every file below it) and
    ``path`` must not lie inside the staging path (recovery deletes there). Whether both are
    on one local filesystem is checked at start by ``checkStagingArea``.
    """
    outProtocol = fsspec.core.split_protocol(path)[0] or "file"
    stagingProtocol = fsspec.core.split_protocol(staging)[0] or "file"
    if {outProtocol, stagingProtocol} <= {"file", "local"}:
        pass
    elif outProtocol != stagingProtocol:
        raise ValueError(
            redact(
                f"option stagingPath={staging!r} is on another filesystem ({stagingProtocol}) "
                f"than path={path!r} ({outProtocol}); the commit renames staged files into path, "
                "so set stagingPath to a directory on the same filesystem outside path"
            )
        )
    out = strippedPath(path).rstrip("/") + "/"
    stage = strippedPath(staging).rstrip("/") + "/"
    if stage.startswith(out) or out.startswith(stage):
        raise ValueError(
            redact(
                f"option stagingPath={staging!r} and path={path!r} overlap; staged files must "
                "live outside path (readers such as DuckDB and polars would see them) and path "
                "must not be inside stagingPath: use a sibling directory on the same filesystem"
            )
        )


def checkProtocol(path: str, option: str = "path") -> None:
    """Refuse a ``path`` whose URL protocol fsspec does not know or cannot load."""
    protocol, _ = fsspec.core.split_protocol(path)
    if protocol is None:
        return
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise ValueError(
            redact(
                f"option {option}={path!r}: fsspec knows no filesystem for protocol {protocol!r}; "
                "use a local path or a supported URL (file://, s3://, gs://, abfs://, hdfs://...)"
            )
        ) from None
    except ImportError as exc:
        raise ValueError(
            redact(f"option {option}={path!r}: protocol {protocol!r} needs an extra package: {exc}")
        ) from None


__all__ = [
    "DEFAULT_PART_SIZE",
    "SAFE_OPTIONS",
    "STORAGE_PREFIX",
    "FilesSettings",
    "checkProtocol",
    "checkStagingPath",
    "decodeStorageOption",
]
