"""The files sink's executor half: stream a task's rows into staged part files.

Each task attempt writes under its own directory of the staging path, outside the output path
(see :mod:`twophase.sinks.files.layout`); ``preCommit`` closes and syncs the files and returns
a handle naming them. Nothing here makes a file visible: that is the committer's rename.
"""

from __future__ import annotations

import errno
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, cast

import pyarrow as pa

from twophase.protocol import Handle, TransactionContext, TransactionWriter
from twophase.protocol.fingerprint import Fingerprint
from twophase.redaction import getLogger, redact
from twophase.sinks.files.errors import (
    FilesNotWritableError,
    FilesSinkError,
    FilesUnavailableError,
)
from twophase.sinks.files.formats import (
    FormatWriter,
    checkFormatSupports,
    formatWriter,
    utcTimestamps,
)
from twophase.sinks.files.handles import (
    StagedFile,
    UploadedFile,
    multipartHandle,
    preparedHandle,
)
from twophase.sinks.files.layout import (
    attemptName,
    finalFileName,
    sinkStagingDir,
    stagedFileName,
)
from twophase.sinks.files.multipart import MultipartFile, recordFingerprint
from twophase.sinks.files.partitioning import dataColumnIndices, splitByPartition
from twophase.sinks.files.s3 import S3Calls, isS3, isTransient, splitKey
from twophase.sinks.files.settings import FilesSettings
from twophase.sinks.files.storage import Storage, Storages, parentOf
from twophase.sinks.files.trust import checkPathTrust

log = getLogger(__name__)

_REFUSED = {
    errno.ENOSPC: "is full: free space on it",
    errno.EDQUOT: "has used up its quota: raise it or free space on it",
    errno.EROFS: "is read-only: make it writable again",
    errno.EACCES: "does not let this process write: give it write access",
}
"""Why a filesystem refuses a task's bytes, by errno, and what an operator does about it."""


def checkWritable(schema: pa.Schema, settings: FilesSettings) -> list[int]:
    """Refuse a schema the options cannot write; return the indices of the file columns.

    A partition column that is missing or cannot name a directory, or a column the format
    cannot hold, raises ``ValueError`` naming the option. The writer checks each task's first
    batch; the Spark binding checks the query's schema on the driver before tasks run.
    """
    columns = dataColumnIndices(schema, settings.partitionBy)
    if settings.tableFiles:
        columns = list(range(len(schema)))
    checkFormatSupports(schema, settings.format)
    return columns


def validateTarget(settings: FilesSettings, schema: pa.Schema, sinkId: str) -> None:
    """Driver, before each batch: the options can write the query's columns (``checkWritable``)
    and an ``https://`` S3 endpoint's certificate verifies under the CA they give."""
    checkWritable(schema, settings)
    checkPathTrust(settings.path, settings.storageOptions)


def inUtc(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with every zoned timestamp in UTC (the same instants; Spark hands them in
    the session's zone)."""
    schema = pa.schema(
        [f.with_type(utcTimestamps(f.type)) for f in batch.schema], metadata=batch.schema.metadata
    )
    return batch if schema.equals(batch.schema) else batch.cast(schema)


@dataclass
class OpenPart:
    """A part file being written: its partition directory, final and staged names, encoder."""

    directory: str
    final: str
    staging: str
    raw: IO[bytes]
    writer: FormatWriter
    rows: int = 0


@dataclass(eq=False)
class FilesTransaction:
    """An open files transaction: one task attempt's staging directory and its open writers.

    Lives in one executor task only (holds open files); never pickled.
    """

    ctx: TransactionContext
    path: str
    stagingPath: str
    staging: str
    schema: pa.Schema | None = None
    dataSchema: pa.Schema | None = None
    dataColumns: list[int] = field(default_factory=list)
    openParts: OrderedDict[str, OpenPart] = field(default_factory=OrderedDict)
    files: list[StagedFile] = field(default_factory=list)
    nextPart: int = 0
    rows: int = 0
    state: str = "open"
    handle: Handle | None = None
    multipart: bool = False
    """On S3: each part file is a multipart upload to its final key (``uploads``)."""
    uploads: list[UploadedFile] = field(default_factory=list)
    fingerprint: Fingerprint = field(default_factory=Fingerprint)


class FilesWriter(TransactionWriter[FilesTransaction]):
    """Executor, once per task attempt: rows into staged files, invisible to readers.

    - Nothing a transaction writes is visible to any reader of the output path: it all lands
      below ``<stagingPath>/<sinkTag>/``, outside it, in files named ``*.staged``.
    - On the local filesystem each staged file is fsynced as it is closed, and ``preCommit``
      fsyncs the attempt's directories and the sink's staging directory (the directories
      above it once per process); elsewhere a closed file is as durable as the store makes it.
    - A task with no rows creates, opens and syncs nothing.
    - On ``s3://`` nothing is staged: each part file streams to its final key as a multipart
      upload left incomplete, invisible until the commit completes it
      (:mod:`twophase.sinks.files.multipart`); memory is one part per open file.
    - Memory per task is bounded by a small multiple of one record batch: rows stream into
      at most ``maxOpenFiles`` open writers and are never accumulated.
    """

    def __init__(self, settings: FilesSettings) -> None:
        self.settings = settings
        self._stagingPath = settings.staging
        self._storages = Storages(settings.storageOptions)

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> FilesWriter:
        """Build from Spark-style string options (see :class:`FilesSettings`)."""
        return cls(FilesSettings.fromOptions(options))

    def __repr__(self) -> str:
        s = self.settings
        return f"FilesWriter(path={s.path!r}, format={s.format}, compression={s.compression})"

    @property
    def storage(self) -> Storage:
        """The output directory's filesystem, opened lazily once per process."""
        return self._storages.get(self.settings.path)

    @property
    def stagingStorage(self) -> Storage:
        """The staging path's filesystem, opened lazily once per process."""
        return self._storages.get(self._stagingPath)

    def beginTransaction(self, ctx: TransactionContext) -> FilesTransaction:
        """Executor: name this attempt's staged files; creates nothing yet.

        The attempt name carries batch, run, partition and attempt plus a random suffix, so
        two attempts (retries, speculation, a zombie of an earlier run) never share a file.
        """
        name = attemptName(ctx.batchId, ctx.runId, ctx.partitionId, ctx.attemptNumber)
        staging = f"{sinkStagingDir(ctx.sinkId)}/{name}"
        txn = FilesTransaction(
            ctx=ctx,
            path=self.storage.url(),
            stagingPath=self.stagingStorage.url(),
            staging=staging,
            multipart=isS3(self.storage.fs),
        )
        log.debug("files: begin %s staging at %s", ctx.transactionTag, staging)
        return txn

    def write(self, txn: FilesTransaction, batch: pa.RecordBatch) -> None:
        """Executor: stream ``batch`` into the open part files (``_write``)."""
        with self._storageErrors(txn):
            self._write(txn, batch)

    def preCommit(self, txn: FilesTransaction) -> Handle:
        """Executor: close every part file, fsync or upload what is left, return the handle
        (``_preCommit``)."""
        with self._storageErrors(txn):
            return self._preCommit(txn)

    @contextmanager
    def _storageErrors(self, txn: FilesTransaction) -> Iterator[None]:
        """Storage that did not answer (botocore's connection and timeout errors, after
        s3fs's own retries) as ``FilesUnavailableError`` naming the task and the bound; a
        full or read-only filesystem as ``FilesNotWritableError`` naming the place and fix."""
        try:
            yield
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno in _REFUSED:
                raise self._notWritable(txn, exc) from exc
            if not isTransient(exc):
                raise
            raise self._unavailable(txn, exc) from None

    @staticmethod
    def _notWritable(txn: FilesTransaction, exc: OSError) -> FilesNotWritableError:
        ctx = txn.ctx
        where = redact(txn.path if txn.multipart else txn.stagingPath)
        code = errno.errorcode.get(exc.errno or 0, "")
        error = FilesNotWritableError(
            f"files sink {ctx.sinkId}, batch {ctx.batchId}, partition {ctx.partitionId} "
            f"(attempt {ctx.attemptNumber}): cannot write its files under {where}: {code} "
            f"({exc.strerror}). The filesystem holding {where} {_REFUSED[exc.errno or 0]}. "
            "Nothing of this task is visible; once the filesystem takes writes again, Spark's "
            "retry of the task or a restart of the query writes the batch exactly once.",
            # S3 refusing the keys reaches us as s3fs's PermissionError from botocore's error
            reason=FilesSinkError.classify(exc.__cause__) if exc.__cause__ else None,
        )
        error.errno = exc.errno
        return error

    @staticmethod
    def _unavailable(txn: FilesTransaction, exc: Exception) -> FilesUnavailableError:
        ctx = txn.ctx
        return FilesUnavailableError(
            f"files sink {ctx.sinkId}, batch {ctx.batchId}, partition {ctx.partitionId} "
            f"(attempt {ctx.attemptNumber}): the storage at {redact(txn.path)} did not "
            f"answer: {type(exc).__name__}: {redact(str(exc))}. Nothing of this task is "
            "visible; Spark retries the task, and a failed batch is written again when the "
            "query restarts. Each request waits at most botocore's "
            "connect_timeout and read_timeout (60 s each unless fs.config_kwargs sets "
            'them, e.g. {"read_timeout": 20}), retried by s3fs a few times.'
        )

    def _write(self, txn: FilesTransaction, batch: pa.RecordBatch) -> None:
        """Stream ``batch`` into the open part files; nothing becomes visible.

        Rows go to their partition directory's open writer, rolling to a new part file when
        ``maxRecordsPerFile`` would be exceeded (the batch is split). All batches of one
        transaction must share one schema. Raises ``ValueError`` for a schema the options
        cannot write (missing partition column, nested column in csv...).
        """
        if txn.state != "open":
            raise RuntimeError(f"files: write to a {txn.state} transaction {txn.staging}")
        if batch.num_rows == 0:
            return
        if self.settings.tableFiles:
            batch = inUtc(batch)
        if txn.schema is None:
            txn.dataColumns = checkWritable(batch.schema, self.settings)
            txn.schema = batch.schema
            txn.dataSchema = pa.schema(
                [batch.schema.field(i) for i in txn.dataColumns], metadata=batch.schema.metadata
            )
        elif not batch.schema.equals(txn.schema, check_metadata=False):
            raise ValueError(
                "files: the record batch schema changed within one transaction "
                f"({txn.schema} -> {batch.schema}); all rows of a task must share one schema"
            )
        if txn.multipart:
            recordFingerprint(txn.fingerprint, batch)
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

    def _openPart(self, txn: FilesTransaction, directory: str) -> OpenPart:
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
        staging = stagedFileName(txn.staging, txn.nextPart - 1)
        raw = cast(IO[bytes], self._upload(final)) if txn.multipart else self._create(staging)
        assert txn.dataSchema is not None
        s = self.settings
        try:
            writer = formatWriter(raw, txn.dataSchema, s.format, s.compression, s.header)
        except BaseException:
            raw.close()
            raise
        part = OpenPart(directory=directory, final=final, staging=staging, raw=raw, writer=writer)
        txn.openParts[directory] = part
        return part

    def _create(self, staging: str) -> IO[bytes]:
        """Open a staged file; the sink's staging directory is made only when missing, and
        the output directory once per process (readers find an empty output, not none)."""
        self.storage.makedirsOnce()
        try:
            return self.stagingStorage.create(staging)
        except FileNotFoundError:
            self.stagingStorage.makedirs(parentOf(staging))
            return self.stagingStorage.create(staging)

    def _upload(self, final: str) -> MultipartFile:
        """Start the multipart upload of a part file at its final key (S3 only)."""
        bucket, key = splitKey(self.storage.full(final))
        return MultipartFile(S3Calls(self.storage.fs), bucket, key, self.settings.partSize)

    def _closePart(self, txn: FilesTransaction, part: OpenPart) -> None:
        # Out of openParts only once closed: a part whose close fails (a full disk) stays there,
        # so abortTransaction still deletes its staged file or aborts its upload.
        if isinstance(part.raw, MultipartFile):
            raw = part.raw
            try:
                part.writer.close()
            finally:
                raw.close()
            del txn.openParts[part.directory]
            txn.uploads.append(
                UploadedFile(part.final, raw.uploadId, tuple(raw.partEtags), raw.size, part.rows)
            )
            return
        try:
            part.writer.close()
        finally:
            self.stagingStorage.close(part.raw)
        del txn.openParts[part.directory]
        txn.files.append(StagedFile(staging=part.staging, final=part.final, rows=part.rows))

    def _preCommit(self, txn: FilesTransaction) -> Handle:
        """Close every part file, fsync files and directories, return the handle.

        Nothing is visible yet. Calling it again returns the same handle (its format is in
        :mod:`twophase.sinks.files.handles`).
        """
        if txn.state == "prepared" and txn.handle is not None:
            return txn.handle
        if txn.state != "open":
            raise RuntimeError(f"files: preCommit of a {txn.state} transaction {txn.staging}")
        for part in list(txn.openParts.values()):
            self._closePart(txn, part)
        if txn.files:
            # The files' entries are in the sink's staging directory; its own entry and those
            # above it are synced once per process.
            sinkDir = parentOf(txn.staging)
            self.stagingStorage.syncDirs([sinkDir])
            self.stagingStorage.syncAncestorsOnce(sinkDir)
        if txn.multipart:
            fingerprint = txn.fingerprint.toText() if txn.uploads else None
            handle = multipartHandle(txn.ctx, txn.path, txn.staging, txn.uploads, fingerprint)
        else:
            handle = preparedHandle(txn.ctx, txn.path, txn.stagingPath, txn.staging, txn.files)
        txn.state = "prepared"
        txn.handle = handle
        log.debug(
            "files: prepared %s: %d file(s), %d row(s)",
            txn.ctx.transactionTag,
            len(txn.files),
            txn.rows,
        )
        return handle

    def abortTransaction(self, txn: FilesTransaction) -> None:
        """Executor, best effort: close writers and delete this attempt's staged files.

        Never raises; whatever it cannot delete is found later by ``recoverAndAbort``.
        """
        for part in list(txn.openParts.values()):
            try:
                part.writer.close()
            except Exception:  # best effort: the files are discarded anyway
                log.debug("files: closing %s during abort failed", part.staging, exc_info=True)
            try:
                if isinstance(part.raw, MultipartFile):
                    part.raw.discard()
                else:
                    part.raw.close()
            except Exception:  # best effort
                log.debug("files: closing %s during abort failed", part.staging, exc_info=True)
        uploads = list(txn.uploads)
        staged = [p.staging for p in txn.openParts.values()] + [f.staging for f in txn.files]
        txn.openParts.clear()
        txn.state = "aborted"
        try:
            for name in [] if txn.multipart else staged:
                self.stagingStorage.removeFile(name)
            calls = S3Calls(self.storage.fs) if uploads else None
            for upload in uploads:
                assert calls is not None
                bucket, key = splitKey(self.storage.full(upload.final))
                calls.abort(bucket, key, upload.uploadId)
        except Exception:  # best effort by contract
            log.warning(
                "files: could not delete staging %s of aborted %s; recoverAndAbort will",
                txn.staging,
                txn.ctx.transactionTag,
                exc_info=True,
            )


__all__ = ["FilesTransaction", "FilesWriter", "OpenPart", "checkWritable"]
