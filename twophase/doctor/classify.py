"""Holding a system's inspection against a sink's decision log: one finding per thing to settle.

What the next start (or ``twophase recover``) does decides each finding's fix, so the rules
follow the coordinator's recovery: it commits every handle of a decided, unfinished batch, and
then aborts every transaction with the sink's naming that no such handle names
(``recoverAndAbort``), whichever query left it.

- a decided batch not marked committed: ``decided-unfinished`` (with which of its transactions
  the system still holds, and when Kafka would abort them);
- a decided batch with partitions whose transactions the system aborted by itself:
  ``awaiting-rewrite``; only the query's restart can write them again (Spark's replay);
- a held transaction of this query that no decision names: ``undecided`` (an orphan the next
  start aborts), or ``in-flight`` when younger than ``--in-flight-seconds``;
- a held transaction no decision of this log can explain: ``unknown-to-log`` when recovery
  would abort it anyway (it began before this log was created, or belongs to a batch beyond
  the next one this query can run), ``foreign`` when recovery never touches it (the sink's
  prefix but not its naming, or another database);
- nothing of the above: ``clean``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from twophase.coordinator import DecisionLog
from twophase.coordinator.records import BatchState, LoggedHandle, LogOwner
from twophase.doctor.findings import Finding, Held, Inspection, Kind, Stall
from twophase.doctor.nextstart import Unfinished
from twophase.protocol import Handle

CLOCK_SKEW_SECONDS = 60.0
"""How much earlier than the log's creation a system's clock may date this query's first
transactions (the server's clock against the driver's) before doctor calls them another's."""

HandleKey = Callable[[Handle], "str | tuple[str, ...] | None"]
"""What a logged handle names in its system: one key, several (one per target of a
``twophase.multi`` handle), or none."""
"""The value a system's ``Held.key`` would have for a logged handle, or ``None``."""


@dataclass(frozen=True)
class Commands:
    """The commands a finding may offer, spelled for this checkpoint and sink."""

    checkpoint: str
    sinkId: str
    extraOptionKeys: tuple[str, ...] = ()

    @property
    def recover(self) -> str:
        options = "".join(f" --sink-option {k}=..." for k in self.extraOptionKeys)
        return f"twophase recover --checkpoint {self.checkpoint} --sink-id {self.sinkId}{options}"


def classify(
    sinkId: str,
    decisionLog: DecisionLog,
    inspection: Inspection | None,
    handleKey: HandleKey | None,
    commands: Commands,
    now: datetime,
    inFlightSeconds: float = 0.0,
) -> list[Finding]:
    """The findings of one sink: its log's open decisions against what the system holds.

    ``inspection`` is ``None`` for a sink doctor cannot ask (a user's sink): only the log's
    decided, unfinished batches are reported then.
    """
    outstanding = decisionLog.outstanding()
    lastDecided = decisionLog.lastDecided()
    owner = decisionLog.owner()
    held = list(inspection.held) if inspection is not None else []
    keyOf = handleKey or (lambda h: None)

    findings: list[Finding] = []
    named: set[str] = set()
    for state in outstanding:
        handles = _decisionHandles(state)
        keys = {k for h in handles for k in _keys(keyOf(h.handle))}
        named |= keys
        mine = tuple(h for h in held if h.key in keys)
        findings.append(_decided(sinkId, state, handles, mine, inspection, commands, now))

    for item in held:
        if item.key in named:
            continue
        findings.append(_orphan(sinkId, item, lastDecided, owner, commands, now, inFlightSeconds))

    if inspection is not None and inspection.otherStalls:
        findings.append(_stalledElsewhere(sinkId, inspection.otherStalls))
    if not any(f.needsAction or f.kind is Kind.IN_FLIGHT for f in findings):
        asked = f"{inspection.system} at {inspection.where}" if inspection else "the log only"
        findings.insert(
            0,
            Finding(
                sinkId,
                Kind.CLEAN,
                f"clean: no decided batch waits for its commit, and {asked} holds nothing of "
                "this sink"
                if inspection is not None
                else f"clean as far as the log tells: no decided batch waits ({asked})",
                "nothing to do",
                facts={"lastDecided": lastDecided},
            ),
        )
    return findings


def _keys(found: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if found is None:
        return ()
    return (found,) if isinstance(found, str) else found


def _decisionHandles(state: BatchState) -> list[LoggedHandle]:
    """The handles a decided batch still has to commit: the decision's and its replacements'."""
    replacements: Sequence[LoggedHandle] = getattr(state, "replacements", ()) or ()
    return [*state.handles, *replacements]


def _decided(
    sinkId: str,
    state: BatchState,
    handles: list[LoggedHandle],
    mine: tuple[Held, ...],
    inspection: Inspection | None,
    commands: Commands,
    now: datetime,
) -> Finding:
    awaiting = tuple(int(p) for p in getattr(state, "awaitingRewrite", ()) or ())
    facts: dict[str, object] = {
        "decidedAt": state.decidedAt.isoformat() if state.decidedAt else None,
        "transactions": len(state.handles),
        "stillHeld": len(mine),
    }
    soonest = min((h.abortsAt for h in mine if h.abortsAt is not None), default=None)
    if soonest is not None:
        facts["abortsInSeconds"] = round((soonest - now).total_seconds(), 1)
    unfinished = Unfinished.of(state)
    if awaiting:
        facts["awaitingRewrite"] = list(awaiting)
        return Finding(
            sinkId,
            Kind.AWAITING_REWRITE,
            unfinished.describe(),
            unfinished.fix(commands.recover),
            batchId=state.batchId,
            held=mine,
            facts=facts,
        )
    if inspection is None:
        held = "the system was not asked"
    elif mine:
        held = f"{len(mine)} of its {len(state.handles)} transaction(s) still held"
    else:
        held = (
            f"none of its {len(state.handles)} transaction(s) is held any more (committed "
            "before the log was marked, or lost: recover tells which)"
        )
    urgency = ""
    if soonest is not None:
        left = (soonest - now).total_seconds()
        which = "it" if len(mine) == 1 else "the first"
        urgency = (
            f"; the broker aborts {which} in {_duration(left)} unless it is committed first"
            if left > 0
            else "; the broker is aborting them now (timeout passed)"
        )
    return Finding(
        sinkId,
        Kind.DECIDED_UNFINISHED,
        f"{unfinished.describe()}; {held}{urgency}",
        unfinished.fix(commands.recover),
        batchId=state.batchId,
        held=mine,
        facts=facts,
    )


def _orphan(
    sinkId: str,
    item: Held,
    lastDecided: int | None,
    owner: LogOwner | None,
    commands: Commands,
    now: datetime,
    inFlightSeconds: float,
) -> Finding:
    ageSeconds = (now - item.since).total_seconds() if item.since is not None else None
    facts: dict[str, object] = {"ageSeconds": None if ageSeconds is None else round(ageSeconds)}
    if item.abortsAt is not None:
        facts["abortsInSeconds"] = round((item.abortsAt - now).total_seconds(), 1)
    what = f"{item.system} {item.what}"
    if item.foreign is not None:
        return Finding(
            sinkId,
            Kind.FOREIGN,
            f"{what}, unknown to the log, that twophase never touches: {item.foreign}",
            _foreignFix(item),
            batchId=item.batchId,
            held=(item,),
            facts=facts,
        )
    createdAt = owner.createdAt if owner is not None else None
    nextBatch = -1 if lastDecided is None else lastDecided
    beyond = item.batchId is not None and item.batchId > nextBatch + 1
    older = (
        item.since is not None
        and createdAt is not None
        and (createdAt - item.since).total_seconds() > CLOCK_SKEW_SECONDS
    )
    if beyond or older or not item.madeBySink:
        if not item.madeBySink:
            why = "its name has the sink's prefix but is not one the sink makes"
        elif beyond:
            why = f"its batch {item.batchId} is beyond the next one this query can run"
            why += f" ({nextBatch + 1})"
        else:
            why = "it began before this log was created"
        return Finding(
            sinkId,
            Kind.UNKNOWN,
            f"{what}, unknown to the log: {why}; another query with the same sink id (an "
            "earlier checkpoint, or a second query) or someone by hand left it",
            f"if no other running query uses sink id {sinkId}: {commands.recover} aborts it; "
            "if one does, do not recover: give one of the queries its own sinkId first "
            "(this query's next start would abort the other's transactions)",
            batchId=item.batchId,
            held=(item,),
            facts=facts,
        )
    if ageSeconds is not None and ageSeconds < inFlightSeconds:
        return Finding(
            sinkId,
            Kind.IN_FLIGHT,
            f"{what}, not decided yet and {_duration(ageSeconds)} old: a running query's "
            "current batch",
            "nothing to do while the query runs",
            batchId=item.batchId,
            held=(item,),
            facts=facts,
        )
    timeout = ""
    if item.abortsAt is not None:
        left = (item.abortsAt - now).total_seconds()
        timeout = f"; the broker aborts it in {_duration(left)}" if left > 0 else "; timed out"
    stalls = (
        f"; read_committed readers of {', '.join(s.name for s in item.stalls)} wait behind it"
        if item.stalls
        else ""
    )
    return Finding(
        sinkId,
        Kind.UNDECIDED,
        f"{what}, prepared but never decided: an orphan the query's next start aborts"
        f"{timeout}{stalls}",
        f"{commands.recover}   (aborts it now, with the query stopped; or restart the query)",
        batchId=item.batchId,
        held=(item,),
        facts=facts,
    )


def _foreignFix(item: Held) -> str:
    if item.system == "postgres":
        return (
            "find its owner; if nothing owns it, end it by hand in its database: "
            f"ROLLBACK PREPARED '{item.key}' (or COMMIT PREPARED, if its owner decided so)"
        )
    if item.system == "kafka":
        return (
            "find its owner; if nothing owns it, fence it (a producer initialising transactions "
            f"with transactional.id={item.key} aborts it) or wait for the broker's timeout"
        )
    return f"find its owner; if nothing owns it, delete {item.key} by hand"


def _stalledElsewhere(sinkId: str, stalls: list[Stall]) -> Finding:
    return Finding(
        sinkId,
        Kind.STALLED_ELSEWHERE,
        f"read_committed readers of {', '.join(s.name for s in stalls)} wait behind an open "
        "transaction that is not this sink's",
        "nothing for twophase to do: find the producer with kafka-transactions.sh find-hanging",
        facts={"stalledPartitions": [s.toJson() for s in stalls]},
    )


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
