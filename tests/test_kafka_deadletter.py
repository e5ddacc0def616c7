"""The dead-letter record of a row Kafka refused: what it keeps, and that it fits itself."""

from __future__ import annotations

import hashlib

from twophase.protocol import TransactionContext
from twophase.sinks.kafka.deadletter import (
    KEPT_BYTES,
    NULL_TOPIC,
    TOO_LARGE,
    DeadLetter,
    deadLetter,
)

CTX = TransactionContext("orders", "q", 7, 2, 0)


def wireBytes(letter: object) -> int:
    value, key, headers = letter.value, letter.key, letter.headers  # type: ignore[attr-defined]
    sizes = [len(k.encode()) + len(v or b"") for k, v in headers]
    return len(value or b"") + len(key or b"") + sum(sizes)


def test_a_large_record_keeps_its_head_its_size_and_its_hash() -> None:
    value = b"v" * 50_000
    letter = deadLetter(
        CTX,
        reason=TOO_LARGE,
        error="too big",
        topic="events",
        row=3,
        value=value,
        key="k",
        size=50_001,
        limit=1_000_000,
    )
    headers = dict(letter.headers)
    assert letter.value == value[:KEPT_BYTES] and letter.key == b"k"
    assert headers["twophase.error.truncated"] == b"value"
    assert headers["twophase.error.value.sha256"] == hashlib.sha256(value).hexdigest().encode()
    assert (headers["twophase.error.row"], headers["twophase.error.batch"]) == (b"3", b"7")


def test_under_a_small_producer_limit_the_dead_letter_record_still_fits() -> None:
    """The limit that refused the record bounds its dead-letter record too: less is kept, and
    the record's own headers give way to twophase's when both do not fit."""
    own = [("trace", b"t" * 3000)]

    def letterOf(key: bytes, limit: int) -> DeadLetter:
        return deadLetter(
            CTX,
            reason=TOO_LARGE,
            error="too big",
            topic="events",
            row=0,
            value=b"v" * 20_000,
            key=key,
            size=20_000 + len(key),
            limit=limit,
            headers=own,
        )

    for limit in (1200, 4000, 9000):
        letter = letterOf(b"k" * 5000, limit)
        assert wireBytes(letter) + 256 <= limit, limit
        assert dict(letter.headers)["twophase.error.truncated"] == b"key,value"
    roomy = letterOf(b"k", 100_000)
    assert ("trace", b"t" * 3000) in roomy.headers


def test_a_null_topic_row_is_kept_whole_and_its_position_is_not_fingerprinted() -> None:
    first, later = (
        deadLetter(
            CTX,
            reason=NULL_TOPIC,
            error="no topic",
            topic=None,
            row=row,
            value="abc",
            key=None,
            size=3,
            limit=1_000_000,
        )
        for row in (1, 9)
    )
    assert first.value == b"abc" and first.key is None
    assert "twophase.error.truncated" not in dict(first.headers)
    assert first.fingerprintExtra == later.fingerprintExtra
