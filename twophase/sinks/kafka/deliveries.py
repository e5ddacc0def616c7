"""Delivery reports of one Kafka transaction: records acknowledged, the first errors, a probe."""

from __future__ import annotations

from confluent_kafka import KafkaError, Message

from twophase.redaction import redact

QUEUE_FULL = KafkaError._QUEUE_FULL


class Deliveries:
    """The delivery-report callback of one transaction: counts, the first errors, a probe."""

    __slots__ = ("acked", "failed", "errors", "last")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.acked = 0
        self.failed = 0
        self.errors: list[str] = []
        self.last: Message | None = None

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.acked += 1
            self.last = msg
            return
        self.failed += 1
        if len(self.errors) < 5:
            self.errors.append(redact(f"{msg.topic()} [{msg.partition()}]: {err.str()}"))
