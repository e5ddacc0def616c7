"""What a files sink has prepared and not finished: staged attempts, earlier-layout directories
and, on S3, incomplete multipart uploads, listed for the sweep and for ``twophase doctor``.

Each is a ``Prepared`` named as a logged handle names it: an attempt by its ``staging`` path
(``<sinkTag>/<attempt>`` in the staging path, ``_twophase/staging/<sinkTag>/<batch>/<attempt>``
in the output path of the earlier layout), an upload by its upload id. Any other entry of the
sink's staging directory is listed as foreign: the sweep never deletes it.
"""

from __future__ import annotations

from typing import Any

from twophase.coordinator.storage import modifiedAt
from twophase.protocol import Handle, Prepared
from twophase.sinks.files.handles import KIND, abortedHandle, isMultipartHandle
from twophase.sinks.files.layout import AttemptName, attemptOfStagedFile
from twophase.sinks.files.multipart import Multipart, sinkUploads, sweptHandle
from twophase.sinks.files.storage import Storage

STAGED = "staged files"
LEGACY = "staged files (earlier layout)"
UPLOAD = "multipart upload"
"""What each kind of leftover is (``Prepared.what``), which also tells how to abort it."""


def preparedNames(handle: Handle) -> tuple[str, ...]:
    """What a logged handle names: its attempt (``staging``), or on S3 its upload ids."""
    if handle.get("kind") != KIND:
        return ()
    if isMultipartHandle(handle):
        return tuple(str(f.get("uploadId")) for f in handle.get("files") or [])
    staging = handle.get("staging")
    return (staging,) if isinstance(staging, str) else ()


def stagedAttempts(
    storage: Storage, root: str, batchId: int | None, outputUrl: str
) -> list[Prepared]:
    """The attempts staged in ``root`` (of ``batchId`` only, when set), each with its files;
    with ``batchId`` unset also every other entry there, as foreign."""
    attempts: dict[str, list[dict[str, Any]]] = {}
    found: list[Prepared] = []
    for entry in _entries(storage, root):
        name = _name(entry)
        attempt = attemptOfStagedFile(name) if entry.get("type") == "file" else None
        parsed = AttemptName.parse(attempt) if attempt is not None else None
        if attempt is None or parsed is None or parsed.batchId is None:
            if batchId is None:
                found.append(_unexpected(storage, f"{root}/{name}", entry))
            continue
        if batchId is None or parsed.batchId == batchId:
            attempts.setdefault(attempt, []).append(entry)
    for attempt, entries in sorted(attempts.items()):
        parsed = AttemptName.parse(attempt)
        assert parsed is not None and parsed.batchId is not None
        staging = f"{root}/{attempt}"
        times = [t for t in (modifiedAt(e) for e in entries) if t is not None]
        size = sum(int(e.get("size") or 0) for e in entries)
        found.append(
            Prepared(
                staging,
                abortedHandle(outputUrl, storage.url(), parsed.batchId, staging, attempt),
                what=STAGED,
                batchId=parsed.batchId,
                partitionId=parsed.partitionId,
                since=min(times) if times else None,
                detail=f"{len(entries)} file(s), {size} bytes in {storage.url()}",
                parts=tuple(sorted(f"{root}/{_name(e)}" for e in entries)),
            )
        )
    return found


def legacyAttempts(storage: Storage, root: str) -> list[Prepared]:
    """The earlier layout's attempt directories ``root/<batch>/<attempt>`` in the output."""
    found: list[Prepared] = []
    for batch in _entries(storage, root):
        batchName = _name(batch)
        if batch.get("type") != "directory" or not batchName.isdigit():
            continue
        for attempt in _entries(storage, f"{root}/{batchName}"):
            if attempt.get("type") != "directory":
                continue
            name = _name(attempt)
            parsed = AttemptName.parse(name)
            staging = f"{root}/{batchName}/{name}"
            found.append(
                Prepared(
                    staging,
                    abortedHandle(storage.url(), None, int(batchName), staging, name),
                    what=LEGACY,
                    batchId=int(batchName),
                    partitionId=parsed.partitionId if parsed else None,
                    since=modifiedAt(attempt),
                    detail=f"in {storage.url()}",
                )
            )
    return found


def pendingUploads(storage: Storage, sinkId: str, batchId: int | None) -> list[Prepared]:
    """The sink's incomplete multipart uploads below the output path (of ``batchId`` only,
    when set)."""
    return [
        Prepared(
            upload.uploadId,
            sweptHandle(storage, upload),
            what=UPLOAD,
            batchId=upload.batchId,
            partitionId=upload.partitionId,
            since=modifiedAt({"created": upload.initiated}),
            detail=f"incomplete upload of {storage.url()}/{upload.rel}",
            parts=(upload.rel,),
        )
        for upload in sinkUploads(storage, sinkId)
        if batchId is None or upload.batchId == batchId
    ]


def abortLeftover(item: Prepared, staging: Storage, output: Storage) -> None:
    """Delete one listed attempt's staged files or directory, or abort one upload."""
    if item.what == STAGED:
        for rel in item.parts:
            staging.removeFile(rel)
    elif item.what == LEGACY:
        output.removeTree(item.name)
    elif item.what == UPLOAD:
        Multipart(output).abortUpload(item.parts[0], item.name)
    else:
        raise ValueError(f"files: not a leftover the sweep aborts: {item.what} {item.name}")


def _unexpected(storage: Storage, rel: str, entry: dict[str, Any]) -> Prepared:
    return Prepared(
        rel,
        {"kind": KIND, "staging": rel, "files": []},
        what="unexpected entry",
        since=modifiedAt(entry),
        detail=f"in {storage.url()}",
        foreign="it is not a file the sink stages, so recovery never deletes it",
    )


def _entries(storage: Storage, rel: str) -> list[dict[str, Any]]:
    try:
        return list(storage.fs.ls(storage.full(rel), detail=True))
    except FileNotFoundError:
        return []


def _name(entry: dict[str, Any]) -> str:
    return str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]


__all__ = [
    "LEGACY",
    "STAGED",
    "UPLOAD",
    "abortLeftover",
    "legacyAttempts",
    "pendingUploads",
    "preparedNames",
    "stagedAttempts",
]
