"""The Delta sink's driver half: the batch's files moved into the table, then one log commit.

Each handle is a files sink handle: ``commit`` moves its staged Parquet files into the table's
directory (still invisible: no log entry names them), and ``completeBatch`` adds every file of
the batch in one Delta commit that records the batch for this sink. A retry of either after a
crash finds its work done: a moved file at its final name, the batch id in the table's
application transaction.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from twophase.protocol import Handle, TransactionLostError, TransientCommitError
from twophase.redaction import getLogger, redact
from twophase.sinks.delta.settings import DeltaSettings
from twophase.sinks.delta.table import (
    DataFile,
    DeltaTableError,
    commitFiles,
    committedVersion,
    deltalake,
    openTable,
)
from twophase.sinks.files import FilesCommitter
from twophase.sinks.files.handles import checkHandle, isMultipartHandle
from twophase.sinks.files.partitioning import partitionValuesOf
from twophase.sinks.files.tables import TableFilesCommitter

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = getLogger(__name__)


class DeltaCommitter(TableFilesCommitter):
    """Driver, any process, idempotent: files into the table, then the batch into its log.

    Aborts and the recovery sweep are the files sink's (staged files deleted, never a file in
    the table). Needs only the handles and the settings.
    """

    system = "delta"

    def __init__(self, settings: DeltaSettings) -> None:
        self.settings = settings
        self._files = FilesCommitter(settings.files)
        self._table: DeltaTable | None = None

    @property
    def files(self) -> FilesCommitter:
        return self._files

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> DeltaCommitter:
        return cls(DeltaSettings.fromOptions(options))

    def __repr__(self) -> str:
        return f"DeltaCommitter(path={self.settings.path!r})"

    def completeBatch(self, sinkId: str, batchId: int, handles: Sequence[Handle]) -> None:
        """One Delta commit adding every file of the batch, unless the table already records
        the batch for this sink; an empty batch adds no commit."""
        files = [file for handle in handles for file in self.dataFiles(handle)]
        if not files:
            return
        with deltaErrors(f"the Delta commit of batch {batchId} to {self.settings.path}"):
            table = self.latestTable()
            if table is None:
                raise DeltaTableError(
                    f"the Delta table at {self.settings.path} is gone, but batch {batchId} is "
                    "decided and its files are in its directory: restore the table (its "
                    "_delta_log) and restart the query"
                )
            done = committedVersion(table, sinkId)
            if done is not None and done >= batchId:
                log.debug("delta: batch %d already in %s", batchId, self.settings.path)
                return
            commitFiles(table, sinkId, batchId, files)
        log.info(
            "delta: committed batch %d to %s (%d files, %d rows)",
            batchId,
            self.settings.path,
            len(files),
            sum(f.rows for f in files),
        )

    def latestTable(self) -> DeltaTable | None:
        """The table at its latest version: opened once per committer, then brought up to date
        from the commits since (not read again from its last checkpoint at every batch)."""
        if self._table is None:
            self._table = openTable(self.settings.tableUri, self.settings.storage)
        else:
            try:
                self._table.update_incremental()
            except Exception:
                self._table = None  # gone, or replaced: open it afresh
                return self.latestTable()
        return self._table

    def dataFiles(self, handle: Handle) -> list[DataFile]:
        """The data files of a committed handle, as the table's log names them."""
        h = checkHandle(handle)
        if isMultipartHandle(h):  # completed uploads: their sizes are in the handle
            now = int(time.time() * 1000)
            return [
                DataFile(
                    str(f["final"]),
                    int(f["bytes"]),
                    partitionValuesOf(str(f["final"])),
                    now,
                    int(f["rows"]),
                )
                for f in h["files"]
            ]
        storage = self.files.storage
        found = []
        for file in h["files"]:
            final = str(file["final"])
            try:
                stat = os.stat(storage.full(final))
            except FileNotFoundError:
                raise TransactionLostError(
                    f"data file {final} of decided batch {h.get('batchId')} is gone from the "
                    f"Delta table's directory {self.settings.path} before its commit (a vacuum "
                    "with a retention of zero, or a deletion): exactly-once is broken for it"
                ) from None
            found.append(
                DataFile(
                    path=final,
                    size=stat.st_size,
                    partitionValues=partitionValuesOf(final),
                    modificationTime=int(stat.st_mtime * 1000),
                    rows=int(file["rows"]),
                )
            )
        return found


@contextmanager
def deltaErrors(what: str) -> Iterator[None]:
    """A commit conflict or an I/O error of delta-rs as ``TransientCommitError`` (the retry
    checks the table again first); the rest as they are."""
    module = deltalake()
    try:
        yield
    except (module.exceptions.CommitFailedError, OSError) as exc:
        raise TransientCommitError(redact(f"{what}: {exc}")) from exc


__all__ = ["DeltaCommitter"]
