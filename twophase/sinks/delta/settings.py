"""The Delta sink's options: parsed and checked once into a frozen ``DeltaSettings``.

The data files are the files sink's Parquet files, so most options are its options under the
same names; ``createTable`` is Delta's own. ``SAFE_OPTIONS`` says which options may be written
to the checkpoint's ``sink.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import fsspec

from twophase.options import SinkOption, keptOptions
from twophase.redaction import redact
from twophase.sinks.files.settings import (
    KEPT_STORAGE_OPTIONS,
    STORAGE_PREFIX,
    TABLE_FILE_OPTIONS,
    FilesSettings,
)

DELTA_PREFIX = "storage."
"""Options ``storage.<KEY>`` go to delta-rs as storage option ``<KEY>`` (``AWS_REGION``...)."""

_KEPT_DELTA_STORAGE = ("storage.aws_region", "storage.aws_endpoint_url", "storage.aws_allow_http")

OPTIONS = (
    SinkOption(
        ("path",),
        "path",
        "required",
        "the table's directory: local, mounted, or `s3://bucket/prefix`",
    ),
    SinkOption(
        ("partitionBy",),
        "columns",
        "the table's",
        "comma-separated columns of a new table; for an existing table, leave it out or give "
        "its own",
    ),
    SinkOption(
        ("createTable",),
        "boolean",
        "`true`",
        "create a missing table from the stream's schema; `false` refuses to start without one",
    ),
    *TABLE_FILE_OPTIONS,
    SinkOption(
        ("stagingPath",),
        "path",
        "beside the table",
        "where tasks stage files until the commit, on the same filesystem, outside the table",
    ),
    SinkOption(
        ("fs.*",),
        "prefix",
        "",
        "on S3, s3fs's options for the data files (`fs.endpoint_url`, `fs.key`, `fs.secret`, "
        "`fs.token`), given to delta-rs too under its names (`AWS_ENDPOINT_URL`, "
        "`AWS_ACCESS_KEY_ID`...; `AWS_ALLOW_HTTP` for an `http://` endpoint); `fs.ca_bundle` "
        "for an `https://` endpoint's CA (s3fs only: delta-rs trusts `SSL_CERT_FILE`); kept as "
        "in `twophase.files`",
        kept=KEPT_STORAGE_OPTIONS,
    ),
    SinkOption(
        ("storage.*",),
        "prefix",
        "",
        "delta-rs storage options as they are (`storage.AWS_REGION`), over those; the "
        f"checkpoint keeps {', '.join(f'`{n}`' for n in _KEPT_DELTA_STORAGE)}",
        kept=_KEPT_DELTA_STORAGE,
    ),
)
"""The Delta sink's options, declared once (docs/delta.md's table comes from it)."""

SAFE_OPTIONS = keptOptions(OPTIONS)
"""Options (lower-case) the committer rebuilds itself from: every option that shapes the table
and no credential (keys, secrets and tokens come from the environment in ``twophase
recover``, as delta-rs and s3fs read ``AWS_*`` themselves)."""

_FILES_OPTIONS = (
    "path",
    "partitionby",
    "compression",
    "maxrecordsperfile",
    "maxopenfiles",
    "partsize",
)
_PROTOCOLS = (None, "file", "local", "s3", "s3a")
_FROM_FS = {
    "endpoint_url": "AWS_ENDPOINT_URL",
    "key": "AWS_ACCESS_KEY_ID",
    "secret": "AWS_SECRET_ACCESS_KEY",
    "token": "AWS_SESSION_TOKEN",
}
"""s3fs's options (``fs.*``, as ``twophase.files`` takes them) and delta-rs's names for them."""


@dataclass(frozen=True)
class DeltaSettings:
    """The Delta sink's options (names case-insensitive, values strings as Spark passes them):

    - ``path`` (required): the table's directory: a local path, a ``file://`` URL or
      ``s3://bucket/prefix`` (data files uploaded by multipart upload, completed at the commit,
      as ``twophase.files`` does on S3).
    - ``partitionBy``: comma-separated columns of a new table; an existing table's own
      partition columns must be the same (or the option left out).
    - ``createTable``: ``true`` (default) creates a missing table from the stream's schema;
      ``false`` refuses to start without one.
    - ``compression``, ``maxRecordsPerFile``, ``maxOpenFiles``: the data files', as in
      ``twophase.files`` (Parquet, ``snappy`` by default).
    - ``stagingPath``: where tasks stage their files until the commit moves them into the
      table, outside it on the same filesystem (default: beside it, as ``twophase.files``).
    - ``fs.<name>``: s3fs's options for the data files (``fs.endpoint_url``, ``fs.key``,
      ``fs.secret``...), also given to delta-rs under its own names for the log; but
      ``fs.ca_bundle``, the CA of an ``https://`` endpoint, which delta-rs cannot take: it
      trusts the system's store or the environment's ``SSL_CERT_FILE``.
    - ``storage.<KEY>``: delta-rs storage options (``storage.AWS_REGION``), over those.
    """

    files: FilesSettings
    createTable: bool = True
    partitionGiven: bool = False
    """Whether ``partitionBy`` was set (an existing table's partitioning is checked against it)."""
    storage: dict[str, str] = field(default_factory=dict, hash=False, repr=False)
    """delta-rs's storage options; may hold credentials, so it is never written anywhere."""

    @property
    def tableUri(self) -> str:
        """The table as delta-rs names it (``s3a://`` is ``s3://`` to it)."""
        path = self.files.path
        return "s3://" + path[len("s3a://") :] if path.startswith("s3a://") else path

    @property
    def path(self) -> str:
        return self.files.path

    @property
    def partitionBy(self) -> tuple[str, ...]:
        return self.files.partitionBy

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> DeltaSettings:
        """Parse Spark-style string options; ``ValueError`` names the bad option and the fix."""
        lowered = {key.lower(): str(value) for key, value in options.items()}
        path = lowered.get("path", "").strip()
        if not path:
            raise ValueError(
                "option path is required: set .option('path', <the Delta table's directory>) "
                "or pass it to .start(path)"
            )
        protocol = fsspec.core.split_protocol(path)[0]
        if protocol not in _PROTOCOLS:
            raise ValueError(
                redact(
                    f"option path={path!r}: twophase.delta writes tables on a local or mounted "
                    f"filesystem or on S3 (s3://); {protocol}:// is not supported: use one of "
                    "those"
                )
            )
        createText = lowered.get("createtable", "true").strip().lower()
        if createText not in ("true", "false"):
            raise ValueError(f"option createTable={createText!r} must be true or false")
        chosen = {key: lowered[key] for key in _FILES_OPTIONS if key in lowered}
        chosen["path"] = path
        chosen["format"] = "parquet"
        if lowered.get("stagingpath", "").strip():
            chosen["stagingpath"] = lowered["stagingpath"]
        storage: dict[str, str] = {}
        for key, value in options.items():
            if key.lower().startswith(STORAGE_PREFIX):
                chosen[key] = str(value)
                name = _FROM_FS.get(key[len(STORAGE_PREFIX) :].lower())
                if name is not None:
                    storage[name] = str(value)
        if storage.get("AWS_ENDPOINT_URL", "").lower().startswith("http://"):
            storage["AWS_ALLOW_HTTP"] = "true"
        for key, value in options.items():
            if key.lower().startswith(DELTA_PREFIX) and len(key) > len(DELTA_PREFIX):
                storage[key[len(DELTA_PREFIX) :].upper()] = str(value)
        return cls(
            files=FilesSettings.fromOptions(chosen),
            createTable=createText == "true",
            partitionGiven=bool(lowered.get("partitionby", "").strip()),
            storage=storage,
        )


__all__ = ["DELTA_PREFIX", "SAFE_OPTIONS", "DeltaSettings"]
