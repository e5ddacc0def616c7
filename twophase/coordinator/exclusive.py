"""How a store creates a log record only where none exists: a write two drivers cannot both win.

A decision, a run's claim and a fence are created, never replaced: the first writer of a name
wins and every other one gets ``FileExistsError``. That holds only where the store itself makes
the create conditional in one step:

- local disk: the record is written under a temporary name, then hard-linked to its final
  name (``link`` fails when the name exists, and the name appears with its whole content);
- S3 and S3-compatible servers: ``PutObject`` with ``If-None-Match: *`` (s3fs's
  ``mode="create"``), refused with 412 once the key exists; a 409 (another conditional write
  of the key in flight) is asked again;
- ``memory://`` (tests, one process): a check and a write under one lock.

Any other store (HDFS, GCS, Azure, SFTP through fsspec ...) is not known here to have one, so
an exclusive create there is refused with :class:`UnfencedLogStoreError`, unless the user
accepts by name that two drivers could then both decide a batch
(``twophase.unfencedLogStore=true``); it then checks and moves, as before.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

from twophase.coordinator.errors import UnfencedLogStoreError

LOCAL = "a hard link (local disk)"
CONDITIONAL_PUT = "a conditional PUT (If-None-Match: *)"
IN_PROCESS = "a check and a write under one lock (memory://, one process)"

_S3_PROTOCOLS = frozenset({"s3", "s3a"})
_memoryLock = threading.Lock()


def protocolOf(fs: AbstractFileSystem) -> str:
    """The filesystem's first protocol name (``s3``, ``file``, ``memory`` ...)."""
    protocol = fs.protocol
    return protocol if isinstance(protocol, str) else str(protocol[0])


def exclusiveCreateOf(fs: AbstractFileSystem) -> str | None:
    """How ``fs`` creates a file only if absent, in one step; ``None`` when it cannot."""
    if isinstance(fs, LocalFileSystem):
        return LOCAL
    if isinstance(fs, MemoryFileSystem):
        return IN_PROCESS
    if protocolOf(fs) in _S3_PROTOCOLS and _isS3fs(fs):
        return CONDITIONAL_PUT
    return None


def isObjectStore(fs: AbstractFileSystem) -> bool:
    """True where one PUT makes a whole object appear at once (no temporary name needed)."""
    return protocolOf(fs) in _S3_PROTOCOLS and _isS3fs(fs)


def _isS3fs(fs: AbstractFileSystem) -> bool:
    return type(fs).__module__.split(".", 1)[0] == "s3fs"


def createRemote(fs: AbstractFileSystem, path: str, data: bytes) -> None:
    """Create ``path`` with ``data`` unless it exists (``FileExistsError``), on a store whose
    ``exclusiveCreateOf`` is not ``LOCAL`` (local disk links a written temporary file)."""
    how = exclusiveCreateOf(fs)
    if how == IN_PROCESS:
        with _memoryLock:
            if fs.exists(path):
                raise FileExistsError(errno.EEXIST, "log record exists", path)
            fs.pipe_file(path, data)
        return
    if how == CONDITIONAL_PUT:
        _conditionalPut(lambda: fs.pipe_file(path, data, mode="create"), path)
        return
    raise UnfencedLogStoreError(protocolOf(fs), path)


def _inFlight(exc: BaseException) -> bool:
    """True for S3's 409 ConditionalRequestConflict: another conditional write of the key is
    in flight; asked again, it is answered 412 (the other won) or 200."""
    return _s3Code(exc) == "ConditionalRequestConflict"


@retry(
    retry=retry_if_exception(_inFlight),
    stop=stop_after_attempt(6),
    wait=wait_random_exponential(multiplier=0.05, max=1.0),
    reraise=True,
)
def _conditionalPut(put: Callable[[], Any], path: str) -> None:
    try:
        put()
    except FileExistsError:
        raise
    except OSError as exc:
        if _s3Code(exc) == "PreconditionFailed":  # a server that names no condition
            raise FileExistsError(errno.EEXIST, "log record exists", path) from None
        raise


def _s3Code(exc: BaseException) -> str | None:
    """The S3 error code behind an s3fs error (its ``ClientError`` cause), if any."""
    cause = exc.__cause__ or exc
    response = getattr(cause, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("Error", {}).get("Code")
    return str(code) if code is not None else None
