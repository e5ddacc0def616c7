"""Was a transaction committed? Read its last record back as a ``read_committed`` consumer.

The driver asks when the broker no longer lets a handle's producer id and epoch end the
transaction: committed before (a repeated commit), or aborted (lost)?
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from enum import StrEnum

from twophase.clients.kafka import connectionConfig
from twophase.protocol import TransientCommitError
from twophase.redaction import redact

PROBE_GROUP_PREFIX = "twophase-probe-"
"""The probe's consumer groups: one per read, never joined or committed; librdkafka still
finds their coordinator, which needs DESCRIBE on the group."""


class ProbeVerdict(StrEnum):
    """What reading a transaction's last record back with ``read_committed`` says."""

    COMMITTED = "committed"
    ABORTED = "aborted"
    UNDECIDED = "undecided"
    """The partition's last stable offset is not past the record yet: ask again later."""
    GONE = "gone"
    """The record was deleted by retention: nothing can tell any more."""


def probeRecord(
    config: Mapping[str, str], topic: str, partition: int, offset: int, *, timeoutSeconds: float
) -> tuple[ProbeVerdict, str]:
    """Is the record at ``topic[partition]@offset`` visible to a ``read_committed`` consumer?

    Records of one transaction become visible together or never, so one record tells the
    outcome of its whole transaction once the partition's last stable offset is past it.
    """
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    where = f"record {topic}[{partition}]@{offset}"
    consumer = Consumer(
        {
            **connectionConfig(config),
            "group.id": f"{PROBE_GROUP_PREFIX}{uuid.uuid4().hex[:12]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        }
    )
    try:
        try:
            low, stable = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeoutSeconds, cached=False
            )
        except KafkaException as exc:
            raise TransientCommitError(
                f"kafka: reading offsets of {topic}[{partition}]: {redact(str(exc))}"
            ) from exc
        if offset < low:
            return ProbeVerdict.GONE, f"{where} was deleted (log start offset {low})"
        if stable <= offset:
            return ProbeVerdict.UNDECIDED, f"the last stable offset {stable} is not past {where}"
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + timeoutSeconds
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return (
                        ProbeVerdict.ABORTED,
                        f"{where} is not visible to read_committed consumers "
                        f"(the partition ends at {message.offset()})",
                    )
                if error.code() == KafkaError._AUTO_OFFSET_RESET:
                    return ProbeVerdict.GONE, f"{where} was deleted ({redact(error.str())})"
                raise TransientCommitError(f"kafka: reading {where}: {redact(error.str())}")
            if message.offset() == offset:
                return ProbeVerdict.COMMITTED, f"{where} is visible to read_committed consumers"
            return (
                ProbeVerdict.ABORTED,
                f"{where} is not visible to read_committed consumers (the next visible record "
                f"is at offset {message.offset()})",
            )
        return ProbeVerdict.UNDECIDED, f"no answer reading {where} within {timeoutSeconds:.0f} s"
    finally:
        consumer.close()
