"""The persisted formats' version numbers, and the check every reader makes of them.

Each thing twophase persists says which format it is in, and its readers refuse a newer one
with :class:`~twophase.coordinator.errors.LogFormatError` instead of guessing:

- the decision log's records (decisions, fences, rewrite, committed, aborted, recovery),
  ``owner.json`` and the run claims carry ``"format"``: 1 up to 0.1.0 (5fb8b11; fences and run
  claims, from f10c968 on, under 1 too), 2 from 0.2.0 on, the same layout plus
  ``"twophase"``, the version that wrote it. This code reads 1 and 2;
- ``sink.json`` carries its own ``"format"`` (absent: 1);
- a built-in sink's handle may carry ``"v"`` (absent: 1), written only once a handle's layout
  changes.
"""

from __future__ import annotations

from typing import Any

from twophase.coordinator.errors import LogFormatError
from twophase.version import __version__

LOG_FORMAT = 2
"""The format of the records this code writes: the newest it reads."""

DESCRIPTION_FORMAT = 1
"""The format of ``sink.json`` this code writes and the newest it reads."""

HANDLE_VERSION = 1
"""The newest ``v`` of a built-in sink's handle this code reads (absent means 1)."""


def versionOf(value: Any, what: str) -> int:
    """A stored format number (``None``: absent, so 1); ``ValueError`` when it is not one."""
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} has a format {value!r} that is not a number >= 1")
    return value


def refuseNewer(found: int, newest: int, where: str, writtenBy: Any = None) -> None:
    """Raise ``LogFormatError`` when ``found`` is newer than ``newest``, the newest this code
    reads; ``writtenBy`` is the twophase version the record names, if any."""
    if found > newest:
        by = writtenBy if isinstance(writtenBy, str) and writtenBy else None
        raise LogFormatError(where, found, newest, by, __version__)


def checkHandleVersion(handle: Any, kind: str) -> None:
    """Refuse a built-in sink's handle of a newer layout (``"v"``) before anyone uses it."""
    found = versionOf(handle.get("v"), f"a {kind} handle")
    task = f"batch {handle.get('batchId')}, partition {handle.get('partitionId')}"
    where = f"a {kind} handle ({task})"
    refuseNewer(found, HANDLE_VERSION, where)
