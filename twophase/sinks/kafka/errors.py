"""The Kafka sink's own errors: a task that cannot write, a commit nobody can settle."""

from __future__ import annotations


class KafkaWriteError(RuntimeError):
    """A record could not be written into the task's transaction; the task fails."""


class KafkaCommitError(RuntimeError):
    """A commit that is neither done nor provably lost, and that retrying will not settle."""
