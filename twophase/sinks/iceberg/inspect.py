"""What the filesystem holds for an Iceberg sink, for ``twophase doctor``: its staged attempts.

The tasks stage exactly as the files sink's do, so this is the files sink's listing of the
staging path under the table's location (nothing is changed). A decided batch whose files are
moved but not yet in a snapshot is a decision the log still holds, which doctor reports from
the log itself.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from twophase.doctor.findings import Inspection
from twophase.sinks.files import inspect as filesInspect
from twophase.sinks.files.inspect import handleKey

if TYPE_CHECKING:
    from twophase.sinks.iceberg.committer import IcebergCommitter


def inspect(committer: IcebergCommitter, sinkId: str, now: datetime) -> Inspection:
    """Read-only: the sink's staged attempts under the table; ``CannotCheck`` names the place
    when the catalog or the filesystem refuses."""
    found = filesInspect.inspect(committer.files, sinkId, now)
    found.system = "iceberg"
    return found


__all__ = ["handleKey", "inspect"]
