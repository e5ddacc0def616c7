"""What the filesystem holds for a files sink, for ``twophase doctor``: its staged attempts.

One listing of the sink's staging directory (``<stagingPath>/<sinkTag>/``, files of an attempt
grouped by their attempt name, aged by their modification time) and one of the earlier
layout's ``<path>/_twophase/staging/<sinkTag>/<batch>/<attempt>/``. Nothing is changed. What
recovery would do (``FilesCommitter.recoverAndAbort``) sets the ``Held`` flags: it deletes
attempts whose name carries a batch, so any other file in the sink's staging directory is
``foreign``.

On ``s3://`` it also lists the sink's incomplete multipart uploads below the output path
(``ListMultipartUploads``; a prepared task on S3 is one upload per file), keyed by upload id.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from twophase.doctor.findings import CannotCheck, Held, Inspection
from twophase.protocol import Handle
from twophase.redaction import redact
from twophase.sinks.files.handles import KIND, isMultipartHandle
from twophase.sinks.files.layout import (
    AttemptName,
    attemptOfStagedFile,
    legacySinkStagingDir,
    sinkStagingDir,
)
from twophase.sinks.files.multipart import sinkUploads
from twophase.sinks.files.s3 import isS3
from twophase.sinks.files.s3 import isTransient as s3IsTransient
from twophase.sinks.files.storage import Storage

if TYPE_CHECKING:
    from twophase.sinks.files.committer import FilesCommitter


def handleKey(handle: Handle) -> str | tuple[str, ...] | None:
    """What a logged handle names: its attempt (``staging``), or on S3 its upload ids."""
    if handle.get("kind") != KIND:
        return None
    if isMultipartHandle(handle):
        return tuple(str(f.get("uploadId")) for f in handle.get("files") or [])
    staging = handle.get("staging")
    return staging if isinstance(staging, str) else None


def inspect(committer: FilesCommitter, sinkId: str, now: datetime) -> Inspection:
    """Read-only: the sink's staged attempts, in the staging path and the earlier layout.

    Raises ``CannotCheck`` naming the path when the filesystem refuses the listing.
    """
    staging = committer.stagingStorage
    where = redact(staging.url())
    try:
        staging.invalidateCache()
        inspection = Inspection("files", f"staging {where}")
        inspection.held.extend(_current(staging, sinkStagingDir(sinkId)))
        output = committer.storage
        output.invalidateCache()
        inspection.held.extend(_legacy(output, legacySinkStagingDir(sinkId)))
        if isS3(output.fs):
            inspection.held.extend(_uploads(output, sinkId))
        return inspection
    except Exception as exc:
        if not isinstance(exc, OSError) and not s3IsTransient(exc):
            raise
        raise CannotCheck(
            f"files: cannot list the staging of sink {sinkId} at {where}: "
            f"{type(exc).__name__}: {redact(str(exc))}. Fix: check the path and the "
            "storage credentials (--sink-option or the environment)"
        ) from None


def _entries(storage: Storage, rel: str) -> list[dict[str, Any]]:
    try:
        return list(storage.fs.ls(storage.full(rel), detail=True))
    except FileNotFoundError:
        return []


def _name(entry: dict[str, Any]) -> str:
    return str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]


def _mtime(entry: dict[str, Any]) -> datetime | None:
    for key in ("mtime", "created", "LastModified", "last_modified", "updated"):
        value = entry.get(key)
        if isinstance(value, int | float):
            return datetime.fromtimestamp(float(value), UTC)
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
    return None


def _current(storage: Storage, root: str) -> list[Held]:
    attempts: dict[str, list[dict[str, Any]]] = {}
    held: list[Held] = []
    for entry in _entries(storage, root):
        name = _name(entry)
        attempt = attemptOfStagedFile(name) if entry.get("type") == "file" else None
        parsed = AttemptName.parse(attempt) if attempt is not None else None
        if attempt is None or parsed is None or parsed.batchId is None:
            held.append(
                Held(
                    system="files",
                    key=f"{root}/{name}",
                    what="unexpected entry",
                    since=_mtime(entry),
                    detail=f"in {storage.url()}",
                    foreign="it is not a file the sink stages, so recovery never deletes it",
                )
            )
            continue
        attempts.setdefault(attempt, []).append(entry)
    for attempt, entries in sorted(attempts.items()):
        parsed = AttemptName.parse(attempt)
        assert parsed is not None
        times = [t for t in (_mtime(e) for e in entries) if t is not None]
        size = sum(int(e.get("size") or 0) for e in entries)
        held.append(
            Held(
                system="files",
                key=f"{root}/{attempt}",
                what="staged files",
                batchId=parsed.batchId,
                partitionId=parsed.partitionId,
                since=min(times) if times else None,
                detail=f"{len(entries)} file(s), {size} bytes in {storage.url()}",
            )
        )
    return held


def _uploads(storage: Storage, sinkId: str) -> list[Held]:
    return [
        Held(
            system="files",
            key=upload.uploadId,
            what="multipart upload",
            batchId=upload.batchId,
            partitionId=upload.partitionId,
            since=_mtime({"created": upload.initiated}),
            detail=f"incomplete upload of {storage.url()}/{upload.rel}",
        )
        for upload in sinkUploads(storage, sinkId)
    ]


def _legacy(storage: Storage, root: str) -> list[Held]:
    held: list[Held] = []
    for batch in _entries(storage, root):
        batchName = _name(batch)
        if batch.get("type") != "directory" or not batchName.isdigit():
            continue
        for attempt in _entries(storage, f"{root}/{batchName}"):
            if attempt.get("type") != "directory":
                continue
            name = _name(attempt)
            parsed = AttemptName.parse(name)
            held.append(
                Held(
                    system="files",
                    key=f"{root}/{batchName}/{name}",
                    what="staged files (earlier layout)",
                    batchId=int(batchName),
                    partitionId=parsed.partitionId if parsed else None,
                    since=_mtime(attempt),
                    detail=f"in {storage.url()}",
                )
            )
    return held
