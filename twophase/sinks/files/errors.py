"""The files sink's errors: storage that did not answer or took no more bytes, named with the
batch and the fix; each says its system and the fix the command line gives
(``SinkSystemError``)."""

from __future__ import annotations

from types import MappingProxyType

from twophase.protocol.errors import SinkFailure, SinkSystemError

_CREDENTIALS_CODES = frozenset(
    {
        "AccessDenied",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
    }
)
"""S3's error codes of refused credentials (botocore's ``ClientError``)."""


class FilesSinkError(SinkSystemError):
    """An error of the files sink's storage, with the fixes the command line gives for it;
    ``classify`` reads botocore's errors by their type and S3's error code."""

    system = "files"
    fixes = MappingProxyType(
        {
            SinkFailure.UNREACHABLE: (
                "Fix: make the path reachable with the options the query used (for s3://, the "
                "endpoint: --sink-option fs.endpoint_url=...; the keys from the environment or "
                "a --sink-option-file)."
            ),
            SinkFailure.CREDENTIALS: (
                "Fix: give the credentials the query used: AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY in the environment, or fs.key and fs.secret in a "
                "--sink-option-file only you can read."
            ),
        }
    )

    @classmethod
    def classify(cls, exc: BaseException) -> SinkFailure | None:
        """botocore's connection and timeout errors, missing credentials and S3's refusals of
        the keys; ``None`` for any other error."""
        try:
            from botocore import exceptions as botocore
        except ImportError:  # no s3fs installed: nothing here can be a botocore error
            return None
        if isinstance(exc, botocore.NoCredentialsError | botocore.PartialCredentialsError):
            return SinkFailure.CREDENTIALS
        if isinstance(exc, botocore.ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            return SinkFailure.CREDENTIALS if code in _CREDENTIALS_CODES else None
        unreachable = (
            botocore.ConnectionError
            | botocore.HTTPClientError
            | botocore.ConnectionClosedError
            | botocore.ReadTimeoutError
        )
        return SinkFailure.UNREACHABLE if isinstance(exc, unreachable) else None


class FilesUnavailableError(FilesSinkError, ConnectionError):
    """The storage (S3 or another remote file system) could not be reached or did not answer
    while a task wrote; retrying the task may succeed. Names the batch, the place and the
    timeouts that bound the wait."""

    reason = SinkFailure.UNREACHABLE


class FilesNotWritableError(FilesSinkError, OSError):
    """A task could not write its files: the filesystem under the staging path (the output
    path, on S3) is full or read-only, or refuses this process. Names the batch, the place
    and the fix; ``errno`` is the filesystem's (``ENOSPC``, ``EDQUOT``, ``EROFS``,
    ``EACCES``)."""


__all__ = ["FilesNotWritableError", "FilesSinkError", "FilesUnavailableError"]
