"""The files sink's handles: what a prepared task leaves in the decision log, built and checked.

A handle names the output path, the staging path, the attempt (``<sinkTag>/<attempt name>``,
relative to the staging path, the prefix of its staged files) and each staged file (relative
to the staging path) with its final name (relative to the output path) and row count::

    {"kind": "files", "path": <output path URL>, "stagingPath": <staging path URL>,
     "batchId": N, "partitionId": p, "attempt": a, "staging": <sinkTag>/<attempt name>,
     "files": [{"staging": <sinkTag>/<attempt name>-f0000.staged, "final": <relative>,
                "rows": n}, ...]}

On ``s3://`` the handle says ``"commit": "multipart"`` and, instead of staged files, lists
each part file's final name with its multipart upload id, part ETags, bytes and rows, plus the
task's record ``fingerprint`` (the uploads themselves: :mod:`twophase.sinks.files.multipart`);
bucket and key are the output path's joined with the final name.

A handle without ``stagingPath`` was written by an earlier release: ``staging`` is a directory
relative to the output path below ``_twophase/staging/`` that holds its files; it still
commits.

It holds no option value and no storage credential: the committer takes those from its own
settings. Before a committer touches a file, :func:`checkHandle` refuses any handle whose
paths would reach outside the staging area or the output directory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from twophase.coordinator.formats import checkHandleVersion
from twophase.protocol import Handle, TransactionContext
from twophase.sinks.files.layout import LEGACY_ROOT, LEGACY_STAGING_ROOT, AttemptName

KIND = "files"
"""The ``kind`` of every files handle."""

COMMIT = "multipart"
"""The ``commit`` value of a files handle prepared as multipart uploads."""


@dataclass(frozen=True)
class StagedFile:
    """One closed part file of a transaction: where it is staged, where it will go, its rows."""

    staging: str
    final: str
    rows: int

    def toJson(self) -> dict[str, Any]:
        return {"staging": self.staging, "final": self.final, "rows": self.rows}


@dataclass(frozen=True)
class UploadedFile:
    """One prepared part file: its final name, upload id, part ETags, bytes and rows."""

    final: str
    uploadId: str
    parts: tuple[str, ...]
    size: int
    rows: int

    def toJson(self) -> dict[str, Any]:
        return {
            "final": self.final,
            "uploadId": self.uploadId,
            "parts": list(self.parts),
            "bytes": self.size,
            "rows": self.rows,
        }


def preparedHandle(
    ctx: TransactionContext,
    path: str,
    stagingPath: str,
    staging: str,
    files: Sequence[StagedFile],
) -> Handle:
    """The handle of a prepared attempt: everything ``commit`` needs, in any process."""
    return {
        "kind": KIND,
        "path": path,
        "stagingPath": stagingPath,
        "batchId": ctx.batchId,
        "partitionId": ctx.partitionId,
        "attempt": ctx.attemptNumber,
        "staging": staging,
        "files": [f.toJson() for f in files],
    }


def abortedHandle(
    path: str, stagingPath: str | None, batchId: int, staging: str, attemptName: str
) -> Handle:
    """A brief handle for a staging attempt ``recoverAndAbort`` deleted (``files`` empty).

    ``stagingPath`` is ``None`` for an attempt of the earlier layout inside the output path.
    """
    handle: Handle = {"kind": KIND, "path": path, "batchId": batchId, "staging": staging}
    if stagingPath is not None:
        handle["stagingPath"] = stagingPath
    attempt = AttemptName.parse(attemptName)
    if attempt is not None and (stagingPath is None or attempt.batchId == batchId):
        handle["partitionId"] = attempt.partitionId
        handle["attempt"] = attempt.attemptNumber
    handle["files"] = []
    return handle


def multipartHandle(
    ctx: TransactionContext,
    path: str,
    staging: str,
    files: Sequence[UploadedFile],
    fingerprint: str | None,
) -> Handle:
    """The handle of an attempt prepared as multipart uploads (bucket and key: ``path`` +
    ``final``). It holds no credential."""
    handle: Handle = {
        "kind": KIND,
        "commit": COMMIT,
        "path": path,
        "batchId": ctx.batchId,
        "partitionId": ctx.partitionId,
        "attempt": ctx.attemptNumber,
        "staging": staging,
        "files": [f.toJson() for f in files],
    }
    if fingerprint is not None:
        handle["fingerprint"] = fingerprint
    return handle


def isMultipartHandle(handle: Handle) -> bool:
    return handle.get("commit") == COMMIT


def checkMultipartHandle(handle: Handle) -> Handle:
    """Refuse a malformed multipart handle before any call (keys stay below ``path``)."""
    if not isinstance(handle.get("path"), str) or not str(handle["path"]).startswith(
        ("s3://", "s3a://")
    ):
        raise ValueError(f"files multipart handle has no s3:// path: {handle!r}")
    checkFileEntries(
        handle,
        lambda entry: bool(
            isSafeRelative(entry.get("final"))
            and isinstance(entry.get("uploadId"), str)
            and entry["uploadId"]
            and isinstance(entry.get("parts"), list)
            and entry["parts"]
            and all(isinstance(p, str) and p for p in entry["parts"])
        ),
        "files multipart handle",
    )
    return handle


def isSafeRelative(rel: Any) -> bool:
    """True for a non-empty relative path without ``..``, a leading ``/`` or a URL scheme."""
    return (
        isinstance(rel, str)
        and bool(rel)
        and not rel.startswith("/")
        and "://" not in rel
        and ".." not in rel.split("/")
    )


def stagingBase(handle: Handle) -> str:
    """The URL the handle's staging paths are relative to (the output path for old handles)."""
    return str(handle.get("stagingPath") or handle["path"])


def checkHandle(handle: Handle) -> Handle:
    """Refuse anything that is not a well-formed files handle before touching a file."""
    if handle.get("kind") != KIND:
        raise ValueError(f"not a files handle (kind={handle.get('kind')!r}): {handle!r}")
    checkHandleVersion(handle, KIND)
    if handle.get("commit") is not None:
        if not isMultipartHandle(handle):
            raise ValueError(f"files handle has an unknown commit {handle.get('commit')!r}")
        return checkMultipartHandle(handle)
    staging = handle.get("staging")
    if "stagingPath" in handle:
        base = handle["stagingPath"]
        if not isinstance(base, str) or not base:
            raise ValueError(f"files handle has a bad stagingPath: {handle!r}")
        # <sinkTag>/<attempt name>; its files are <sinkTag>/<attempt name>-f<part>.staged
        shaped = isSafeRelative(staging) and len(str(staging).split("/")) == 2
        prefix = f"{staging}-f"
    else:
        shaped = isSafeRelative(staging) and str(staging).startswith(LEGACY_STAGING_ROOT + "/")
        prefix = f"{staging}/"
    if not shaped:
        raise ValueError(f"files handle has a bad staging directory {staging!r}")
    if not isinstance(handle.get("path"), str) or not handle["path"]:
        raise ValueError(f"files handle has no path: {handle!r}")
    checkFileEntries(
        handle,
        lambda entry: (
            isSafeRelative(entry.get("staging"))
            and str(entry["staging"]).startswith(prefix)
            and isSafeRelative(entry.get("final"))
            and not str(entry["final"]).startswith(LEGACY_ROOT + "/")
        ),
        "files handle",
    )
    return handle


def checkFileEntries(
    handle: Handle, wellFormed: Callable[[dict[str, Any]], bool], what: str
) -> None:
    """Refuse a handle whose ``files`` is not a list of entries ``wellFormed`` accepts."""
    files = handle.get("files")
    if not isinstance(files, list):
        raise ValueError(f"files handle has no file list: {handle!r}")
    for entry in files:
        if not (isinstance(entry, dict) and wellFormed(entry)):
            raise ValueError(f"{what} has a bad file entry {entry!r}")


def stagedFiles(handle: Handle) -> Iterable[StagedFile]:
    """The files of a handle as :class:`StagedFile` values (for tools and tests)."""
    for entry in checkHandle(handle)["files"]:
        yield StagedFile(staging=entry["staging"], final=entry["final"], rows=int(entry["rows"]))


def describeHandle(handle: Handle) -> str:
    """``files batch N partition p attempt a: k file(s), r row(s) at <path>``."""
    files = handle.get("files") or []
    rows = sum(int(f.get("rows", 0)) for f in files)
    return (
        f"files batch {handle.get('batchId')} partition {handle.get('partitionId')} "
        f"attempt {handle.get('attempt')}: {len(files)} file(s), {rows} row(s) at "
        f"{handle.get('path')}"
    )


__all__ = [
    "COMMIT",
    "KIND",
    "StagedFile",
    "UploadedFile",
    "abortedHandle",
    "checkFileEntries",
    "checkHandle",
    "checkMultipartHandle",
    "describeHandle",
    "isMultipartHandle",
    "isSafeRelative",
    "multipartHandle",
    "preparedHandle",
    "stagedFiles",
    "stagingBase",
]
