"""What the filesystem holds for a Delta sink, for ``twophase doctor``: its staged attempts.

The tasks stage exactly as the files sink's do, so this is the files sink's listing of the
staging path (nothing is changed). A decided batch whose files are moved but not yet in the
table's log is a decision the log still holds, which doctor reports from the log itself.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from twophase.doctor.findings import Inspection
from twophase.sinks.files import inspect as filesInspect
from twophase.sinks.files.inspect import handleKey

if TYPE_CHECKING:
    from twophase.sinks.delta.committer import DeltaCommitter


def inspect(committer: DeltaCommitter, sinkId: str, now: datetime) -> Inspection:
    """Read-only: the sink's staged attempts beside the table; ``CannotCheck`` names the path
    when the filesystem refuses the listing."""
    found = filesInspect.inspect(committer.files, sinkId, now)
    found.system = "delta"
    return found


__all__ = ["handleKey", "inspect"]
