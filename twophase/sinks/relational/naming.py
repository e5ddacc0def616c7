"""Transaction names of the relational sinks: one per task attempt, filterable by prefix.

Both the postgres sink (its gids) and the sql sink (its XA xids) write::

    tp1:<sinkId>:b<batch>:p<partition>:a<attempt>[:r<run>]:<nonce>

``sinkId`` never contains ``:`` (``SINK_ID_PATTERN``), so ``tp1:<sinkId>:`` prefixes exactly
that sink's names and ``tp1:<sinkId>:b<N>:`` exactly batch N's. The postgres sink writes the
``r<run>`` field (the context's run id made safe: hashed when long or unusual), the sql sink
leaves it out (MySQL/MariaDB keep at most 64 bytes of gtrid); ``parse`` reads both. The nonce
is random hex, so two attempts that share every number (a retried stage restarts attempt
numbers at 0) never collide. Recovery and ``twophase doctor`` read these names from decision
logs and servers: what is written must not change.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from twophase.protocol import TransactionContext
from twophase.settings import SINK_ID_PATTERN

VERSION_TAG = "tp1"
"""First field of every name: the layout version."""

NONCE_HEX_DIGITS = 8
"""Hex digits of the random nonce that new names carry."""

_RUN_SAFE = re.compile(r"^[A-Za-z0-9]{1,16}$")
_NONCE = re.compile(r"^[0-9a-f]{1,16}$")
_NAME = re.compile(
    r"^tp1:(?P<sink>[A-Za-z0-9][A-Za-z0-9_.-]{0,47}):b(?P<batch>\d{1,19}):p(?P<partition>\d{1,10})"
    r":a(?P<attempt>\d{1,10})(?::r(?P<run>[A-Za-z0-9]{0,16}))?:(?P<nonce>[0-9a-f]{1,16})$"
)


@dataclass(frozen=True)
class TransactionName:
    """The parts of one name; ``str()`` gives the name, ``TransactionName.parse`` reads one
    back. ``run`` is ``None`` in a name without the run field (the sql sink's)."""

    sinkId: str
    batchId: int
    partitionId: int
    attempt: int
    nonce: str
    run: str | None = None

    def __post_init__(self) -> None:
        if not SINK_ID_PATTERN.match(self.sinkId):
            raise ValueError(f"sink id {self.sinkId!r} cannot be used in a transaction name")
        if min(self.batchId, self.partitionId, self.attempt) < 0:
            raise ValueError(f"negative batch, partition or attempt in {self!r}")
        if self.run and not _RUN_SAFE.match(self.run):
            raise ValueError(f"run tag {self.run!r} must be 1-16 letters or digits")
        if not _NONCE.match(self.nonce):
            raise ValueError(f"nonce {self.nonce!r} must be 1-16 lower-case hex digits")

    def __str__(self) -> str:
        run = "" if self.run is None else f":r{self.run}"
        return (
            f"{VERSION_TAG}:{self.sinkId}:b{self.batchId}:p{self.partitionId}:a{self.attempt}"
            f"{run}:{self.nonce}"
        )

    @classmethod
    def forContext(cls, ctx: TransactionContext, *, withRun: bool) -> TransactionName:
        """A fresh name for one task attempt (a new random nonce on every call); ``withRun``
        adds the run field."""
        return cls(
            sinkId=ctx.sinkId,
            batchId=ctx.batchId,
            partitionId=ctx.partitionId,
            attempt=ctx.attemptNumber,
            nonce=secrets.token_hex(NONCE_HEX_DIGITS // 2),
            run=runTag(ctx.runId) if withRun else None,
        )

    @classmethod
    def parse(cls, text: str) -> TransactionName | None:
        """The parts of a name written by a relational sink, or ``None`` for any other."""
        match = _NAME.match(text)
        if match is None:
            return None
        return cls(
            sinkId=match["sink"],
            batchId=int(match["batch"]),
            partitionId=int(match["partition"]),
            attempt=int(match["attempt"]),
            nonce=match["nonce"],
            run=match["run"],
        )


def taskOf(text: str) -> dict[str, int]:
    """The batch, partition and attempt a name gives, as a handle's fields (``batchId``,
    ``partitionId``, ``attempt``); none for a name no relational sink wrote."""
    name = TransactionName.parse(text)
    if name is None:
        return {}
    return {"batchId": name.batchId, "partitionId": name.partitionId, "attempt": name.attempt}


def runTag(runId: str) -> str:
    """``runId`` as it appears in a name: kept when short and alphanumeric, else a hash."""
    if not runId:
        return ""
    if _RUN_SAFE.match(runId):
        return runId
    return hashlib.sha1(runId.encode()).hexdigest()[:12]


def sinkPrefix(sinkId: str) -> str:
    """The prefix shared by every name of one sink (and of no other sink)."""
    return f"{VERSION_TAG}:{sinkId}:"


def batchPrefix(sinkId: str, batchId: int) -> str:
    """The prefix shared by every name of one batch of one sink."""
    return f"{sinkPrefix(sinkId)}b{batchId}:"


__all__ = [
    "NONCE_HEX_DIGITS",
    "VERSION_TAG",
    "TransactionName",
    "batchPrefix",
    "runTag",
    "sinkPrefix",
    "taskOf",
]
