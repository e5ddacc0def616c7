"""The Kafka sink's own errors: a task that cannot write, a commit nobody can settle.

Each is a ``KafkaSystemError``: it names Kafka as its system, and the command line gives
Kafka's fix for it.
"""

from __future__ import annotations

from twophase.clients.kafka.errors import KafkaSystemError
from twophase.protocol.errors import SinkFailure


class KafkaWriteError(KafkaSystemError, RuntimeError):
    """A record could not be written into the task's transaction; the task fails."""


class RecordTooLargeError(KafkaWriteError):
    """A record over the producer's ``message.max.bytes`` or the topic's
    ``max.message.bytes``: names the batch, partition, topic, the record's position and size,
    the limit and the fix (see ``oversize``); the client's error is chained."""


class KafkaCommitError(KafkaSystemError, RuntimeError):
    """A commit that is neither done nor provably lost, and that retrying will not settle."""


class KafkaAccessError(KafkaSystemError, PermissionError):
    """The brokers refused the sink's principal: its credentials (a wrong password, a mechanism
    not offered, a certificate its CA does not sign) or an ACL it lacks. Names the broker, the
    principal, the missing ACL and the ``kafka-acls.sh`` line that grants it; never retried."""

    reason = SinkFailure.CREDENTIALS
