"""A batch's decision slot: the first record created there wins; a fence hands it to a newer run.

The decision of batch N is created in ``batch-N.decided.json`` only where nothing is (the
store's create-if-absent, :mod:`~twophase.coordinator.exclusive`), so of two deciders exactly
one wins and the other reads the winner. A driver that takes the log from an older one
(:mod:`~twophase.coordinator.runs`) must also stop the older one from deciding the batch it may
still be working on, and no check before that write can (the older driver can be frozen between
its check and its write). So the new run creates a *fence* in the slot itself: a record saying
"run e took the log here". A decider that meets a fence of a newer run than its own is fenced;
at a fence of its own run or of an older one it goes on to the slot's next link,
``batch-N.decided-<e>.json``, where the same rules hold (a third driver fences the link of the
second). Fences along a slot carry rising epochs, so the walk ends; the decision of N is the
one decision at the end of that chain: the slot itself, or after a takeover a link further.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from twophase.coordinator.records import (
    FENCED,
    BatchStatus,
    header,
    isoTime,
    linkName,
    recordName,
)
from twophase.coordinator.storage import CorruptRecord, LogStorage
from twophase.redaction import getLogger

log = getLogger(__name__)


WALK_LIMIT = 100
"""Steps a walk along a slot may take: each follows a fence of a newer run, or asks again after
the store said a record exists and then that it does not (a reset in between)."""


class SlotFenced(Exception):
    """A newer run fenced (or decided) the slot: the caller may not decide the batch."""

    def __init__(self, batchId: int, epoch: int) -> None:
        super().__init__(f"batch {batchId}: run {epoch} fenced its decision slot")
        self.batchId = batchId
        self.epoch = epoch


def isFence(body: dict[str, Any]) -> bool:
    return body.get("state") == FENCED


def fenceEpoch(body: dict[str, Any]) -> int:
    return int(body["epoch"])


def decide(
    storage: LogStorage, batchId: int, body: dict[str, Any], epoch: int | None, what: str
) -> dict[str, Any] | None:
    """Create ``body`` (a decision of run ``epoch``) at the end of N's slot; ``None`` once it is
    created, else the decision that was there first.

    Raises ``SlotFenced`` at a fence of a newer run. ``epoch=None`` (a coordinator that holds no
    run) is older than every run.
    """
    mine = epoch or 0
    name = recordName(batchId, BatchStatus.DECIDED)
    for _ in range(WALK_LIMIT):
        try:
            storage.publish(name, body, exclusive=True, what=what)
            return None
        except FileExistsError:
            pass
        try:
            existing = _read(storage, batchId, name, missing=True)
        except FileNotFoundError:
            continue  # removed since (a reset): create it again
        if existing is None:  # unreadable: only a hand could have made it so
            log.warning(
                "decision log %s: replacing an unreadable record %s of batch %d",
                storage.url,
                name,
                batchId,
            )
            storage.publish(name, body, exclusive=False, what=what)
            return None
        if not isFence(existing):
            return existing
        fencer = fenceEpoch(existing)
        if fencer > mine:
            raise SlotFenced(batchId, fencer)
        name = linkName(batchId, fencer)
    raise _endless(storage, batchId)


def fence(storage: LogStorage, batchId: int, epoch: int) -> bool:
    """Fence N's slot for run ``epoch``: True once no older run can decide N, False when N was
    decided first (by an older run, before the fence). Idempotent for the same run."""
    name = recordName(batchId, BatchStatus.DECIDED)
    body = {
        **header(),
        "batchId": batchId,
        "state": FENCED,
        "epoch": epoch,
        "fencedAt": isoTime(datetime.now(UTC)),
    }
    for _ in range(WALK_LIMIT):
        try:
            storage.publish(name, body, exclusive=True, what=f"the fence of batch {batchId}")
            return True
        except FileExistsError:
            pass
        try:
            existing = _read(storage, batchId, name, missing=True)
        except FileNotFoundError:
            continue
        if existing is None:
            raise CorruptRecord(
                f"{storage.path(name)} is unreadable, so run {epoch} cannot fence batch "
                f"{batchId}; restore the file from a backup of the checkpoint"
            )
        if not isFence(existing):
            return False
        fencer = fenceEpoch(existing)
        if fencer == epoch:
            return True
        if fencer > epoch:
            raise SlotFenced(batchId, fencer)
        name = linkName(batchId, fencer)
    raise _endless(storage, batchId)


def _endless(storage: LogStorage, batchId: int) -> CorruptRecord:
    return CorruptRecord(
        f"decision log {storage.url}: the decision slot of batch {batchId} did not settle in "
        f"{WALK_LIMIT} steps (the store kept saying a record exists and then that it does not); "
        "is another process resetting the log?"
    )


def decision(storage: LogStorage, batchId: int, path: str) -> dict[str, Any] | None:
    """The decision at the end of N's slot starting at ``path``, or ``None`` (none yet, or
    unreadable: ignored with a WARNING). Raises ``FileNotFoundError`` if ``path`` is gone."""
    body = _read(storage, batchId, path.rsplit("/", 1)[-1], path=path, missing=True)
    while body is not None and isFence(body):
        link = linkName(batchId, fenceEpoch(body))
        try:
            body = _read(storage, batchId, link, missing=True)
        except FileNotFoundError:
            return None
    return body


def _read(
    storage: LogStorage, batchId: int, name: str, *, path: str | None = None, missing: bool = False
) -> dict[str, Any] | None:
    """A slot record's body (decision or fence), checked to be one of batch N; ``None`` when
    unreadable. A missing file raises ``FileNotFoundError`` when ``missing``, else is ``None``."""
    where = path or storage.path(name)
    try:
        body = storage.readRecord(where)
        if body.get("batchId") != batchId or body.get("state") not in (FENCED, "decided"):
            raise CorruptRecord("its content names another batch or state")
        if isFence(body):
            fenceEpoch(body)
    except FileNotFoundError:
        if missing:
            raise
        return None
    except (CorruptRecord, KeyError, TypeError, ValueError) as exc:
        log.warning("decision log %s: ignoring record %s: %s", storage.url, where, exc)
        return None
    return body
