"""Where the files sink puts things under its output path: staging directories and file names.

Layout under the output ``path``::

    _twophase/staging/<sinkTag>/<batchId>/<runId->p<partition>-a<attempt>-<uuid>/<partdirs>/<file>
    <partdirs>/part-<batch:08d>-<partition:05d>-<part:04d>-<sinkTag>.<ext>

where ``<partdirs>`` are Hive-style ``col=value/`` directories when ``partitionBy`` is set
and ``<sinkTag>`` is the sink id made path-safe, so two queries writing one directory (a new
checkpoint restarts batch ids at 0) never share a file name or a staging directory.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass

STAGING_ROOT = "_twophase/staging"
"""Staging area, relative to the output path; ``_``-prefixed so readers skip it."""

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_ATTEMPT_DIR = re.compile(r"^(?:(?P<run>.+)-)?p(?P<partition>\d+)-a(?P<attempt>\d+)-[0-9a-f]+$")


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
    """Staging directory of every batch of one sink, relative to the output path."""
    return f"{STAGING_ROOT}/{sinkTag(sinkId)}"


def stagingBatchDir(sinkId: str, batchId: int) -> str:
    """Staging directory of one batch of one sink, relative to the output path."""
    return f"{sinkStagingDir(sinkId)}/{batchId}"


def attemptDirName(runId: str, partitionId: int, attemptNumber: int) -> str:
    """A fresh staging directory name for one task attempt: run, partition, attempt, random.

    The random suffix means two attempts (retries, speculation, a zombie of an earlier run)
    never share one, even with equal run ids.
    """
    run = f"{safeTag(runId, 'run')}-" if runId else ""
    return f"{run}p{partitionId:05d}-a{attemptNumber}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class AttemptDir:
    """What an attempt directory's name tells: the task's partition and attempt number."""

    partitionId: int
    attemptNumber: int

    @classmethod
    def parse(cls, name: str) -> AttemptDir | None:
        """The partition and attempt of a name made by :func:`attemptDirName`, else ``None``."""
        match = _ATTEMPT_DIR.match(name)
        if not match:
            return None
        return cls(int(match["partition"]), int(match["attempt"]))


def finalFileName(sinkId: str, batchId: int, partitionId: int, part: int, extension: str) -> str:
    """The committed file name: a pure function of sink, batch, partition and part number.

    Two attempts of one (batch, partition) that write the same rows produce the same names,
    and a committed file keeps its name forever, which makes ``commit`` idempotent.
    """
    return f"part-{batchId:08d}-{partitionId:05d}-{part:04d}-{sinkTag(sinkId)}{extension}"


__all__ = [
    "STAGING_ROOT",
    "AttemptDir",
    "attemptDirName",
    "finalFileName",
    "safeTag",
    "sinkStagingDir",
    "sinkTag",
    "stagingBatchDir",
]
