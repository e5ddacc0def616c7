"""The Kafka source's errors: it cannot go on without losing or inventing records, or the
cluster does not answer."""

from __future__ import annotations


class KafkaSourceError(RuntimeError):
    """The source cannot go on: data loss, a deleted partition, a record it cannot decode."""

    errorCode = "TWOPHASE_SOURCE_UNREADABLE"


class KafkaSourceUnreachableError(KafkaSourceError, ConnectionError):
    """The cluster cannot be read: no progress within the poll timeout, or an error of the
    client rather than of a partition's records (a restart may read it)."""

    errorCode = "TWOPHASE_UNREACHABLE"
