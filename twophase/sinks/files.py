"""The files participant: Parquet, JSON lines or CSV files made visible by temp-file-rename.

Each task attempt streams its rows into part files under a hidden staging directory of the
output path; ``preCommit`` closes and syncs them; ``commit`` renames each to a final name that
is a pure function of (sink, batch, partition, part number, partition directory). Readers that
skip ``_``-prefixed paths (Spark, pyarrow datasets, pandas, DuckDB) see nothing until the
rename, and a second ``commit`` finds the final file without its staging file and does nothing.

Layout under the output ``path``::

    _twophase/staging/<sinkTag>/<batchId>/<runId->p<partition>-a<attempt>-<uuid>/<partdirs>/<file>
    <partdirs>/part-<batch:08d>-<partition:05d>-<part:04d>-<sinkTag>.<ext>

where ``<partdirs>`` are Hive-style ``col=value/`` directories when ``partitionBy`` is set
and ``<sinkTag>`` is the sink id made path-safe, so two queries writing one directory (a new
checkpoint restarts batch ids at 0) never share a file name or a staging directory.

Plain Python: no Spark here. ``twophase.spark`` wraps :class:`FilesParticipant` as the data
source ``twophase.files``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import re
import uuid
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar, cast

import fsspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from twophase.protocol import (
    Handle,
    RecoveryScope,
    TransactionContext,
    TransactionLostError,
    TwoPhaseParticipant,
)
from twophase.sink import ParticipantSink
from twophase.sinks._fs import Storage, ancestorsOf, parentOf, transientErrors
from twophase.sinks._jsonlines import encodeBatch
from twophase.sinks._partitioning import dataColumnIndices, splitByPartition

log = logging.getLogger(__name__)

KIND = "files"
"""The ``kind`` of every handle this participant returns."""

STAGING_ROOT = "_twophase/staging"
"""Staging area, relative to the output path; ``_``-prefixed so readers skip it."""

FORMATS = ("parquet", "json", "csv")

_EXTENSIONS: dict[str, dict[str, str]] = {
    "parquet": {
        "snappy": ".snappy.parquet",
        "zstd": ".zstd.parquet",
        "gzip": ".gz.parquet",
        "none": ".parquet",
    },
    "json": {"none": ".json", "gzip": ".json.gz"},
    "csv": {"none": ".csv", "gzip": ".csv.gz"},
}
_DEFAULT_COMPRESSION = {"parquet": "snappy", "json": "none", "csv": "none"}
_COMPRESSION_ALIASES = {"uncompressed": "none", "gz": "gzip"}

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_ATTEMPT_DIR = re.compile(r"^(?:(?P<run>.+)-)?p(?P<partition>\d+)-a(?P<attempt>\d+)-[0-9a-f]+$")


def _safeTag(text: str, fallback: str) -> str:
    """``text`` made safe as one path segment: kept when already safe and short, else hashed."""
    safe = _SAFE.sub("_", text).strip("._-")
    if safe == text and 0 < len(text) <= 48:
        return text
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    return f"{safe[:32] or fallback}-{digest}"


def sinkTag(sinkId: str) -> str:
    """The path-safe form of a sink id used in staging directories and final file names."""
    return _safeTag(sinkId, "sink")


def stagingBatchDir(sinkId: str, batchId: int) -> str:
    """Staging directory of one batch of one sink, relative to the output path."""
    return f"{STAGING_ROOT}/{sinkTag(sinkId)}/{batchId}"


def finalFileName(sinkId: str, batchId: int, partitionId: int, part: int, extension: str) -> str:
    """The committed file name: a pure function of sink, batch, partition and part number.

    Two attempts of one (batch, partition) that write the same rows produce the same names,
    and a committed file keeps its name forever, which makes ``commit`` idempotent.
    """
    return f"part-{batchId:08d}-{partitionId:05d}-{part:04d}-{sinkTag(sinkId)}{extension}"


def _decodeStorageOption(value: str) -> Any:
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
    - ``fs.<name>``: passed to the fsspec filesystem as storage option ``<name>``.

    Other options (the binding's own, Spark's ``checkpointLocation``...) are ignored.
    """

    path: str
    format: str = "parquet"
    compression: str = "snappy"
    maxRecordsPerFile: int = 0
    partitionBy: tuple[str, ...] = ()
    maxOpenFiles: int = 32
    header: bool = True
    storageOptions: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("option path is required: set it to the output directory")
        if self.format not in FORMATS:
            raise ValueError(
                f"option format={self.format!r} is not supported; use one of {', '.join(FORMATS)}"
            )
        allowed = _EXTENSIONS[self.format]
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
        if self.maxOpenFiles < 1:
            raise ValueError(f"option maxOpenFiles={self.maxOpenFiles} must be >= 1")
        if len(set(self.partitionBy)) != len(self.partitionBy) or not all(self.partitionBy):
            raise ValueError(
                f"option partitionBy={','.join(self.partitionBy)!r} must list distinct, "
                "non-empty column names separated by commas"
            )

    @property
    def extension(self) -> str:
        """File name suffix for this format and compression, e.g. ``.snappy.parquet``."""
        return _EXTENSIONS[self.format][self.compression]

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> FilesSettings:
        """Parse Spark-style string options; ``ValueError`` names the bad option and the fix."""
        lowered: dict[str, str] = {}
        storage: dict[str, Any] = {}
        for key, value in options.items():
            if key.lower().startswith("fs.") and len(key) > 3:
                storage[key[3:]] = _decodeStorageOption(str(value))
            else:
                lowered[key.lower()] = str(value)

        path = lowered.get("path", "").strip()
        if not path:
            raise ValueError(
                "option path is required: set .option('path', <directory or fsspec URL>) "
                "or pass it to .start(path)"
            )
        _checkProtocol(path)

        fmt = lowered.get("format", "parquet").strip().lower() or "parquet"
        if fmt not in FORMATS:
            raise ValueError(
                f"option format={fmt!r} is not supported; use one of {', '.join(FORMATS)}"
            )
        compression = lowered.get("compression", "").strip().lower()
        compression = _COMPRESSION_ALIASES.get(compression, compression)
        compression = compression or _DEFAULT_COMPRESSION[fmt]

        maxRecords = _intOption(lowered, "maxrecordsperfile", "maxRecordsPerFile", 0)
        maxOpen = _intOption(lowered, "maxopenfiles", "maxOpenFiles", 32)

        partitionText = lowered.get("partitionby", "").strip()
        partitionBy = (
            tuple(name.strip() for name in partitionText.split(",")) if partitionText else ()
        )

        headerText = lowered.get("header", "true").strip().lower()
        if headerText not in ("true", "false"):
            raise ValueError(f"option header={headerText!r} must be true or false")

        return cls(
            path=path,
            format=fmt,
            compression=compression,
            maxRecordsPerFile=maxRecords,
            partitionBy=partitionBy,
            maxOpenFiles=maxOpen,
            header=headerText == "true",
            storageOptions=storage,
        )


def _intOption(options: Mapping[str, str], key: str, name: str, default: int) -> int:
    text = options.get(key, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"option {name}={text!r} must be an integer") from None


def _checkProtocol(path: str) -> None:
    protocol, _ = fsspec.core.split_protocol(path)
    if protocol is None:
        return
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise ValueError(
            f"option path={path!r}: fsspec knows no filesystem for protocol {protocol!r}; "
            "use a local path or a supported URL (file://, s3://, gs://, abfs://, hdfs://...)"
        ) from None
    except ImportError as exc:
        raise ValueError(
            f"option path={path!r}: protocol {protocol!r} needs an extra package: {exc}"
        ) from None


# -- format writers -------------------------------------------------------------------------


class _FormatWriter(ABC):
    """Encodes record batches of one schema into one open binary file; never closes the file."""

    @abstractmethod
    def write(self, batch: pa.RecordBatch) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class _ParquetWriter(_FormatWriter):
    """One row group per written batch, so memory stays at one batch."""

    def __init__(self, raw: IO[bytes], schema: pa.Schema, settings: FilesSettings) -> None:
        self._writer = pq.ParquetWriter(raw, schema, compression=settings.compression)

    def write(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)

    def close(self) -> None:
        self._writer.close()


class _TextWriter(_FormatWriter):
    """Shared gzip handling of the line formats (a gzip member spanning the whole file)."""

    def __init__(self, raw: IO[bytes], settings: FilesSettings) -> None:
        self._gzip: gzip.GzipFile | None = None
        self.out: IO[bytes] = raw
        if settings.compression == "gzip":
            self._gzip = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0)
            self.out = cast(IO[bytes], self._gzip)

    def close(self) -> None:
        if self._gzip is not None:
            self._gzip.close()


class _JsonWriter(_TextWriter):
    def write(self, batch: pa.RecordBatch) -> None:
        self.out.write(encodeBatch(batch))


class _CsvWriter(_TextWriter):
    def __init__(self, raw: IO[bytes], schema: pa.Schema, settings: FilesSettings) -> None:
        super().__init__(raw, settings)
        options = pacsv.WriteOptions(include_header=settings.header)
        self._writer = pacsv.CSVWriter(self.out, schema, write_options=options)

    def write(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)

    def close(self) -> None:
        self._writer.close()
        super().close()


def _formatWriter(raw: IO[bytes], schema: pa.Schema, settings: FilesSettings) -> _FormatWriter:
    if settings.format == "parquet":
        return _ParquetWriter(raw, schema, settings)
    if settings.format == "json":
        return _JsonWriter(raw, settings)
    return _CsvWriter(raw, schema, settings)


def _checkFormatSupports(schema: pa.Schema, settings: FilesSettings) -> None:
    if settings.format != "csv":
        return
    for f in schema:
        t = f.type
        if pa.types.is_dictionary(t):
            t = t.value_type
        if pa.types.is_nested(t):
            raise ValueError(
                f"option format=csv cannot write column {f.name!r} of type {f.type}; "
                "use format=parquet or format=json, or flatten the column"
            )


# -- the transaction ------------------------------------------------------------------------


@dataclass
class _OpenPart:
    directory: str
    final: str
    staging: str
    raw: IO[bytes]
    writer: _FormatWriter
    rows: int = 0


@dataclass(frozen=True)
class StagedFile:
    """One closed part file of a transaction: where it is staged, where it will go, its rows."""

    staging: str
    final: str
    rows: int

    def toJson(self) -> dict[str, Any]:
        return {"staging": self.staging, "final": self.final, "rows": self.rows}


@dataclass(eq=False)
class FilesTransaction:
    """An open files transaction: one task attempt's staging directory and its open writers.

    Lives in one executor task only (holds open files); never pickled.
    """

    ctx: TransactionContext
    path: str
    staging: str
    schema: pa.Schema | None = None
    dataSchema: pa.Schema | None = None
    dataColumns: list[int] = field(default_factory=list)
    openParts: OrderedDict[str, _OpenPart] = field(default_factory=OrderedDict)
    files: list[StagedFile] = field(default_factory=list)
    nextPart: int = 0
    rows: int = 0
    state: str = "open"
    handle: Handle | None = None
    madeDirs: set[str] = field(default_factory=set)


# -- the participant ------------------------------------------------------------------------


class FilesParticipant(TwoPhaseParticipant[FilesTransaction]):
    """Exactly-once files through temp-file-rename on any fsspec filesystem.

    Guarantees:

    - Nothing a transaction writes is visible to readers that skip ``_``-prefixed paths until
      ``commit`` renames it; ``abort``, ``abortTransaction`` and ``recoverAndAbort`` only ever
      delete below ``<path>/_twophase/staging/<sinkTag>/``, never a committed file.
    - ``commit`` is idempotent and resumable: after a crash midway, calling it again renames
      what is left; a file found at its final name is done. A handle whose staged file and
      final file are both gone raises ``TransactionLostError``.
    - On the local filesystem each staged file and its directories are fsynced in
      ``preCommit`` and the final directories after the renames in ``commit``; elsewhere a
      closed file is as durable as the store makes it. On object stores a rename is copy +
      delete, so a final object still appears whole.
    - Memory per task is bounded by a small multiple of one record batch: rows stream into
      at most ``maxOpenFiles`` open writers and are never accumulated.

    Executor methods (``beginTransaction``, ``write``, ``preCommit``, ``abortTransaction``)
    run inside one task attempt; driver methods (``commit``, ``abort``, ``recoverAndAbort``)
    may run in any process, given only the handle and the same settings.
    """

    kind: ClassVar[str] = KIND

    def __init__(self, settings: FilesSettings) -> None:
        self.settings = settings
        self._storages: dict[str, Storage] = {}

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> FilesParticipant:
        """Build from Spark-style string options (see :class:`FilesSettings`)."""
        return cls(FilesSettings.fromOptions(options))

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.settings = state["settings"]
        self._storages = {}

    def __repr__(self) -> str:
        s = self.settings
        return f"FilesParticipant(path={s.path!r}, format={s.format}, compression={s.compression})"

    # -- storage ----------------------------------------------------------------------------

    @property
    def storage(self) -> Storage:
        """The output directory's filesystem, opened lazily once per process."""
        return self._storageFor(self.settings.path)

    def _storageFor(self, path: str) -> Storage:
        storage = self._storages.get(path)
        if storage is None:
            storage = Storage(path, self.settings.storageOptions)
            self._storages[path] = storage
            self._storages.setdefault(storage.url(), storage)
        return storage

    # -- executor side ----------------------------------------------------------------------

    def beginTransaction(self, ctx: TransactionContext) -> FilesTransaction:
        """Executor: reserve a fresh staging directory for this attempt; writes nothing yet.

        The directory name carries run, partition and attempt plus a random suffix, so two
        attempts (retries, speculation, a zombie of an earlier run) never share one.
        """
        run = f"{_safeTag(ctx.runId, 'run')}-" if ctx.runId else ""
        attemptDir = f"{run}p{ctx.partitionId:05d}-a{ctx.attemptNumber}-{uuid.uuid4().hex[:12]}"
        staging = f"{stagingBatchDir(ctx.sinkId, ctx.batchId)}/{attemptDir}"
        txn = FilesTransaction(ctx=ctx, path=self.storage.url(), staging=staging)
        log.debug("files: begin %s staging at %s", ctx.transactionTag, staging)
        return txn

    def write(self, txn: FilesTransaction, batch: pa.RecordBatch) -> None:
        """Executor: stream ``batch`` into the open part files; nothing becomes visible.

        Rows go to their partition directory's open writer, rolling to a new part file when
        ``maxRecordsPerFile`` would be exceeded (the batch is split). All batches of one
        transaction must share one schema. Raises ``ValueError`` for a schema the options
        cannot write (missing partition column, nested column in csv...).
        """
        if txn.state != "open":
            raise RuntimeError(f"files: write to a {txn.state} transaction {txn.staging}")
        if batch.num_rows == 0:
            return
        if txn.schema is None:
            txn.dataColumns = dataColumnIndices(batch.schema, self.settings.partitionBy)
            _checkFormatSupports(batch.schema, self.settings)
            txn.schema = batch.schema
            txn.dataSchema = pa.schema(
                [batch.schema.field(i) for i in txn.dataColumns], metadata=batch.schema.metadata
            )
        elif not batch.schema.equals(txn.schema, check_metadata=False):
            raise ValueError(
                "files: the record batch schema changed within one transaction "
                f"({txn.schema} -> {batch.schema}); all rows of a task must share one schema"
            )
        for directory, rows in splitByPartition(batch, self.settings.partitionBy, txn.dataColumns):
            self._append(txn, directory, rows)
        txn.rows += batch.num_rows

    def _append(self, txn: FilesTransaction, directory: str, rows: pa.RecordBatch) -> None:
        limit = self.settings.maxRecordsPerFile
        offset = 0
        while offset < rows.num_rows:
            part = self._openPart(txn, directory)
            room = rows.num_rows - offset
            if limit:
                room = min(room, limit - part.rows)
            chunk = rows if offset == 0 and room == rows.num_rows else rows.slice(offset, room)
            part.writer.write(chunk)
            part.rows += room
            offset += room
            if limit and part.rows >= limit:
                self._closePart(txn, part)

    def _openPart(self, txn: FilesTransaction, directory: str) -> _OpenPart:
        part = txn.openParts.get(directory)
        if part is not None:
            txn.openParts.move_to_end(directory)
            return part
        while len(txn.openParts) >= self.settings.maxOpenFiles:
            _, oldest = next(iter(txn.openParts.items()))
            self._closePart(txn, oldest)
        ctx = txn.ctx
        name = finalFileName(
            ctx.sinkId, ctx.batchId, ctx.partitionId, txn.nextPart, self.settings.extension
        )
        txn.nextPart += 1
        final = f"{directory}/{name}" if directory else name
        staging = f"{txn.staging}/{final}"
        parent = parentOf(staging)
        if parent not in txn.madeDirs:
            self.storage.makedirs(parent)
            txn.madeDirs.add(parent)
        raw = self.storage.create(staging)
        assert txn.dataSchema is not None
        try:
            writer = _formatWriter(raw, txn.dataSchema, self.settings)
        except BaseException:
            raw.close()
            raise
        part = _OpenPart(directory=directory, final=final, staging=staging, raw=raw, writer=writer)
        txn.openParts[directory] = part
        return part

    def _closePart(self, txn: FilesTransaction, part: _OpenPart) -> None:
        del txn.openParts[part.directory]
        try:
            part.writer.close()
        finally:
            part.raw.close()
        self.storage.syncFile(part.staging)
        txn.files.append(StagedFile(staging=part.staging, final=part.final, rows=part.rows))

    def preCommit(self, txn: FilesTransaction) -> Handle:
        """Executor: close every part file, fsync files and directories, return the handle.

        Nothing is visible yet. Calling it again returns the same handle. Handle format::

            {"kind": "files", "path": <output path URL>, "batchId": N, "partitionId": p,
             "attempt": a, "staging": <staging dir, relative to path>,
             "files": [{"staging": <relative>, "final": <relative>, "rows": n}, ...]}
        """
        if txn.state == "prepared" and txn.handle is not None:
            return txn.handle
        if txn.state != "open":
            raise RuntimeError(f"files: preCommit of a {txn.state} transaction {txn.staging}")
        for part in list(txn.openParts.values()):
            self._closePart(txn, part)
        dirs: set[str] = set()
        for staged in txn.files:
            dirs.update(ancestorsOf(staged.staging))
        self.storage.syncDirs(dirs)
        ctx = txn.ctx
        handle: Handle = {
            "kind": KIND,
            "path": txn.path,
            "batchId": ctx.batchId,
            "partitionId": ctx.partitionId,
            "attempt": ctx.attemptNumber,
            "staging": txn.staging,
            "files": [f.toJson() for f in txn.files],
        }
        txn.state = "prepared"
        txn.handle = handle
        log.debug(
            "files: prepared %s: %d file(s), %d row(s)",
            ctx.transactionTag,
            len(txn.files),
            txn.rows,
        )
        return handle

    def abortTransaction(self, txn: FilesTransaction) -> None:
        """Executor, best effort: close writers and delete this attempt's staging directory.

        Never raises; whatever it cannot delete is found later by ``recoverAndAbort``.
        """
        for part in list(txn.openParts.values()):
            try:
                part.writer.close()
            except Exception:  # best effort: the files are discarded anyway
                log.debug("files: closing %s during abort failed", part.staging, exc_info=True)
            try:
                part.raw.close()
            except Exception:  # best effort
                log.debug("files: closing %s during abort failed", part.staging, exc_info=True)
        txn.openParts.clear()
        txn.state = "aborted"
        try:
            self.storage.removeTree(txn.staging)
        except Exception:  # best effort by contract
            log.warning(
                "files: could not delete staging %s of aborted %s; recoverAndAbort will",
                txn.staging,
                txn.ctx.transactionTag,
                exc_info=True,
            )

    # -- driver side ------------------------------------------------------------------------

    def commit(self, handle: Handle) -> None:
        """Driver, idempotent and resumable: rename every staged file to its final name.

        Per file: staged and not final -> rename (parents created); final and not staged ->
        already done; both (a copy-then-delete rename interrupted on an object store) ->
        delete the staged copy after checking sizes match; neither -> ``TransactionLostError``.
        Then the staging directory is removed. Transient filesystem errors raise
        ``TransientCommitError``; a retry continues where this call stopped.
        """
        h = _checkHandle(handle)
        storage = self._storageFor(h["path"])
        what = f"commit of {self.describe(h)}"
        with transientErrors(what):
            storage.invalidateCache()
            staged = storage.listFiles(h["staging"])
            touched: set[str] = set()
            madeDirs: set[str] = set()
            for entry in h["files"]:
                source, target = entry["staging"], entry["final"]
                if source in staged:
                    if storage.exists(target):
                        _dropCopiedStagingFile(storage, source, target, what)
                    else:
                        parent = parentOf(target)
                        if parent and parent not in madeDirs:
                            storage.makedirs(parent)
                            madeDirs.add(parent)
                        storage.move(source, target)
                    touched.update(ancestorsOf(target))
                elif not storage.exists(target):
                    raise TransactionLostError(
                        f"files: {what}: neither the staged file {source!r} nor the final file "
                        f"{target!r} exists under {h['path']!r}; the batch's output for this "
                        "task is lost (was the staging area deleted by hand?)"
                    )
            storage.syncDirs(touched)
            storage.removeTree(h["staging"])
            storage.removeEmptyDir(parentOf(h["staging"]))
        log.debug("files: committed %s", self.describe(h))

    def abort(self, handle: Handle) -> None:
        """Driver, idempotent: delete the handle's staging directory; never a final file."""
        h = _checkHandle(handle)
        storage = self._storageFor(h["path"])
        with transientErrors(f"abort of {self.describe(h)}"):
            storage.invalidateCache()
            removed = storage.removeTree(h["staging"])
            storage.removeEmptyDir(parentOf(h["staging"]))
        log.debug("files: aborted %s (%s)", self.describe(h), "deleted" if removed else "gone")

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle]:
        """Driver, idempotent: delete this sink's staging attempts that no kept handle names.

        Looks under ``<path>/_twophase/staging/<sinkTag>/`` (only ``<batchId>/`` when
        ``scope.batchId`` is set): one listing of the batches plus one per batch found, so it
        is cheap when there is nothing to do. Kept handles are matched by their ``staging``
        key. Empty batch directories are removed. Returns one brief handle per deleted attempt
        (same shape as a prepared handle, with ``files`` empty).
        """
        storage = self.storage
        root = f"{STAGING_ROOT}/{sinkTag(scope.sinkId)}"
        keep = {h.get("staging") for h in scope.keep if h.get("kind") == KIND}
        aborted: list[Handle] = []
        with transientErrors(f"recoverAndAbort of files sink {scope.sinkId} at {storage.url()}"):
            storage.invalidateCache()
            if scope.batchId is not None:
                batches = [str(scope.batchId)]
            else:
                batches = [n for n in storage.listDirNames(root) if n.isdigit()]
            for batch in batches:
                batchDir = f"{root}/{batch}"
                for name in storage.listDirNames(batchDir):
                    staging = f"{batchDir}/{name}"
                    if staging in keep:
                        continue
                    storage.removeTree(staging)
                    aborted.append(_briefHandle(storage.url(), int(batch), staging, name))
                storage.removeEmptyDir(batchDir)
        if aborted:
            log.info(
                "files: recoverAndAbort deleted %d lingering staging attempt(s) of sink %s: %s",
                len(aborted),
                scope.sinkId,
                ", ".join(h["staging"] for h in aborted),
            )
        return aborted

    def describe(self, handle: Handle) -> str:
        """``files batch N partition p attempt a: k file(s), r row(s) at <path>``."""
        files = handle.get("files") or []
        rows = sum(int(f.get("rows", 0)) for f in files)
        return (
            f"files batch {handle.get('batchId')} partition {handle.get('partitionId')} "
            f"attempt {handle.get('attempt')}: {len(files)} file(s), {rows} row(s) at "
            f"{handle.get('path')}"
        )


def _dropCopiedStagingFile(storage: Storage, source: str, target: str, what: str) -> None:
    """Both copies exist: an earlier rename copied but did not delete. Drop the staged copy."""
    if storage.size(source) != storage.size(target):
        raise FileExistsError(
            f"files: {what}: final file {target!r} already exists with different content "
            f"than the staged {source!r}; another writer uses this output path and sink id"
        )
    storage.removeFile(source)


def _briefHandle(path: str, batchId: int, staging: str, name: str) -> Handle:
    match = _ATTEMPT_DIR.match(name)
    handle: Handle = {"kind": KIND, "path": path, "batchId": batchId, "staging": staging}
    if match:
        handle["partitionId"] = int(match["partition"])
        handle["attempt"] = int(match["attempt"])
    handle["files"] = []
    return handle


def _isSafeRelative(rel: Any) -> bool:
    return (
        isinstance(rel, str)
        and bool(rel)
        and not rel.startswith("/")
        and "://" not in rel
        and ".." not in rel.split("/")
    )


def _checkHandle(handle: Handle) -> Handle:
    """Refuse anything that is not a well-formed files handle before touching a file."""
    if handle.get("kind") != KIND:
        raise ValueError(f"not a files handle (kind={handle.get('kind')!r}): {handle!r}")
    staging = handle.get("staging")
    if not (_isSafeRelative(staging) and str(staging).startswith(STAGING_ROOT + "/")):
        raise ValueError(f"files handle has a bad staging directory {staging!r}")
    if not isinstance(handle.get("path"), str) or not handle["path"]:
        raise ValueError(f"files handle has no path: {handle!r}")
    files = handle.get("files")
    if not isinstance(files, list):
        raise ValueError(f"files handle has no file list: {handle!r}")
    for entry in files:
        if not (
            isinstance(entry, dict)
            and _isSafeRelative(entry.get("staging"))
            and str(entry["staging"]).startswith(str(staging) + "/")
            and _isSafeRelative(entry.get("final"))
            and not str(entry["final"]).startswith(STAGING_ROOT.split("/")[0] + "/")
        ):
            raise ValueError(f"files handle has a bad file entry {entry!r}")
    return handle


def stagedFiles(handle: Handle) -> Iterable[StagedFile]:
    """The files of a handle as :class:`StagedFile` values (for tools and tests)."""
    for entry in _checkHandle(handle)["files"]:
        yield StagedFile(staging=entry["staging"], final=entry["final"], rows=int(entry["rows"]))


__all__ = [
    "FilesSink",
    "FORMATS",
    "KIND",
    "STAGING_ROOT",
    "FilesParticipant",
    "FilesSettings",
    "FilesTransaction",
    "StagedFile",
    "finalFileName",
    "sinkTag",
    "stagedFiles",
    "stagingBatchDir",
]


class FilesSink(ParticipantSink):
    """``twophase.files``: the Spark data source over ``FilesParticipant``.

    ``df.writeStream.format("twophase.files").option("path", ...)
    .option("checkpointLocation", ...).start()`` after ``twophase.register(spark)``.
    """

    @classmethod
    def name(cls) -> str:
        return "twophase.files"

    def makeParticipant(self) -> FilesParticipant:
        return FilesParticipant.fromOptions(self.options)
