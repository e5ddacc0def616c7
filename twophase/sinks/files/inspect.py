"""What the filesystem holds for a files sink, for ``twophase doctor``: its staged attempts.

The committer's own listing (``FilesCommitter.listPrepared``, what its sweep deletes from):
the sink's staging directory (``<stagingPath>/<sinkTag>/``, files of an attempt grouped by
their attempt name, aged by their modification time) and the earlier layout's
``<path>/_twophase/staging/<sinkTag>/<batch>/<attempt>/``; on ``s3://`` also the sink's
incomplete multipart uploads below the output path (``ListMultipartUploads``; a prepared task
on S3 is one upload per file), keyed by upload id. Nothing is changed. Recovery deletes
attempts whose name carries a batch, so any other file in the sink's staging directory is
``foreign``.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from twophase.doctor.findings import CannotCheck, Inspection
from twophase.doctor.listing import listedHeld
from twophase.protocol import TransientCommitError
from twophase.redaction import redact
from twophase.sinks.files.leftovers import preparedNames
from twophase.sinks.files.s3 import isTransient as s3IsTransient

if TYPE_CHECKING:
    from twophase.sinks.files.committer import FilesCommitter

handleKey = preparedNames
"""What a logged handle names, as the committer's sweep names it."""


def inspect(committer: FilesCommitter, sinkId: str, now: datetime) -> Inspection:
    """Read-only: the sink's staged attempts, in the staging path and the earlier layout.

    Raises ``CannotCheck`` naming the path when the filesystem refuses the listing.
    """
    where = redact(committer.stagingStorage.url())
    try:
        return Inspection("files", f"staging {where}", listedHeld(committer, "files", sinkId))
    except Exception as exc:
        if not isinstance(exc, OSError | TransientCommitError) and not s3IsTransient(exc):
            raise
        raise CannotCheck(
            f"files: cannot list the staging of sink {sinkId} at {where}: "
            f"{type(exc).__name__}: {redact(str(exc))}. Fix: check the path and the "
            "storage credentials (--sink-option or the environment)"
        ) from None
