"""The files sink's errors: storage that did not answer or took no more bytes, named with the
batch and the fix."""

from __future__ import annotations


class FilesUnavailableError(ConnectionError):
    """The storage (S3 or another remote file system) could not be reached or did not answer
    while a task wrote; retrying the task may succeed. Names the batch, the place and the
    timeouts that bound the wait."""


class FilesNotWritableError(OSError):
    """A task could not write its files: the filesystem under the staging path (the output
    path, on S3) is full or read-only, or refuses this process. Names the batch, the place
    and the fix; ``errno`` is the filesystem's (``ENOSPC``, ``EDQUOT``, ``EROFS``,
    ``EACCES``)."""


__all__ = ["FilesNotWritableError", "FilesUnavailableError"]
