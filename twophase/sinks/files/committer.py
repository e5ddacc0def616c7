"""The files sink's driver half: make staged files visible by rename, or delete them.

``commit`` renames each staged file from the staging path (outside the output path, see
:mod:`twophase.sinks.files.layout`) to a final name that is a pure function of (sink, batch,
partition, part number, partition directory). No reader of the output path (Spark, pyarrow,
pandas, DuckDB and polars globs included) sees a row before the rename, and a second
``commit`` finds the final file without its staging file and does nothing.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping

from twophase.protocol import Committer, Handle, Prepared, RecoveryScope, TransactionLostError
from twophase.redaction import getLogger
from twophase.sinks.files.handles import (
    checkHandle,
    describeHandle,
    isMultipartHandle,
    stagingBase,
)
from twophase.sinks.files.layout import (
    LEGACY_ROOT,
    LEGACY_STAGING_ROOT,
    legacySinkStagingDir,
    sinkStagingDir,
)
from twophase.sinks.files.leftovers import (
    abortLeftover,
    legacyAttempts,
    pendingUploads,
    preparedNames,
    stagedAttempts,
)
from twophase.sinks.files.multipart import Multipart
from twophase.sinks.files.s3 import isS3
from twophase.sinks.files.settings import FilesSettings
from twophase.sinks.files.storage import (
    Storage,
    Storages,
    ancestorsOf,
    checkStagingArea,
    parentOf,
    transientErrors,
)

log = getLogger(__name__)


class FilesCommitter(Committer):
    """Driver, any process, idempotent: rename staged files into place, or delete staging.

    - ``commit`` is idempotent and resumable: after a crash midway, calling it again renames
      what is left; a file found at its final name is done. A handle whose staged file and
      final file are both gone raises ``TransactionLostError``.
    - ``abort`` and ``recoverAndAbort`` only ever delete below ``<stagingPath>/<sinkTag>/``
      (and ``<path>/_twophase/staging/<sinkTag>/`` of the earlier layout), never a committed
      file.
    - On the local filesystem the final directories are fsynced after the renames; on object
      stores a rename is copy + delete, so a final object still appears whole.
    - On ``s3://`` handles are multipart uploads (:mod:`twophase.sinks.files.multipart`):
      ``commit`` completes them, ``abort`` aborts them, recovery sweeps the sink's incomplete
      uploads below the output path (``ListMultipartUploads``), and an upload a lifecycle
      rule aborted after the decision is written again from the replay (``fingerprint``).

    Needs only the handle and the same settings (from ``sink.json`` plus credentials from the
    environment): no state of the writer.
    """

    def __init__(self, settings: FilesSettings) -> None:
        self.settings = settings
        self._stagingPath = settings.staging
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

    @property
    def stagingStorage(self) -> Storage:
        """The staging path's filesystem, opened lazily once per process."""
        return self._storages.get(self._stagingPath)

    def checkStagingArea(self) -> None:
        """Driver, before tasks write: ``ValueError`` if the commit cannot rename staged files.

        Once per process (see :func:`twophase.sinks.files.storage.checkStagingArea`).
        """
        checkStagingArea(self.storage, self.stagingStorage)

    def commit(self, handle: Handle) -> None:
        """Idempotent and resumable: rename every staged file to its final name.

        Per file: staged and not final -> rename (parents created); final and not staged ->
        already done; both (a copy-then-delete rename interrupted on an object store) ->
        delete the staged copy after checking sizes match; neither -> ``TransactionLostError``.
        The final directories (of files renamed by an earlier call too) are synced before it
        returns. (A handle of the earlier layout then has its staging directory removed.)
        Transient filesystem errors raise ``TransientCommitError``; a retry continues where
        this call stopped.
        """
        h = checkHandle(handle)
        if isMultipartHandle(h):
            with transientErrors(f"commit of {self.describe(h)}"):
                Multipart(self._storages.get(h["path"])).commit(h, self.describe(h))
            log.debug("files: committed %s", self.describe(h))
            return
        storage = self._storages.get(h["path"])
        stagingStore = self._storages.get(stagingBase(h))
        legacy = "stagingPath" not in h
        what = f"commit of {self.describe(h)}"
        with transientErrors(what):
            stagingStore.invalidateCache()
            storage.invalidateCache()
            staged = stagingStore.listFiles(h["staging"]) if legacy else None
            touched: set[str] = set()
            madeDirs: set[str] = set()
            for entry in h["files"]:
                source, target = entry["staging"], entry["final"]
                if source in staged if staged is not None else stagingStore.exists(source):
                    if storage.exists(target):
                        _dropCopiedStagingFile(stagingStore, storage, source, target, what)
                    else:
                        parent = parentOf(target)
                        if parent not in madeDirs:
                            storage.makedirs(parent)
                            madeDirs.add(parent)
                        _rename(stagingStore, source, storage, target, what)
                    touched.update(ancestorsOf(target))
                elif storage.exists(target):
                    # Renamed by an earlier call that may have stopped before syncing.
                    touched.update(ancestorsOf(target))
                else:
                    raise TransactionLostError(
                        f"files: {what}: neither the staged file {source!r} nor the final file "
                        f"{target!r} exists under {h['path']!r}; the batch's output for this "
                        "task is lost (was the staging area deleted by hand?)"
                    )
            storage.syncDirs(touched)
            if touched:
                storage.syncAncestorsOnce()
            if legacy:  # the earlier layout: a directory per attempt, one per batch
                stagingStore.removeTree(h["staging"])
                stagingStore.removeEmptyDir(parentOf(h["staging"]))
        log.debug("files: committed %s", self.describe(h))

    def abort(self, handle: Handle) -> None:
        """Idempotent: delete the handle's staged files; never a final file."""
        h = checkHandle(handle)
        if isMultipartHandle(h):
            with transientErrors(f"abort of {self.describe(h)}"):
                removed = Multipart(self._storages.get(h["path"])).abort(h)
            log.debug("files: aborted %s (%s)", self.describe(h), "aborted" if removed else "gone")
            return
        stagingStore = self._storages.get(stagingBase(h))
        with transientErrors(f"abort of {self.describe(h)}"):
            stagingStore.invalidateCache()
            if "stagingPath" in h:
                removed = sum(stagingStore.removeFile(f["staging"]) for f in h["files"]) > 0
            else:  # the earlier layout: a directory per attempt, one per batch
                removed = stagingStore.removeTree(h["staging"])
                stagingStore.removeEmptyDir(parentOf(h["staging"]))
        log.debug("files: aborted %s (%s)", self.describe(h), "deleted" if removed else "gone")

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle]:
        """Idempotent: the framework's sweep of this sink's staging attempts and uploads that
        no kept handle names (``listPrepared``, ``abortPrepared``).

        A full sweep (``batchId`` unset) first checks that the staging path can be used
        (``ValueError`` otherwise), and after it removes the earlier layout's emptied
        directories, ``<path>/_twophase`` included, so nothing an earlier release staged stays
        visible. Returns one brief handle per deleted attempt or aborted upload (same shape as
        a prepared handle, with ``files`` empty).
        """
        storage = self.storage
        with transientErrors(f"recoverAndAbort of files sink {scope.sinkId} at {storage.url()}"):
            if scope.batchId is None:
                self.checkStagingArea()
            aborted = list(super().recoverAndAbort(scope) or ())
            if scope.batchId is None:
                legacy = legacySinkStagingDir(scope.sinkId)
                for batch in [n for n in storage.listDirNames(legacy) if n.isdigit()]:
                    storage.removeEmptyDir(f"{legacy}/{batch}")
                for directory in (legacy, LEGACY_STAGING_ROOT, LEGACY_ROOT):
                    storage.removeEmptyDir(directory)
        return aborted

    def preparedNames(self, handle: Handle) -> tuple[str, ...]:
        """What a handle names: its attempt (``staging``), or on S3 its upload ids."""
        return preparedNames(handle)

    def listPrepared(self, scope: RecoveryScope) -> list[Prepared]:
        """Read-only: the sink's staged attempts in ``<stagingPath>/<sinkTag>/`` (of
        ``scope.batchId`` only, when set: one listing, cheap when there is nothing), and for
        a full listing the earlier layout's ``<path>/_twophase/staging/<sinkTag>/``; on S3 also
        the sink's incomplete multipart uploads below the output path."""
        storage, stagingStore = self.storage, self.stagingStorage
        with transientErrors(f"listing of files sink {scope.sinkId} at {storage.url()}"):
            stagingStore.invalidateCache()
            found = stagedAttempts(
                stagingStore, sinkStagingDir(scope.sinkId), scope.batchId, storage.url()
            )
            if scope.batchId is None:
                storage.invalidateCache()
                found += legacyAttempts(storage, legacySinkStagingDir(scope.sinkId))
            if isS3(storage.fs):
                found += pendingUploads(storage, scope.sinkId, scope.batchId)
        return found

    def abortPrepared(self, item: Prepared) -> None:
        """Idempotent: delete a listed attempt's staged files (or its directory, of the earlier
        layout), or abort a listed upload; never a final file."""
        with transientErrors(f"recoverAndAbort of {item.name}"):
            abortLeftover(item, self.stagingStorage, self.storage)

    def fingerprint(self, handle: Handle) -> str | None:
        """The records' fingerprint of a multipart handle: an upload a bucket lifecycle rule
        aborted after the decision is written again from the replay. ``None`` for the rename
        path, whose staged files nothing deletes on its own."""
        value = handle.get("fingerprint") if isMultipartHandle(handle) else None
        return value if isinstance(value, str) else None

    def commitReplacement(self, original: Handle, replacement: Handle) -> None:
        """Commit the replay's files for a lost partition; on S3 then delete what the lost
        original did complete under a name the replay did not write (no row twice)."""
        self.commit(replacement)
        if isMultipartHandle(original) and isMultipartHandle(replacement):
            h = checkHandle(original)
            with transientErrors(f"commit of the replacement of {self.describe(h)}"):
                Multipart(self._storages.get(h["path"])).dropReplaced(h, replacement)

    def describe(self, handle: Handle) -> str:
        """``files batch N partition p attempt a: k file(s), r row(s) at <path>``."""
        return describeHandle(handle)


def _rename(source: Storage, src: str, target: Storage, dst: str, what: str) -> None:
    """Rename a staged file into the output; a cross-device rename names the fix."""
    try:
        source.move(src, dst, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        raise OSError(
            errno.EXDEV,
            f"files: {what}: cannot rename {source.url()}/{src} into {target.url()}: the "
            "staging path is on another filesystem; move it back where the handle names it "
            "(its stagingPath) on the output's filesystem and commit again",
        ) from exc


def _dropCopiedStagingFile(
    stagingStore: Storage, storage: Storage, source: str, target: str, what: str
) -> None:
    """Both copies exist: an earlier rename copied but did not delete. Drop the staged copy."""
    if stagingStore.size(source) != storage.size(target):
        raise FileExistsError(
            f"files: {what}: final file {target!r} already exists with different content "
            f"than the staged {source!r}; another writer uses this output path and sink id"
        )
    stagingStore.removeFile(source)


__all__ = ["FilesCommitter"]
