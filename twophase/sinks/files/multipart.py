"""The files sink on S3: each task file is a multipart upload, completed by the commit.

S3 has its own two-phase commit. A task streams each part file straight to its final key as a
multipart upload (:class:`MultipartFile`: a part goes up whenever ``partSize`` bytes are
buffered, so memory per open file is one part and a file may be larger than memory); prepare
uploads the last part and leaves the upload incomplete, invisible to every reader; the commit
is ``CompleteMultipartUpload``; an abort is ``AbortMultipartUpload``. Nothing is renamed.

:class:`Multipart` is the driver half. A repeated commit is recognised as done (the upload is
gone and the object has the ETag those parts complete into), an upload gone with no such
object is lost: a bucket lifecycle rule that aborts incomplete uploads does that to a decided
batch not committed in time, S3's twin of Kafka's transaction timeout. The handle carries the
task's record fingerprint, so the coordinator writes the partition again from Spark's replay
(docs/protocol.md section 5, docs/files.md).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from twophase.protocol import Handle, TransactionLostError
from twophase.protocol.fingerprint import Fingerprint
from twophase.redaction import getLogger
from twophase.sinks.files.formats import EXTENSIONS
from twophase.sinks.files.handles import COMMIT, KIND
from twophase.sinks.files.layout import sinkTag
from twophase.sinks.files.rowbytes import SCHEME as ROWS_SCHEME
from twophase.sinks.files.rowbytes import rowBytes
from twophase.sinks.files.s3 import MAX_PARTS, S3Calls, multipartEtag, splitKey
from twophase.sinks.files.storage import Storage

log = getLogger(__name__)

_FINAL = re.compile(r"^part-(?P<batch>\d{8})-(?P<partition>\d{5})-(?P<part>\d{4})-(?P<rest>.+)$")


class MultipartFile(io.RawIOBase):
    """A write-only binary file whose bytes go to S3 as the parts of one multipart upload.

    ``write`` buffers and uploads a part each time ``partSize`` bytes are buffered; ``close``
    uploads what is left as the last part and does NOT complete the upload: afterwards
    :attr:`partEtags` and :attr:`size` say what the commit needs. ``discard`` aborts it.
    """

    def __init__(self, calls: S3Calls, bucket: str, key: str, partSize: int) -> None:
        super().__init__()
        self.calls = calls
        self.bucket = bucket
        self.key = key
        self.partSize = partSize
        self.uploadId = calls.create(bucket, key)
        self.partEtags: list[str] = []
        self.size = 0
        self._buffer = bytearray()

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError(f"write to a closed upload of {self.key}")
        view = memoryview(data).cast("B")
        self._buffer += view
        self.size += len(view)
        while len(self._buffer) >= self.partSize:
            self._upload(bytes(self._buffer[: self.partSize]))
            del self._buffer[: self.partSize]
        return len(view)

    def _upload(self, body: bytes) -> None:
        number = len(self.partEtags) + 1
        if number > MAX_PARTS:
            raise ValueError(
                f"files: {self.key} needs more than {MAX_PARTS} parts of partSize="
                f"{self.partSize} bytes; raise option partSize or set maxRecordsPerFile"
            )
        self.partEtags.append(
            self.calls.uploadPart(self.bucket, self.key, self.uploadId, number, body)
        )

    def close(self) -> None:
        """Upload the last part (a file always has one part); the upload stays incomplete."""
        if self.closed:
            return
        if self._buffer or not self.partEtags:
            self._upload(bytes(self._buffer))
            self._buffer.clear()
        super().close()

    def __del__(self) -> None:
        """Not ``close`` (as ``IOBase`` does): a dropped file uploads nothing more."""

    def discard(self) -> None:
        """Best effort for an abandoned task: drop the buffer and abort the upload."""
        self._buffer.clear()
        if not self.closed:
            super().close()
        self.calls.abort(self.bucket, self.key, self.uploadId)


def recordFingerprint(fingerprint: Fingerprint, batch: pa.RecordBatch) -> None:
    """Fold a batch's rows into ``fingerprint``: each row as its bytes (``rowbytes``),
    in any order."""
    fingerprint.scheme = ROWS_SCHEME
    fingerprint.add(rowBytes(batch).to_pylist())


@dataclass(frozen=True)
class SinkUpload:
    """A pending upload recognised as this sink's: what its final name says."""

    rel: str
    uploadId: str
    batchId: int
    partitionId: int
    initiated: Any


def sinkUploads(storage: Storage, sinkId: str) -> list[SinkUpload]:
    """The incomplete uploads below the output path whose file name is this sink's.

    One ``ListMultipartUploads`` under the output prefix; a key counts only when its name is
    ``part-<batch>-<partition>-<part>-<sinkTag><extension>`` exactly, so other sinks' uploads
    (another tag, or a tag this one is a prefix of) are never touched.
    """
    bucket, prefix = splitKey(storage.full(""))
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    tag = sinkTag(sinkId)
    endings = {tag + ext for exts in EXTENSIONS.values() for ext in exts.values()}
    found: list[SinkUpload] = []
    for upload in S3Calls(storage.fs).pendingUploads(bucket, prefix):
        rel = upload.key[len(prefix) :]
        match = _FINAL.match(rel.rsplit("/", 1)[-1])
        if match is None or match["rest"] not in endings:
            continue
        found.append(
            SinkUpload(
                rel, upload.uploadId, int(match["batch"]), int(match["partition"]), upload.initiated
            )
        )
    return found


@dataclass
class Multipart:
    """The driver half on S3: complete, abort and sweep a sink's multipart uploads.

    Every method is idempotent. Takes the output path's :class:`Storage` (its s3fs client);
    holds nothing else, so any process can commit a handle.
    """

    storage: Storage
    calls: S3Calls = field(init=False)

    def __post_init__(self) -> None:
        self.calls = S3Calls(self.storage.fs)

    def _where(self, rel: str) -> tuple[str, str]:
        return splitKey(self.storage.full(rel))

    def commit(self, handle: Handle, what: str) -> None:
        """Complete each upload; one already completed (the object has the ETag its parts
        make) is done; one gone without that object raises ``TransactionLostError``."""
        for entry in handle["files"]:
            bucket, key = self._where(entry["final"])
            try:
                self.calls.complete(bucket, key, entry["uploadId"], entry["parts"])
                continue
            except FileNotFoundError:
                pass
            if self.isComplete(entry):
                continue
            raise TransactionLostError(
                f"files: {what}: the multipart upload {entry['uploadId']} of s3://{bucket}/{key} "
                "is gone and the object is not what it would complete into: the upload was "
                "aborted before the commit (a bucket lifecycle rule that aborts incomplete "
                "multipart uploads after fewer days than the batch waited, or by hand)"
            )

    def isComplete(self, entry: dict[str, Any]) -> bool:
        """True when the object at the entry's key is what its upload completes into."""
        bucket, key = self._where(entry["final"])
        info = self.calls.head(bucket, key)
        return info is not None and info.etag == multipartEtag(entry["parts"])

    def abort(self, handle: Handle) -> bool:
        """Abort each upload (gone already is fine); never deletes an object."""
        aborted = False
        for entry in handle["files"]:
            bucket, key = self._where(entry["final"])
            aborted = self.calls.abort(bucket, key, entry["uploadId"]) or aborted
        return aborted

    def dropReplaced(self, original: Handle, replacement: Handle) -> None:
        """After the replay's files of a lost partition are in place: delete the original's
        completed objects the replay did not write over (so no row is there twice)."""
        kept = {f["final"] for f in replacement["files"]}
        for entry in original["files"]:
            if entry["final"] in kept:
                continue
            bucket, key = self._where(entry["final"])
            self.calls.abort(bucket, key, entry["uploadId"])
            if self.isComplete(entry):
                self.calls.delete(bucket, key)

    def abortUpload(self, rel: str, uploadId: str) -> None:
        """Abort one listed upload of the sink (gone already is fine)."""
        bucket, key = self._where(rel)
        self.calls.abort(bucket, key, uploadId)


def sweptHandle(storage: Storage, upload: SinkUpload) -> Handle:
    """A brief handle for an upload the sweep aborted (``staging`` is its upload id)."""
    return {
        "kind": KIND,
        "commit": COMMIT,
        "path": storage.url(),
        "batchId": upload.batchId,
        "partitionId": upload.partitionId,
        "staging": upload.uploadId,
        "files": [],
    }


__all__ = [
    "Multipart",
    "MultipartFile",
    "SinkUpload",
    "recordFingerprint",
    "sinkUploads",
    "sweptHandle",
]
