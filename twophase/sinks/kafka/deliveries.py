"""Delivery reports of one Kafka transaction: records acknowledged, the first errors, a probe,
and the records the broker refused as too large."""

from __future__ import annotations

from confluent_kafka import KafkaError, Message

from twophase.redaction import redact

QUEUE_FULL = KafkaError._QUEUE_FULL
MSG_SIZE_TOO_LARGE = KafkaError.MSG_SIZE_TOO_LARGE


class Deliveries:
    """The delivery-report callback of one transaction: counts, the first errors, a probe."""

    __slots__ = ("acked", "failed", "errors", "last", "tooLarge", "tooLargeError")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.acked = 0
        self.failed = 0
        self.errors: list[str] = []
        self.last: Message | None = None
        self.tooLarge: dict[tuple[str, int], int] = {}
        """Records refused as too large, by topic and partition."""
        self.tooLargeError: KafkaError | None = None

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.acked += 1
            self.last = msg
            return
        self.failed += 1
        if err.code() == MSG_SIZE_TOO_LARGE:
            where = (str(msg.topic()), int(msg.partition() or 0))
            self.tooLarge[where] = self.tooLarge.get(where, 0) + 1
            self.tooLargeError = self.tooLargeError or err
        if len(self.errors) < 5:
            self.errors.append(redact(f"{msg.topic()} [{msg.partition()}]: {err.str()}"))
