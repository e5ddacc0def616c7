"""Transaction ids of the sql sink: one per task attempt, filterable by the sink's prefix.

The layout is ``tp1:<sinkId>:b<batch>:p<partition>:a<attempt>:<nonce>``. ``sinkId`` never
contains ``:``, so ``tp1:<sinkId>:`` prefixes exactly that sink's xids and
``tp1:<sinkId>:b<N>:`` exactly batch N's. The nonce is random, so two attempts that share every
number (a retried stage restarts attempt numbers) never collide. MySQL and MariaDB keep the
xid as an XA ``gtrid`` of at most 64 bytes (``XA BEGIN '<xid>'``, empty ``bqual``, format 1);
PostgreSQL's gids hold 199. ``checkXidRoom`` refuses, before any data is written, a sink id
that leaves too little room for the numbers.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from twophase.protocol import TransactionContext
from twophase.sinks.sql.errors import XidTooLongError

VERSION_TAG = "tp1"

_XID = re.compile(
    r"^tp1:(?P<sink>[A-Za-z0-9][A-Za-z0-9_.-]{0,47}):b(?P<batch>\d{1,19}):p(?P<partition>\d{1,10})"
    r":a(?P<attempt>\d{1,10}):(?P<nonce>[0-9a-f]{8})$"
)

ROOM_BATCH_DIGITS = 12
"""Digits of batch id that ``checkXidRoom`` keeps room for (a trillion micro-batches)."""
ROOM_PARTITION_DIGITS = 6
ROOM_ATTEMPT_DIGITS = 3


@dataclass(frozen=True)
class SqlXid:
    """The parts of one xid; ``str()`` gives the xid, ``SqlXid.parse`` reads one back."""

    sinkId: str
    batchId: int
    partitionId: int
    attempt: int
    nonce: str

    def __str__(self) -> str:
        return (
            f"{VERSION_TAG}:{self.sinkId}:b{self.batchId}:p{self.partitionId}:a{self.attempt}"
            f":{self.nonce}"
        )

    @classmethod
    def forContext(cls, ctx: TransactionContext, maxBytes: int) -> SqlXid:
        """A fresh xid for one task attempt; ``XidTooLongError`` past ``maxBytes``."""
        xid = cls(ctx.sinkId, ctx.batchId, ctx.partitionId, ctx.attemptNumber, secrets.token_hex(4))
        if len(str(xid).encode()) > maxBytes:
            raise XidTooLongError(_tooLong(ctx.sinkId, str(xid), maxBytes))
        return xid

    @classmethod
    def parse(cls, text: str) -> SqlXid | None:
        """The parts of an xid written by this sink, or ``None`` for any other."""
        m = _XID.match(text)
        if m is None:
            return None
        return cls(m["sink"], int(m["batch"]), int(m["partition"]), int(m["attempt"]), m["nonce"])


def sinkPrefix(sinkId: str) -> str:
    """The prefix of every xid of one sink (and of no other sink)."""
    return f"{VERSION_TAG}:{sinkId}:"


def batchPrefix(sinkId: str, batchId: int) -> str:
    """The prefix of every xid of one batch of one sink."""
    return f"{sinkPrefix(sinkId)}b{batchId}:"


def checkXidRoom(sinkId: str, maxBytes: int) -> None:
    """Driver, before a batch: refuse a sink id whose xids could pass ``maxBytes``."""
    widest = str(
        SqlXid(
            sinkId,
            10**ROOM_BATCH_DIGITS - 1,
            10**ROOM_PARTITION_DIGITS - 1,
            10**ROOM_ATTEMPT_DIGITS - 1,
            "0" * 8,
        )
    )
    if len(widest.encode()) > maxBytes:
        raise XidTooLongError(_tooLong(sinkId, widest, maxBytes))


def _tooLong(sinkId: str, xid: str, maxBytes: int) -> str:
    spare = len(xid.encode()) - maxBytes
    return (
        f"sql sink: transaction id {xid!r} is {len(xid.encode())} bytes; the server takes at "
        f"most {maxBytes} (MySQL/MariaDB XA gtrid). Nothing was written. Set option sinkId to "
        f"at most {max(1, len(sinkId) - spare)} characters (it is {len(sinkId)}: "
        f"{sinkId!r}), or leave it unset (the default is 15 characters)."
    )


__all__ = ["SqlXid", "batchPrefix", "checkXidRoom", "sinkPrefix"]
