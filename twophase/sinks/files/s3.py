"""The S3 calls of the files sink's multipart path, through s3fs's botocore client.

A files sink whose ``path`` is ``s3://`` commits each task's file with S3's own two-phase
commit: the parts of a multipart upload stay invisible until ``CompleteMultipartUpload`` and
``AbortMultipartUpload`` throws them away (see :mod:`twophase.sinks.files.multipart`). This
module is the thin layer over the client s3fs already holds (so credentials, endpoint and
retries come from the sink's ``fs.*`` options): bucket and key of a path, the calls, the
ETag S3 gives a completed multipart object, and which botocore errors are worth a retry.
"""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import fsspec

from twophase.sinks.files.errors import FilesAccessError, isUntrusted

S3_PROTOCOLS = frozenset({"s3", "s3a"})
"""URL protocols s3fs serves; a files sink on one of them commits by multipart upload."""

MIN_PART_SIZE = 5 * 1024 * 1024
"""S3's smallest part, except the last one of an upload."""

MAX_PARTS = 10_000
"""S3's largest part number."""

_ACTIONS = {
    "create_multipart_upload": "s3:PutObject",
    "upload_part": "s3:PutObject",
    "complete_multipart_upload": "s3:PutObject",
    "abort_multipart_upload": "s3:AbortMultipartUpload",
    "list_multipart_uploads": "s3:ListBucketMultipartUploads",
    "head_object": "s3:GetObject",
    "delete_object": "s3:DeleteObject",
}
"""The IAM action that allows each S3 call the sink makes, for the message of a refusal."""


def isS3(fs: fsspec.AbstractFileSystem) -> bool:
    """True when ``fs`` is an s3fs filesystem (so the multipart path applies)."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
    return any(p in S3_PROTOCOLS for p in protocols)


def splitKey(full: str) -> tuple[str, str]:
    """``(bucket, key)`` of an s3fs path ``bucket/key`` (no protocol)."""
    bucket, _, key = full.partition("/")
    return bucket, key


def multipartEtag(partEtags: Sequence[str]) -> str:
    """The ETag S3 gives the object a multipart upload of these parts completes into.

    The MD5 of the parts' binary MD5s, then ``-<number of parts>``, quoted as S3 sends it.
    """
    digest = hashlib.md5(usedforsecurity=False)
    for etag in partEtags:
        digest.update(bytes.fromhex(etag.strip('"')))
    return f'"{digest.hexdigest()}-{len(partEtags)}"'


@dataclass(frozen=True)
class PendingUpload:
    """One incomplete multipart upload ``ListMultipartUploads`` returned."""

    key: str
    uploadId: str
    initiated: datetime | None


@dataclass(frozen=True)
class ObjectInfo:
    """What ``HeadObject`` says about a completed object."""

    etag: str
    size: int


class S3Calls:
    """The multipart calls on one s3fs filesystem's client (thread-safe, as s3fs's client is).

    Errors come translated by s3fs: ``NoSuchUpload``/``NoSuchKey`` as ``FileNotFoundError``,
    others as ``OSError``; connection failures as botocore exceptions (see :func:`isTransient`).
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, pageSize: int | None = None) -> None:
        self.fs = fs
        self.pageSize = pageSize
        """``MaxUploads`` of one ``ListMultipartUploads`` page (``None``: the server's, 1,000)."""

    def _call(self, method: str, **kwargs: Any) -> dict[str, Any]:
        try:
            result: dict[str, Any] = self.fs.call_s3(method, **kwargs)
        except PermissionError as exc:  # AccessDenied: an action the keys lack, named
            action = _ACTIONS.get(method, "an action")
            where = f"s3://{kwargs.get('Bucket', '')}/{kwargs.get('Key', kwargs.get('Prefix', ''))}"
            raise FilesAccessError(
                f"files: S3 refused {method} on {where} ({exc}): the keys lack {action} there"
            ) from exc
        return result

    def create(self, bucket: str, key: str) -> str:
        """Start an upload; returns its id."""
        return str(self._call("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"])

    def uploadPart(self, bucket: str, key: str, uploadId: str, number: int, body: bytes) -> str:
        """Upload part ``number`` (1-based); returns its ETag."""
        out = self._call(
            "upload_part",
            Bucket=bucket,
            Key=key,
            UploadId=uploadId,
            PartNumber=number,
            Body=body,
        )
        return str(out["ETag"])

    def complete(self, bucket: str, key: str, uploadId: str, partEtags: Sequence[str]) -> None:
        """``CompleteMultipartUpload``; ``FileNotFoundError`` when the upload is gone."""
        parts = [{"PartNumber": i + 1, "ETag": etag} for i, etag in enumerate(partEtags)]
        self._call(
            "complete_multipart_upload",
            Bucket=bucket,
            Key=key,
            UploadId=uploadId,
            MultipartUpload={"Parts": parts},
        )

    def abort(self, bucket: str, key: str, uploadId: str) -> bool:
        """``AbortMultipartUpload``; False when the upload was already gone."""
        try:
            self._call("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=uploadId)
        except FileNotFoundError:
            return False
        return True

    def head(self, bucket: str, key: str) -> ObjectInfo | None:
        """The object's ETag and size, or ``None`` when there is no object at ``key``."""
        try:
            out = self._call("head_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return None
        return ObjectInfo(etag=str(out.get("ETag", "")), size=int(out.get("ContentLength", 0)))

    def delete(self, bucket: str, key: str) -> None:
        """Delete one object (missing is fine, as S3 has it)."""
        self._call("delete_object", Bucket=bucket, Key=key)

    def pendingUploads(self, bucket: str, prefix: str) -> Iterator[PendingUpload]:
        """Every incomplete upload whose key starts with ``prefix`` (all pages, each once)."""
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if self.pageSize:
            kwargs["MaxUploads"] = self.pageSize
        seen: set[tuple[str, str]] = set()
        while True:
            uploads, more = self._page(kwargs)
            for upload in uploads:
                if (upload.key, upload.uploadId) not in seen:
                    seen.add((upload.key, upload.uploadId))
                    yield upload
            if not more:
                return

    def _page(self, kwargs: dict[str, Any]) -> tuple[list[PendingUpload], bool]:
        """One page, and whether more follow; sets ``kwargs``' markers for the next.

        Some servers (versitygw) refuse AWS's ``UploadIdMarker``: then the marker key's other
        uploads are listed by themselves (``Prefix`` = that key) and paging goes on by key.
        """
        try:
            out = self._call("list_multipart_uploads", **kwargs)
        except OSError as exc:
            if exc.errno != errno.EINVAL or not kwargs.get("UploadIdMarker"):
                raise
            del kwargs["UploadIdMarker"]
            key = kwargs["KeyMarker"]
            sameKey = {"Bucket": kwargs["Bucket"], "Prefix": key}
            rest = self._call("list_multipart_uploads", **sameKey).get("Uploads") or []
            out = self._call("list_multipart_uploads", **kwargs)
            out["Uploads"] = [u for u in rest if u["Key"] == key] + list(out.get("Uploads") or [])
        more = bool(out.get("IsTruncated"))
        if more:
            kwargs["KeyMarker"] = out.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = out.get("NextUploadIdMarker", "")
        uploads = [
            PendingUpload(
                key=str(u["Key"]),
                uploadId=str(u["UploadId"]),
                initiated=u.get("Initiated") if isinstance(u.get("Initiated"), datetime) else None,
            )
            for u in out.get("Uploads") or []
        ]
        return uploads, more


def isTransient(exc: BaseException) -> bool:
    """True for botocore's connection and timeout errors (the server down or slow).

    s3fs retries some of them itself; what still reaches the sink is worth a later retry. A
    certificate that did not verify (botocore's ``SSLError`` is a ``ConnectionError``) is not.
    """
    try:
        from botocore import exceptions as botocore
    except ImportError:  # no s3fs installed: nothing here can be a botocore error
        return False
    if isUntrusted(exc):  # a certificate that did not verify fails every retry the same way
        return False
    return isinstance(
        exc,
        botocore.ConnectionError
        | botocore.HTTPClientError
        | botocore.ConnectionClosedError
        | botocore.ReadTimeoutError,
    )


__all__ = [
    "MAX_PARTS",
    "MIN_PART_SIZE",
    "S3_PROTOCOLS",
    "ObjectInfo",
    "PendingUpload",
    "S3Calls",
    "isS3",
    "isTransient",
    "multipartEtag",
    "splitKey",
]
