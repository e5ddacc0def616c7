"""What a table format's sink shares with the files sink: the driver's moves of staged files.

The Delta and Iceberg sinks write their data files as this sink's tasks do; their committers
move a handle's files into the table exactly as ``FilesCommitter.commit`` does (still
invisible: no table metadata names them), abort and sweep as it does, and make each batch
visible in one table commit of their own (``Committer.completeBatch``).
"""

from __future__ import annotations

from abc import abstractmethod

from twophase.protocol import Committer, Handle, RecoveryScope
from twophase.sinks.files.committer import FilesCommitter


class TableFilesCommitter(Committer):
    """A table sink's committer: the files sink's commit, abort and sweep, by delegation to
    :attr:`files`; subclasses add ``completeBatch``."""

    system = "table"
    """The table format's name, in descriptions of handles."""

    @property
    @abstractmethod
    def files(self) -> FilesCommitter:
        """The files sink's committer for the table's data files."""

    def commit(self, handle: Handle) -> None:
        self.files.commit(handle)

    def abort(self, handle: Handle) -> None:
        self.files.abort(handle)

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle] | None:
        return self.files.recoverAndAbort(scope)

    def describe(self, handle: Handle) -> str:
        return f"{self.system} {self.files.describe(handle)}"


__all__ = ["TableFilesCommitter"]
