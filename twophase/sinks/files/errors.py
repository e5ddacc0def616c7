"""The files sink's errors: storage that did not answer, named with the batch and the fix."""

from __future__ import annotations


class FilesUnavailableError(ConnectionError):
    """The storage (S3 or another remote file system) could not be reached or did not answer
    while a task wrote; retrying the task may succeed. Names the batch, the place and the
    timeouts that bound the wait."""


__all__ = ["FilesUnavailableError"]
