"""The Iceberg sink's driver half: the batch's files moved under the table, then one snapshot.

Each handle is a files sink handle: ``commit`` moves its staged Parquet files into the table's
``data`` directory (still invisible: no manifest names them), and ``completeBatch`` appends
every file of the batch in one catalog commit that also records the batch for this sink. A
retry of either after a crash finds its work done: a moved file at its final name, the batch
id in the table's properties.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import psycopg

from twophase.clients.postgres_answers import timedOut
from twophase.protocol import Handle, TransactionLostError, TransientCommitError
from twophase.redaction import getLogger, redact
from twophase.sinks.files import FilesCommitter
from twophase.sinks.files.handles import checkHandle
from twophase.sinks.files.tables import TableFilesCommitter
from twophase.sinks.iceberg.settings import IcebergSettings
from twophase.sinks.iceberg.table import (
    IcebergTableError,
    appendFiles,
    catalogOf,
    committedBatch,
    expireSnapshots,
    openTable,
    pyiceberg,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = getLogger(__name__)


class IcebergCommitter(TableFilesCommitter):
    """Driver, any process, idempotent: files under the table, then the batch as a snapshot.

    Aborts and the recovery sweep are the files sink's (staged files deleted, never a file the
    table names). Needs only the handles, the settings and the catalog.
    """

    system = "iceberg"

    def __init__(self, settings: IcebergSettings) -> None:
        self.settings = settings
        self._catalog: Catalog | None = None
        self._files: FilesCommitter | None = None
        self._location: str | None = None

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> IcebergCommitter:
        return cls(IcebergSettings.fromOptions(options))

    def __repr__(self) -> str:
        return f"IcebergCommitter(table={self.settings.table!r})"

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            with icebergErrors(
                f"the catalog of Iceberg table {self.settings.table}", self.settings
            ):
                self._catalog = catalogOf(self.settings)
        return self._catalog

    def table(self) -> Table:
        """The table as the catalog has it now; a missing table is an error that names it."""
        with icebergErrors(f"loading Iceberg table {self.settings.table}", self.settings):
            table = openTable(self.catalog, self.settings.table)
        if table is None:
            raise IcebergTableError(
                f"the Iceberg table {self.settings.table} is gone from its catalog, but this "
                "sink has batches to finish in it: restore the table (or its catalog entry) "
                "and restart the query"
            )
        return table

    @property
    def location(self) -> str:
        """The table's location: resolved by the driver before the batch, or read from the
        catalog once per committer (every handle's data files need it)."""
        if self._location is None:
            self._location = (self.settings.location or self.table().location()).rstrip("/")
        return self._location

    @property
    def files(self) -> FilesCommitter:
        """The files sink's committer for the table's data directory."""
        if self._files is None:
            self._files = FilesCommitter(self.settings.filesAt(self.location))
        return self._files

    def completeBatch(self, sinkId: str, batchId: int, handles: Sequence[Handle]) -> None:
        """One snapshot appending every file of the batch, unless the table already records
        the batch for this sink; an empty batch adds no snapshot."""
        paths = [path for handle in handles for path in self.dataFiles(handle)]
        if not paths:
            return
        what = f"the Iceberg commit of batch {batchId} to {self.settings.table}"
        with icebergErrors(what, self.settings):
            table = self.table()
            done = committedBatch(table, sinkId)
            if done is not None and done >= batchId:
                log.debug("iceberg: batch %d already in %s", batchId, self.settings.table)
                return
            try:
                table = appendFiles(table, sinkId, batchId, paths)
            except FileNotFoundError as exc:
                raise TransactionLostError(
                    f"a data file of decided batch {batchId} is gone from the Iceberg table "
                    f"{self.settings.table}'s data directory before its commit (an orphan "
                    f"file cleanup, or a deletion): exactly-once is broken for it ({exc})"
                ) from None
        log.info(
            "iceberg: committed batch %d to %s (%d files)", batchId, self.settings.table, len(paths)
        )
        keep = self.settings.retainSnapshots
        if keep and len(table.snapshots()) >= 2 * keep:
            self.expire(table, keep)

    def expire(self, table: Table, keep: int) -> None:
        """Best effort, after a batch's commit: a failure leaves the snapshots to the next
        batch's try, never fails the batch."""
        try:
            expired = expireSnapshots(table, keep)
        except Exception as exc:
            log.warning(
                "iceberg: expiring old snapshots of %s failed; the next batch tries again: %s",
                self.settings.table,
                redact(str(exc)),
            )
        else:
            log.info("iceberg: expired %d old snapshots of %s", expired, self.settings.table)

    def dataFiles(self, handle: Handle) -> list[str]:
        """The absolute paths of a committed handle's data files, as the table names them."""
        h = checkHandle(handle)
        return [f"{self.location}/data/{file['final']}" for file in h["files"]]


@contextmanager
def icebergErrors(what: str, settings: IcebergSettings | None = None) -> Iterator[None]:
    """A commit conflict, a catalog that cannot be reached or an I/O error as
    ``TransientCommitError`` (the retry reads the table again first); the rest as they are.
    ``settings``: the bounds a catalog on PostgreSQL waited for, named when one ran out."""
    module = pyiceberg()
    transient = (
        module.exceptions.CommitFailedException,
        module.exceptions.CommitStateUnknownException,
        module.exceptions.ServiceUnavailableError,
        module.exceptions.ServerError,
        OSError,
    )
    try:
        yield
    except transient as exc:
        raise TransientCommitError(redact(f"{what}: {exc}")) from exc
    except Exception as exc:
        bound = _boundThatRanOut(exc, settings)
        if bound:
            raise TransientCommitError(
                f"{what}: the catalog's database {bound} (a frozen, partitioned or overloaded "
                "server); the commit is retried, and a catalog that is only slow needs the "
                "option raised"
            ) from exc
        if _isConnectionError(exc):
            raise TransientCommitError(redact(f"{what}: {exc}")) from exc
        raise


def _boundThatRanOut(exc: BaseException, settings: IcebergSettings | None) -> str:
    """What ``exc`` waited for past its bound, as the option that bounds it; ``""`` if not."""
    if settings is None:
        return ""
    if timedOut(exc):
        return f"gave no answer within socketTimeout={settings.socketTimeout} s"
    if isinstance(getattr(exc, "orig", None), psycopg.errors.ConnectionTimeout):
        return f"took no connection within connectTimeout={settings.connectTimeout} s"
    return ""


def _isConnectionError(exc: BaseException) -> bool:
    """An SQL catalog's database or a REST catalog that did not answer."""
    try:
        import sqlalchemy.exc
    except ImportError:  # pragma: no cover - the sql catalog needs it
        return False
    return isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError)


__all__ = ["IcebergCommitter"]
