"""Reading one batch's state from its records: the last complete one wins, torn ones are skipped.

The state of batch N is committed if a readable committed record exists, else decided if its
decision slot ends in a readable decision (:mod:`~twophase.coordinator.slots`), else aborted;
a later ``decided(N)`` thus overrides ``aborted(N)`` (Spark may replay an aborted batch). A
record that is torn, garbage or names another batch is ignored with a WARNING, never taken for
a record. The ``rewrite(N)`` record beside a decision is the exception: losing its list of lost
partitions must not pass for "nothing lost", so an unreadable one raises
``DecisionConflictError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twophase.coordinator import slots
from twophase.coordinator.errors import DecisionConflictError
from twophase.coordinator.records import BatchState, BatchStatus, LoggedHandle, parseTimeOrNone
from twophase.coordinator.storage import CorruptRecord, LogStorage
from twophase.redaction import getLogger

log = getLogger(__name__)


def readState(
    storage: LogStorage, batchId: int, paths: Mapping[BatchStatus, str]
) -> BatchState | None:
    """The state of batch N from the records ``paths`` names, or ``None`` if none is readable."""
    bodies: dict[BatchStatus, dict[str, Any]] = {}
    for status in (BatchStatus.COMMITTED, BatchStatus.DECIDED, BatchStatus.ABORTED):
        if status not in paths or (status is BatchStatus.ABORTED and bodies):
            continue
        try:
            if status is BatchStatus.DECIDED:
                found = slots.decision(storage, batchId, paths[status])
                if found is None:  # a fence with no decision after it yet, or unreadable
                    continue
                body = found
            else:
                body = storage.readRecord(paths[status])
            if body.get("batchId") != batchId or body.get("state") != str(status):
                raise CorruptRecord("its content names another batch or state")
            handles = tuple(LoggedHandle.fromJson(h) for h in body.get("handles", ()))
        except FileNotFoundError:
            continue  # pruned or reset between listing and reading
        except (CorruptRecord, KeyError, TypeError, ValueError) as exc:
            log.warning("decision log %s: ignoring record %s: %s", storage.url, paths[status], exc)
            continue
        body["_handles"] = handles
        bodies[status] = body
    if not bodies:
        return None
    status = next(iter(bodies))
    rewrite = _readRewrite(storage, batchId, paths) if BatchStatus.DECIDED in bodies else {}
    decided = bodies.get(BatchStatus.DECIDED, {})
    committed = bodies.get(BatchStatus.COMMITTED, {})
    aborted = bodies.get(BatchStatus.ABORTED, {})
    return BatchState(
        batchId,
        status,
        decided.get("_handles", ()),
        queryId=decided.get("queryId"),
        epoch=_epochOf(decided),
        decidedAt=parseTimeOrNone(decided.get("decidedAt")),
        committedAt=parseTimeOrNone(committed.get("committedAt")),
        abortedAt=parseTimeOrNone(aborted.get("abortedAt")),
        commitSeconds=committed.get("commitSeconds"),
        awaitingRewrite=rewrite.get("awaiting", ()),
        lostPartitions=rewrite.get("lost", ()),
        replacements=rewrite.get("replacements", ()),
    )


def _epochOf(body: Mapping[str, Any]) -> int | None:
    epoch = body.get("epoch")
    return int(epoch) if isinstance(epoch, int) else None


def _readRewrite(
    storage: LogStorage, batchId: int, paths: Mapping[BatchStatus, str]
) -> dict[str, Any]:
    """The rewrite record of N as ``lost``, ``awaiting`` and ``replacements``, or ``{}``."""
    path = paths.get(BatchStatus.REWRITE)
    if path is None:
        return {}
    try:
        body = storage.readRecord(path)
        if body.get("batchId") != batchId or body.get("state") != str(BatchStatus.REWRITE):
            raise CorruptRecord("its content names another batch or state")
        lost = tuple(sorted(int(p) for p in body["lost"]))
        replacements = tuple(LoggedHandle.fromJson(h) for h in body.get("replacements", ()))
    except FileNotFoundError:
        return {}
    except (CorruptRecord, KeyError, TypeError, ValueError) as exc:
        # Unreadable: losing the list of lost partitions must not pass for "nothing lost".
        raise DecisionConflictError(
            f"decision log {storage.url}: the rewrite record of decided batch {batchId} "
            f"({path}) is unreadable ({exc}); it names partitions whose transactions were "
            "lost. Restore it from a backup of the checkpoint, or move the checkpoint "
            "aside and rebuild the topic from the source."
        ) from None
    replaced = {h.partitionId for h in replacements}
    return {
        "lost": lost,
        "awaiting": tuple(p for p in lost if p not in replaced),
        "replacements": replacements,
    }
