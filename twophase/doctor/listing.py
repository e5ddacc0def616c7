"""What a sink lists as prepared (``Committer.listPrepared``), as doctor's ``Held`` values.

The same listing and naming the framework's sweep uses (``twophase.protocol.sweep``), so what
doctor reports is what the next start's recovery finds; an inspect module adds only what its
system tells beyond that (Kafka's stalled partitions).
"""

from __future__ import annotations

from twophase.doctor.findings import Held
from twophase.protocol import Committer, Prepared, RecoveryScope


def heldOf(system: str, item: Prepared) -> Held:
    """One listed item as doctor holds it against the log (its ``key`` is its name)."""
    return Held(
        system=system,
        key=item.name,
        what=item.what,
        batchId=item.batchId,
        partitionId=item.partitionId,
        since=item.since,
        abortsAt=item.abortsAt,
        state=item.state,
        detail=item.detail,
        foreign=item.foreign,
        madeBySink=item.madeBySink,
    )


def listedHeld(committer: Committer, system: str, sinkId: str) -> list[Held]:
    """Read-only: everything ``committer`` lists as prepared for ``sinkId``, every batch."""
    return [heldOf(system, p) for p in committer.listPrepared(RecoveryScope(sinkId))]


__all__ = ["heldOf", "listedHeld"]
