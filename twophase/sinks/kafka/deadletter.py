"""Records Kafka refuses, set aside in a dead-letter topic inside the task's own transaction.

With the option ``badRecords=<topic>``, a row the producer refuses (a record over its
``message.max.bytes``, a row whose ``topic`` column is null and no default topic is set) does
not fail the batch: the task produces a dead-letter record instead, into the same
transaction as its other records, so it is committed with its batch exactly once, or never.

A record too large for the target is too large for any topic the producer writes, so the
dead-letter record keeps the head of its key and value (at most ``KEPT_BYTES`` each, less when
the producer's own limit leaves less room beside the headers), their full size and the value's
SHA-256: enough to find the row upstream. Headers (``twophase.error.*``) say
why, where it was going, and where it came from (sink, batch, partition, row). The
fingerprint of a dead-letter record covers what a replay reproduces in any order (its key,
value, the reason and the topic it was meant for), never the row's position.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from twophase.protocol import TransactionContext

KEPT_BYTES = 4096
"""How much of a refused record's key and of its value the dead-letter record keeps."""

TOO_LARGE = "too large"
NULL_TOPIC = "null topic"
UNSERIALIZABLE = "unserializable"
"""A row whose key or value the ``key.format``/``value.format`` serializer refused: the
dead-letter record keeps the row's value and key as their JSON text."""


@dataclass(frozen=True)
class DeadLetter:
    """One dead-letter record: what to produce, and what its fingerprint covers."""

    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, str | bytes | None]]
    fingerprintExtra: bytes


RECORD_OVERHEAD_BYTES = 256
"""Room left under the producer's limit for a record's framing and its headers' lengths."""


def _blob(data: Any) -> bytes | None:
    if data is None:
        return None
    return data.encode() if isinstance(data, str) else bytes(data)


def _headerBytes(headers: list[tuple[str, str | bytes | None]]) -> int:
    return sum(len(k.encode()) + len(v or b"") for k, v in headers)


def deadLetter(
    ctx: TransactionContext,
    *,
    reason: str,
    error: str,
    topic: str | None,
    row: int,
    value: Any,
    key: Any,
    size: int,
    limit: int,
    headers: list[tuple[str, Any]] | None = None,
) -> DeadLetter:
    """The dead-letter record of row ``row`` (the task's position, from 0), meant for
    ``topic``, refused for ``reason`` (``TOO_LARGE``, ``NULL_TOPIC`` or ``UNSERIALIZABLE``;
    ``error`` in words);
    ``size`` is its key and value bytes, ``limit`` the producer's ``message.max.bytes`` the
    dead-letter record must fit under; its own ``headers`` follow twophase's."""
    wholeValue, wholeKey = _blob(value), _blob(key)
    ours: list[tuple[str, str | bytes | None]] = [
        ("twophase.error.reason", reason.encode()),
        ("twophase.error.message", error.encode()),
        ("twophase.error.topic", (topic or "").encode()),
        ("twophase.error.sink", ctx.sinkId.encode()),
        ("twophase.error.batch", str(ctx.batchId).encode()),
        ("twophase.error.partition", str(ctx.partitionId).encode()),
        ("twophase.error.row", str(row).encode()),
        ("twophase.error.bytes", str(size).encode()),
    ]
    theirs: list[tuple[str, str | bytes | None]] = [
        (str(k), v if isinstance(v, bytes) or v is None else str(v).encode())
        for k, v in headers or ()
    ]
    fixed = _headerBytes(ours) + RECORD_OVERHEAD_BYTES + 200  # + the cut and hash headers
    if fixed + _headerBytes(theirs) > limit:
        theirs = []  # the record's own headers do not fit beside ours: ours say more
    room = max(0, limit - fixed - _headerBytes(theirs))
    keptKey = None if wholeKey is None else wholeKey[: min(KEPT_BYTES, room // 2)]
    room -= len(keptKey or b"")
    keptValue = None if wholeValue is None else wholeValue[: min(KEPT_BYTES, room)]
    keyCut = wholeKey is not None and keptKey is not None and len(keptKey) < len(wholeKey)
    valueCut = wholeValue is not None and keptValue is not None and len(keptValue) < len(wholeValue)
    if valueCut or keyCut:
        cut = ",".join(name for name, was in (("key", keyCut), ("value", valueCut)) if was)
        ours.append(("twophase.error.truncated", cut.encode()))
    if valueCut and wholeValue is not None:
        ours.append(
            ("twophase.error.value.sha256", hashlib.sha256(wholeValue).hexdigest().encode())
        )
    extra = b"\x00dead-letter\x00" + reason.encode() + b"\x00" + (topic or "").encode()
    return DeadLetter(keptValue, keptKey, ours + theirs, extra)


def describeRefusal(reason: str, size: int, limit: int) -> str:
    """The ``twophase.error.message`` of a refusal."""
    if reason == TOO_LARGE:
        return (
            f"{size} bytes (key and value) over the producer's message.max.bytes of {limit} "
            "(MSG_SIZE_TOO_LARGE)"
        )
    return "the row's topic is null and the sink has no default topic (option topic)"
