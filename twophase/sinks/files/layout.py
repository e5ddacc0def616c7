"""Where the files sink puts things: the staging area beside the output, and file names.

Staged files live OUTSIDE the output path, so no reader of it ever sees them: Spark, pyarrow
and pandas skip ``_``-prefixed directories, but DuckDB and polars read every
``<path>/**/*.parquet`` (and ``read_parquet('<path>')``) file, hidden directories included.
The staging path is, by default, a sibling of the output directory::

    <parent>/_twophase-staging/<name>/                      (option stagingPath overrides it)
        <sinkTag>/<batchId>-<runId->p<partition>-a<attempt>-<uuid>-f<part:04d>.staged
    <parent>/<name>/<partdirs>/part-<batch:08d>-<partition:05d>-<part:04d>-<sinkTag>.<ext>

where ``<partdirs>`` are Hive-style ``col=value/`` directories when ``partitionBy`` is set
and ``<sinkTag>`` is the sink id made path-safe, so two queries writing one directory (a new
checkpoint restarts batch ids at 0) never share a file name or a staging directory.

A task attempt's staged files lie flat in the sink's staging directory, named by the attempt
(its *attempt name*, which handles call ``staging``) and a part number; the final name says
which partition directory each goes to. So a task makes no directory, syncs one (the sink's,
which the sink never deletes), and a commit leaves no directory to remove. A staged file's
name ends in ``.staged``, not in the format's extension, so even a reader globbing the parent
(``<parent>/**/*.parquet``) skips it.

The commit is a rename from the staging path to the output path, so both must be on one file
system (checked at start, see :func:`twophase.sinks.files.storage.checkStagingArea`).

Earlier releases staged under ``<path>/_twophase/staging/<sinkTag>/<batchId>/<attempt dir>/``
(:data:`LEGACY_STAGING_ROOT`): recovery still commits handles naming it and sweeps what is
left there.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import uuid
from dataclasses import dataclass

import fsspec

STAGING_DIR_NAME = "_twophase-staging"
"""The directory beside the output path that holds the default staging path of each output."""

STAGED_SUFFIX = ".staged"
"""The suffix of a staged file: not a data extension, so no ``*.parquet``/``*.json*`` glob."""

LEGACY_STAGING_ROOT = "_twophase/staging"
"""Where earlier releases staged, relative to the output path; only recovery still looks."""

LEGACY_ROOT = "_twophase"
"""The top directory of the earlier layout inside the output path, removed once empty."""

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_ATTEMPT_NAME = re.compile(
    r"^(?:(?P<batch>\d+)-)?(?:(?P<run>.+)-)?p(?P<partition>\d+)-a(?P<attempt>\d+)-[0-9a-f]+$"
)
_STAGED_FILE = re.compile(r"^(?P<attempt>.+-[0-9a-f]{12})-f\d+" + re.escape(STAGED_SUFFIX) + "$")


def defaultStagingPath(path: str) -> str:
    """``<parent>/_twophase-staging/<name>`` for output ``path`` (same URL protocol).

    Raises ``ValueError`` naming option ``stagingPath`` when ``path`` has no parent directory
    to stage beside (the root of a bucket or of a filesystem).
    """
    protocol, _ = fsspec.core.split_protocol(path)
    root = strippedPath(path).rstrip("/")
    parent, name = posixpath.split(root)
    if not name or not parent:
        raise ValueError(
            f"option path={path!r} is the root of its filesystem or bucket, so the files sink "
            f"has no directory beside it to stage files in ({STAGING_DIR_NAME}/<name>); set "
            "option stagingPath to a directory on the same filesystem outside path, or write "
            "to a subdirectory"
        )
    staging = f"{parent.rstrip('/')}/{STAGING_DIR_NAME}/{name}"
    return (
        staging if protocol is None or protocol in ("file", "local") else f"{protocol}://{staging}"
    )


def strippedPath(path: str) -> str:
    """``path`` without its URL protocol, as its filesystem names it (local paths absolute)."""
    protocol, rest = fsspec.core.split_protocol(path)
    try:
        cls = fsspec.get_filesystem_class(protocol or "file")
    except (ImportError, ValueError):  # a protocol whose package is missing: the settings say
        return rest
    return str(cls._strip_protocol(path))


def safeTag(text: str, fallback: str) -> str:
    """``text`` made safe as one path segment: kept when already safe and short, else hashed."""
    safe = _SAFE.sub("_", text).strip("._-")
    if safe == text and 0 < len(text) <= 48:
        return text
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    return f"{safe[:32] or fallback}-{digest}"


def sinkTag(sinkId: str) -> str:
    """The path-safe form of a sink id used in staging directories and final file names."""
    return safeTag(sinkId, "sink")


def sinkStagingDir(sinkId: str) -> str:
    """Directory of every attempt of one sink, relative to the staging path; never deleted."""
    return sinkTag(sinkId)


def legacySinkStagingDir(sinkId: str) -> str:
    """Where earlier releases staged one sink's batches, relative to the output path."""
    return f"{LEGACY_STAGING_ROOT}/{sinkTag(sinkId)}"


def attemptName(batchId: int, runId: str, partitionId: int, attemptNumber: int) -> str:
    """A fresh staging directory name for one task attempt: batch, run, partition, attempt.

    The random suffix means two attempts (retries, speculation, a zombie of an earlier run)
    never share one, even with equal run ids. (The earlier layout's names had no batch: it
    was their parent directory.)
    """
    run = f"{safeTag(runId, 'run')}-" if runId else ""
    return f"{batchId}-{run}p{partitionId:05d}-a{attemptNumber}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class AttemptName:
    """What an attempt directory's name tells: the task's batch, partition and attempt number.

    ``batchId`` is ``None`` for a name of the earlier layout (its batch is the parent's name).
    """

    batchId: int | None
    partitionId: int
    attemptNumber: int

    @classmethod
    def parse(cls, name: str) -> AttemptName | None:
        """What a name made by :func:`attemptName` (or the earlier layout) tells, or None."""
        match = _ATTEMPT_NAME.match(name)
        if not match:
            return None
        batch = int(match["batch"]) if match["batch"] is not None else None
        return cls(batch, int(match["partition"]), int(match["attempt"]))


def finalFileName(sinkId: str, batchId: int, partitionId: int, part: int, extension: str) -> str:
    """The committed file name: a pure function of sink, batch, partition and part number.

    Two attempts of one (batch, partition) that write the same rows produce the same names,
    and a committed file keeps its name forever, which makes ``commit`` idempotent.
    """
    return f"part-{batchId:08d}-{partitionId:05d}-{part:04d}-{sinkTag(sinkId)}{extension}"


def stagedFileName(attempt: str, part: int) -> str:
    """The staged name of part ``part`` of ``attempt`` (an attempt name, or a path ending in
    one), beside the attempt's other parts."""
    return f"{attempt}-f{part:04d}{STAGED_SUFFIX}"


def attemptOfStagedFile(name: str) -> str | None:
    """The attempt name of a staged file's name, or ``None`` for any other name."""
    match = _STAGED_FILE.match(name)
    return match["attempt"] if match else None


__all__ = [
    "LEGACY_ROOT",
    "LEGACY_STAGING_ROOT",
    "STAGED_SUFFIX",
    "STAGING_DIR_NAME",
    "AttemptName",
    "attemptName",
    "attemptOfStagedFile",
    "defaultStagingPath",
    "finalFileName",
    "legacySinkStagingDir",
    "safeTag",
    "sinkStagingDir",
    "sinkTag",
    "stagedFileName",
    "strippedPath",
]
