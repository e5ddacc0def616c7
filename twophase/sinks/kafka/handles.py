"""The Kafka sink's handle: what a task prepared, checked before use and described for humans.

``{"kind": "kafka", "batchId", "partitionId", "attempt", "transactionalId", "producerId",
"producerEpoch", "records", "probe", "startedAtMs", "transactionTimeoutMs"}``; a handle of a
lingering transaction found by recovery has ``transactionalId``, ``producerId`` and ``state``.
"""

from __future__ import annotations

from twophase.coordinator.formats import checkHandleVersion
from twophase.protocol import Handle

KIND = "kafka"
"""The ``kind`` of every handle of the Kafka sink."""


def checkHandle(handle: Handle) -> Handle:
    """Refuse anything that is not a well-formed Kafka handle before talking to a broker."""
    if handle.get("kind") != KIND:
        raise ValueError(f"not a kafka handle (kind={handle.get('kind')!r}): {handle!r}")
    checkHandleVersion(handle, KIND)
    if not isinstance(handle.get("transactionalId"), str) or not handle["transactionalId"]:
        raise ValueError(f"kafka handle has no transactional id: {handle!r}")
    if not isinstance(handle.get("records"), int):
        raise ValueError(f"kafka handle has no record count: {handle!r}")
    if handle["records"] and not (
        isinstance(handle.get("producerId"), int) and isinstance(handle.get("producerEpoch"), int)
    ):
        raise ValueError(f"kafka handle has no producer id and epoch: {handle!r}")
    return handle


def describeHandle(handle: Handle) -> str:
    """``kafka batch N partition p attempt a: transactional id X (producer id P, epoch E)``."""
    if "batchId" in handle:
        text = (
            f"kafka batch {handle.get('batchId')} partition {handle.get('partitionId')} "
            f"attempt {handle.get('attempt')}: transactional id {handle.get('transactionalId')}"
        )
    else:  # a lingering transaction found by recoverAndAbort
        text = f"kafka {handle.get('state', 'open')} transaction {handle.get('transactionalId')}"
    if "producerId" in handle:
        text += f" (producer id {handle.get('producerId')}"
        if "producerEpoch" in handle:
            text += f", epoch {handle.get('producerEpoch')}"
        text += ")"
    if "records" in handle:
        text += f", {handle.get('records')} record(s)"
    return text
