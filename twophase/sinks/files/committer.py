"""The files sink's driver half: make staged files visible by rename, or delete them.

``commit`` renames each staged file to a final name that is a pure function of (sink, batch,
partition, part number, partition directory). Readers that skip ``_``-prefixed paths (Spark,
pyarrow datasets, pandas, DuckDB) see nothing until the rename, and a second ``commit`` finds
the final file without its staging file and does nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from twophase.protocol import Committer, Handle, RecoveryScope, TransactionLostError
from twophase.redaction import getLogger
from twophase.sinks.files.handles import KIND, abortedHandle, checkHandle, describeHandle
from twophase.sinks.files.layout import sinkStagingDir
from twophase.sinks.files.settings import FilesSettings
from twophase.sinks.files.storage import (
    Storage,
    Storages,
    ancestorsOf,
    parentOf,
    transientErrors,
)

log = getLogger(__name__)


class FilesCommitter(Committer):
    """Driver, any process, idempotent: rename staged files into place, or delete staging.

    - ``commit`` is idempotent and resumable: after a crash midway, calling it again renames
      what is left; a file found at its final name is done. A handle whose staged file and
      final file are both gone raises ``TransactionLostError``.
    - ``abort`` and ``recoverAndAbort`` only ever delete below
      ``<path>/_twophase/staging/<sinkTag>/``, never a committed file.
    - On the local filesystem the final directories are fsynced after the renames; on object
      stores a rename is copy + delete, so a final object still appears whole.

    Needs only the handle and the same settings (from ``sink.json`` plus credentials from the
    environment): no state of the writer.
    """

    def __init__(self, settings: FilesSettings) -> None:
        self.settings = settings
        self._storages = Storages(settings.storageOptions)

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> FilesCommitter:
        """Build from Spark-style string options (see :class:`FilesSettings`)."""
        return cls(FilesSettings.fromOptions(options))

    def __repr__(self) -> str:
        return f"FilesCommitter(path={self.settings.path!r})"

    @property
    def storage(self) -> Storage:
        """The output directory's filesystem, opened lazily once per process."""
        return self._storages.get(self.settings.path)

    def commit(self, handle: Handle) -> None:
        """Idempotent and resumable: rename every staged file to its final name.

        Per file: staged and not final -> rename (parents created); final and not staged ->
        already done; both (a copy-then-delete rename interrupted on an object store) ->
        delete the staged copy after checking sizes match; neither -> ``TransactionLostError``.
        Then the staging directory is removed. Transient filesystem errors raise
        ``TransientCommitError``; a retry continues where this call stopped.
        """
        h = checkHandle(handle)
        storage = self._storages.get(h["path"])
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
        """Idempotent: delete the handle's staging directory; never a final file."""
        h = checkHandle(handle)
        storage = self._storages.get(h["path"])
        with transientErrors(f"abort of {self.describe(h)}"):
            storage.invalidateCache()
            removed = storage.removeTree(h["staging"])
            storage.removeEmptyDir(parentOf(h["staging"]))
        log.debug("files: aborted %s (%s)", self.describe(h), "deleted" if removed else "gone")

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle]:
        """Idempotent: delete this sink's staging attempts that no kept handle names.

        Looks under ``<path>/_twophase/staging/<sinkTag>/`` (only ``<batchId>/`` when
        ``scope.batchId`` is set): one listing of the batches plus one per batch found, so it
        is cheap when there is nothing to do. Kept handles are matched by their ``staging``
        key. Empty batch directories are removed. Returns one brief handle per deleted attempt
        (same shape as a prepared handle, with ``files`` empty).
        """
        storage = self.storage
        root = sinkStagingDir(scope.sinkId)
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
                    aborted.append(abortedHandle(storage.url(), int(batch), staging, name))
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
        return describeHandle(handle)


def _dropCopiedStagingFile(storage: Storage, source: str, target: str, what: str) -> None:
    """Both copies exist: an earlier rename copied but did not delete. Drop the staged copy."""
    if storage.size(source) != storage.size(target):
        raise FileExistsError(
            f"files: {what}: final file {target!r} already exists with different content "
            f"than the staged {source!r}; another writer uses this output path and sink id"
        )
    storage.removeFile(source)


__all__ = ["FilesCommitter"]
