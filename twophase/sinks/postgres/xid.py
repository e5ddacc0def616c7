"""PostgreSQL global transaction ids (``PREPARE TRANSACTION '<gid>'``) of the postgres sink.

A gid names one task attempt's prepared transaction and must be unique in the whole server
(every database), readable by an operator looking at ``pg_prepared_xacts``, filterable by a
plain prefix (all of a sink's transactions, or all of one batch), and shorter than PostgreSQL's
limit of 200 bytes (``GIDSIZE``, terminating NUL included). The layout::

    tp1:<sinkId>:b<batch>:p<partition>:a<attempt>:r<run>:<nonce>

``sinkId`` never contains ``:`` (``SINK_ID_PATTERN``), so ``tp1:<sinkId>:`` is a prefix of
exactly that sink's gids and ``tp1:<sinkId>:b<N>:`` of exactly batch N's. ``run`` is the
context's run id made safe (hashed when long or unusual); ``nonce`` is random, so two attempts
that share every number (a stage retried by Spark restarts attempt numbers at 0) never collide.
The gid is not in psycopg's XA form (``<format>_<gtrid>_<bqual>``), so psycopg passes it as is.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from twophase.protocol import TransactionContext
from twophase.settings import SINK_ID_PATTERN

VERSION_TAG = "tp1"
"""First field of every gid: the layout version."""

MAX_GID_BYTES = 199
"""PostgreSQL keeps gids in a 200-byte buffer that includes the terminating NUL."""

_RUN_SAFE = re.compile(r"^[A-Za-z0-9]{1,16}$")
_GID = re.compile(
    r"^tp1:(?P<sink>[A-Za-z0-9][A-Za-z0-9_.-]{0,47}):b(?P<batch>\d{1,19}):p(?P<partition>\d{1,10})"
    r":a(?P<attempt>\d{1,10}):r(?P<run>[A-Za-z0-9]{0,16}):(?P<nonce>[0-9a-f]{1,16})$"
)


@dataclass(frozen=True)
class GlobalXid:
    """The parts of one gid; ``str()`` gives the gid, ``GlobalXid.parse`` reads one back."""

    sinkId: str
    batchId: int
    partitionId: int
    attempt: int
    run: str
    nonce: str

    def __post_init__(self) -> None:
        if not SINK_ID_PATTERN.match(self.sinkId):
            raise ValueError(f"sink id {self.sinkId!r} cannot be used in a PostgreSQL gid")
        if min(self.batchId, self.partitionId, self.attempt) < 0:
            raise ValueError(f"negative batch, partition or attempt in {self!r}")
        if self.run and not _RUN_SAFE.match(self.run):
            raise ValueError(f"run tag {self.run!r} must be 1-16 letters or digits")
        if not re.fullmatch(r"[0-9a-f]{1,16}", self.nonce):
            raise ValueError(f"nonce {self.nonce!r} must be 1-16 lower-case hex digits")

    def __str__(self) -> str:
        return (
            f"{VERSION_TAG}:{self.sinkId}:b{self.batchId}:p{self.partitionId}:a{self.attempt}"
            f":r{self.run}:{self.nonce}"
        )

    @classmethod
    def forContext(cls, ctx: TransactionContext) -> GlobalXid:
        """A fresh gid for one task attempt (a new random nonce on every call)."""
        gid = cls(
            sinkId=ctx.sinkId,
            batchId=ctx.batchId,
            partitionId=ctx.partitionId,
            attempt=ctx.attemptNumber,
            run=runTag(ctx.runId),
            nonce=secrets.token_hex(4),
        )
        if len(str(gid).encode()) > MAX_GID_BYTES:  # cannot happen with validated parts
            raise ValueError(f"gid {gid} is longer than {MAX_GID_BYTES} bytes")
        return gid

    @classmethod
    def parse(cls, gid: str) -> GlobalXid | None:
        """The parts of a gid written by this sink, or ``None`` for any other gid."""
        match = _GID.match(gid)
        if match is None:
            return None
        return cls(
            sinkId=match["sink"],
            batchId=int(match["batch"]),
            partitionId=int(match["partition"]),
            attempt=int(match["attempt"]),
            run=match["run"],
            nonce=match["nonce"],
        )


def runTag(runId: str) -> str:
    """``runId`` as it appears in a gid: kept when short and alphanumeric, else a hash."""
    if not runId:
        return ""
    if _RUN_SAFE.match(runId):
        return runId
    return hashlib.sha1(runId.encode()).hexdigest()[:12]


def sinkPrefix(sinkId: str) -> str:
    """The prefix shared by every gid of one sink (and of no other sink)."""
    return f"{VERSION_TAG}:{sinkId}:"


def batchPrefix(sinkId: str, batchId: int) -> str:
    """The prefix shared by every gid of one batch of one sink."""
    return f"{sinkPrefix(sinkId)}b{batchId}:"
