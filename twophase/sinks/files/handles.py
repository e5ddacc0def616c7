"""The files sink's handles: what a prepared task leaves in the decision log, built and checked.

A handle names the output path, the attempt's staging directory (relative to the path) and
each staged file with its final name and row count::

    {"kind": "files", "path": <output path URL>, "batchId": N, "partitionId": p,
     "attempt": a, "staging": <staging dir, relative to path>,
     "files": [{"staging": <relative>, "final": <relative>, "rows": n}, ...]}

It holds no option value and no storage credential: the committer takes those from its own
settings. Before a committer touches a file, :func:`checkHandle` refuses any handle whose
paths would reach outside the staging area or the output directory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from twophase.protocol import Handle, TransactionContext
from twophase.sinks.files.layout import STAGING_ROOT, AttemptDir

KIND = "files"
"""The ``kind`` of every files handle."""


@dataclass(frozen=True)
class StagedFile:
    """One closed part file of a transaction: where it is staged, where it will go, its rows."""

    staging: str
    final: str
    rows: int

    def toJson(self) -> dict[str, Any]:
        return {"staging": self.staging, "final": self.final, "rows": self.rows}


def preparedHandle(
    ctx: TransactionContext, path: str, staging: str, files: Sequence[StagedFile]
) -> Handle:
    """The handle of a prepared attempt: everything ``commit`` needs, in any process."""
    return {
        "kind": KIND,
        "path": path,
        "batchId": ctx.batchId,
        "partitionId": ctx.partitionId,
        "attempt": ctx.attemptNumber,
        "staging": staging,
        "files": [f.toJson() for f in files],
    }


def abortedHandle(path: str, batchId: int, staging: str, attemptDirName: str) -> Handle:
    """A brief handle for a staging attempt ``recoverAndAbort`` deleted (``files`` empty)."""
    handle: Handle = {"kind": KIND, "path": path, "batchId": batchId, "staging": staging}
    attempt = AttemptDir.parse(attemptDirName)
    if attempt is not None:
        handle["partitionId"] = attempt.partitionId
        handle["attempt"] = attempt.attemptNumber
    handle["files"] = []
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


def checkHandle(handle: Handle) -> Handle:
    """Refuse anything that is not a well-formed files handle before touching a file."""
    if handle.get("kind") != KIND:
        raise ValueError(f"not a files handle (kind={handle.get('kind')!r}): {handle!r}")
    staging = handle.get("staging")
    if not (isSafeRelative(staging) and str(staging).startswith(STAGING_ROOT + "/")):
        raise ValueError(f"files handle has a bad staging directory {staging!r}")
    if not isinstance(handle.get("path"), str) or not handle["path"]:
        raise ValueError(f"files handle has no path: {handle!r}")
    files = handle.get("files")
    if not isinstance(files, list):
        raise ValueError(f"files handle has no file list: {handle!r}")
    for entry in files:
        if not (
            isinstance(entry, dict)
            and isSafeRelative(entry.get("staging"))
            and str(entry["staging"]).startswith(str(staging) + "/")
            and isSafeRelative(entry.get("final"))
            and not str(entry["final"]).startswith(STAGING_ROOT.split("/")[0] + "/")
        ):
            raise ValueError(f"files handle has a bad file entry {entry!r}")
    return handle


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
    "KIND",
    "StagedFile",
    "abortedHandle",
    "checkHandle",
    "describeHandle",
    "isSafeRelative",
    "preparedHandle",
    "stagedFiles",
]
