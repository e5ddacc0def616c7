"""The files sink's errors: storage that did not answer or took no more bytes, named with the
batch and the fix; each says its system and the fix the command line gives
(``SinkSystemError``)."""

from __future__ import annotations

import ssl
from types import MappingProxyType

from twophase.protocol.errors import SinkFailure, SinkSystemError

_CREDENTIALS_CODES = frozenset(
    {
        "403",
        "AccessDenied",
        "ExpiredToken",
        "Forbidden",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
    }
)
"""S3's error codes of refused credentials or privileges (botocore's ``ClientError``; a HEAD
has no body, so its refusal is only its status, ``403``)."""


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
                "--sink-option-file only you can read; for a certificate that did not verify, "
                "--sink-option fs.ca_bundle=<the PEM file of the endpoint's CA>."
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
        if isUntrusted(exc):  # the same certificate fails every retry
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


S3_ACTIONS = (
    "s3:ListBucket",
    "s3:GetObject",
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:AbortMultipartUpload",
    "s3:ListBucketMultipartUploads",
)
"""The S3 actions the files sink (and Delta's data files) need on the bucket and its objects,
as docs/security.md lists them."""


class FilesAccessError(FilesSinkError, PermissionError):
    """S3 refused a call of the sink (``AccessDenied``): the keys lack one of the actions the
    sink needs; fatal (``TWOPHASE_CREDENTIALS``). Names the call, the place and the actions."""

    reason = SinkFailure.CREDENTIALS
    fix = (
        "Fix: allow the sink's principal every one of "
        + ", ".join(S3_ACTIONS)
        + " on the bucket and the objects under the path (docs/security.md)."
    )


class FilesTrustError(FilesSinkError):
    """The S3 endpoint's certificate does not verify under the CA the options give, or the CA
    file is missing or not PEM: fatal (``TWOPHASE_CREDENTIALS``), since a retry meets the same
    certificate. Names the endpoint, the CA file and the host."""

    reason = SinkFailure.CREDENTIALS
    fix = (
        "Fix: set fs.ca_bundle to a PEM file holding the CA that signed the S3 endpoint's "
        "certificate, at the same path on the driver and on every executor."
    )


def isUntrusted(exc: BaseException) -> bool:
    """True when ``exc`` or an error it was raised from is a failed certificate verification
    (botocore's ``SSLError`` over aiohttp's, ``ssl.SSLCertVerificationError``, delta-rs's
    ``invalid peer certificate``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError | FilesTrustError):
            return True
        text = str(current)
        if "CERTIFICATE_VERIFY_FAILED" in text or "invalid peer certificate" in text:
            return True
        current = current.__cause__ or current.__context__
    return False


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


__all__ = [
    "S3_ACTIONS",
    "FilesAccessError",
    "FilesNotWritableError",
    "FilesSinkError",
    "FilesTrustError",
    "FilesUnavailableError",
    "isUntrusted",
]
