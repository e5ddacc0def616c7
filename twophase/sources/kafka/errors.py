"""The Kafka source's error: it cannot go on without losing or inventing records."""

from __future__ import annotations


class KafkaSourceError(RuntimeError):
    """The source cannot go on: data loss, a deleted partition, or the cluster cannot be read."""
