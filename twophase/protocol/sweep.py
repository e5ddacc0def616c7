"""The sweep written once: list what a sink prepared, keep what a decision keeps, abort the rest.

A sink in the narrow form says three things on its ``Committer``: how a logged handle names
what it prepared on the system (``preparedNames``), what the system holds prepared under a
scope (``listPrepared``, as ``Prepared`` values) and how to abort one listed thing
(``abortPrepared``). ``sweepPrepared`` is the ``recoverAndAbort`` built from them, and
``twophase doctor`` reads the same names and listing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from twophase.protocol.handles import Handle, RecoveryScope
from twophase.redaction import getLogger

log = getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """One thing the system holds prepared under a sink's names, as ``listPrepared`` found it.

    ``name`` is what a logged handle names it by (``preparedNames``): a gid, an xid, a
    transactional id, a staging path. ``handle`` is what the sweep returns for it once aborted
    (for logs and ``twophase status``). ``foreign`` says why the sweep never touches it
    (another database, a name the sink does not make), else ``None``; ``madeBySink`` is false
    for a name the sweep does abort but the sink never makes. The rest is what the system tells
    about it, for ``twophase doctor``: ``abortsAt`` is when the system ends it on its own.
    """

    name: str
    handle: Handle
    what: str = "prepared transaction"
    batchId: int | None = None
    partitionId: int | None = None
    since: datetime | None = None
    abortsAt: datetime | None = None
    state: str | None = None
    detail: str = ""
    foreign: str | None = None
    madeBySink: bool = True
    parts: tuple[str, ...] = ()
    """What aborting it removes, when its name stands for several pieces (an attempt's staged
    files); for the sink's ``abortPrepared`` only."""


class Sweepable(Protocol):
    """The narrow form of a ``Committer``: what the framework's sweep calls."""

    @property
    def abortConcurrency(self) -> int: ...

    def preparedNames(self, handle: Handle) -> Iterable[str]: ...

    def listPrepared(self, scope: RecoveryScope) -> Iterable[Prepared]: ...

    def abortPrepared(self, item: Prepared) -> bool | None: ...


def keptNames(committer: Sweepable, scope: RecoveryScope) -> set[str]:
    """Every name the kept handles of ``scope`` give on the committer's system."""
    return {name for h in scope.keep for name in committer.preparedNames(h)}


def toAbort(committer: Sweepable, scope: RecoveryScope) -> list[Prepared]:
    """What the sweep of ``scope`` aborts: the listing, less the kept and the foreign."""
    kept = keptNames(committer, scope)
    return [p for p in committer.listPrepared(scope) if p.foreign is None and p.name not in kept]


def sweepPrepared(committer: Sweepable, scope: RecoveryScope) -> list[Handle]:
    """``recoverAndAbort`` in the narrow form: list, drop the kept, abort the rest.

    Aborts up to ``committer.abortConcurrency`` items at once. An item ``abortPrepared``
    reports as gone already (``False``) is left out of the result. Returns the aborted items'
    handles, in listing order.
    """
    targets = toAbort(committer, scope)
    if not targets:
        return []
    width = max(1, min(int(committer.abortConcurrency), len(targets)))
    if width == 1:
        done: Sequence[bool | None] = [committer.abortPrepared(p) for p in targets]
    else:
        with ThreadPoolExecutor(max_workers=width) as pool:
            done = list(pool.map(committer.abortPrepared, targets))
    aborted = [p for p, ok in zip(targets, done, strict=True) if ok is not False]
    if aborted:
        log.info(
            "%s: recoverAndAbort aborted %d leftover(s) of sink %s: %s",
            aborted[0].handle.get("kind") or type(committer).__name__,
            len(aborted),
            scope.sinkId,
            ", ".join(p.name for p in aborted),
        )
    return [p.handle for p in aborted]


__all__ = ["Prepared", "Sweepable", "keptNames", "sweepPrepared", "toAbort"]
