"""The S3 path of the files sink without a server: options, handles, ETags, fingerprints.

What needs S3 itself (uploads, commits, crashes, readers) is in
integration_tests/test_files_s3.py, against the server of ``make services``.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest

from twophase.protocol.fingerprint import Fingerprint
from twophase.sinks.files import FilesCommitter, FilesSettings
from twophase.sinks.files.handles import checkHandle
from twophase.sinks.files.multipart import recordFingerprint
from twophase.sinks.files.s3 import MIN_PART_SIZE, multipartEtag, splitKey

HANDLE = {
    "kind": "files",
    "commit": "multipart",
    "path": "s3://bucket/out",
    "batchId": 1,
    "partitionId": 0,
    "attempt": 0,
    "staging": "sink/1-p00000-a0-0123456789ab",
    "files": [{"final": "k=1/part-x.parquet", "uploadId": "u1", "parts": ['"e1"'], "rows": 3}],
    "fingerprint": "3:0:0",
}


def test_part_size_below_the_s3_minimum_is_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match="option partSize=1024 .* 5 MiB"):
        FilesSettings.fromOptions({"path": "s3://b/out", "partSize": "1024"})
    settings = FilesSettings.fromOptions({"path": "s3://b/out", "partSize": str(MIN_PART_SIZE)})
    assert settings.partSize == MIN_PART_SIZE


def test_the_multipart_etag_is_the_md5_of_the_part_md5s() -> None:
    parts = [hashlib.md5(b"a" * 10).hexdigest(), hashlib.md5(b"b").hexdigest()]
    joined = bytes.fromhex(parts[0]) + bytes.fromhex(parts[1])
    assert multipartEtag([f'"{p}"' for p in parts]) == f'"{hashlib.md5(joined).hexdigest()}-2"'
    assert splitKey("bucket/a/b.parquet") == ("bucket", "a/b.parquet")


@pytest.mark.parametrize(
    "change",
    [
        {"path": "/local/out"},
        {"commit": "rename"},
        {"files": [{"final": "../escape.parquet", "uploadId": "u", "parts": ['"e"']}]},
        {"files": [{"final": "/abs.parquet", "uploadId": "u", "parts": ['"e"']}]},
        {"files": [{"final": "a.parquet", "uploadId": "", "parts": ['"e"']}]},
        {"files": [{"final": "a.parquet", "uploadId": "u", "parts": []}]},
    ],
)
def test_a_malformed_multipart_handle_is_refused(change: dict[str, object]) -> None:
    checkHandle(dict(HANDLE))
    with pytest.raises(ValueError):
        checkHandle({**HANDLE, **change})


def test_only_multipart_handles_carry_a_fingerprint() -> None:
    committer = FilesCommitter.fromOptions({"path": "memory://fp/out"})
    assert committer.fingerprint(HANDLE) == "3:0:0"
    renamed = {k: v for k, v in HANDLE.items() if k not in ("commit", "fingerprint")}
    assert committer.fingerprint(renamed) is None


def test_the_record_fingerprint_ignores_order_and_sees_contents() -> None:
    batch = pa.record_batch({"id": [1, 2, 3], "s": ["a", "b\nc", None]})
    one, other, changed = Fingerprint(), Fingerprint(), Fingerprint()
    recordFingerprint(one, batch)
    recordFingerprint(other, batch.slice(2, 1))
    recordFingerprint(other, batch.slice(0, 2))
    recordFingerprint(changed, pa.record_batch({"id": [1, 2, 3], "s": ["a", "b\nc", ""]}))
    assert one.toText() == other.toText()
    assert one.records == 3  # a newline inside a value is escaped, not a record boundary
    assert changed.toText() != one.toText()
