"""How hard the coordinator drives a decision forward: retries, time budget, log retention.

The one home of these defaults: a sink's options (``twophase.settings.SinkSettings``) and
``twophase recover`` both build their ``CoordinatorSettings`` from them.
"""

from __future__ import annotations

from dataclasses import dataclass

REWRITE_MISMATCH_OPTION = "twophase.rewriteMismatch"
REWRITE_MISMATCH_CHOICES = ("fail", "write")


@dataclass(frozen=True)
class CoordinatorSettings:
    """How hard the coordinator drives a decision forward, and how much log it keeps.

    commitRetries: retries of a handle's commit/abort after a ``TransientCommitError`` (so at
        most ``commitRetries + 1`` attempts); other errors are never retried.
    commitTimeoutSeconds: the time budget of one batch's commits, retries included.
    retentionBatches: finished batches whose records the log keeps (older ones are pruned).
    maxParallelCommits: handles committed at the same time.
    retryInitialSeconds, retryMaxSeconds: exponential backoff with full jitter between retries.
    rewriteMismatch: what to do when the replay of a batch gives other records for a partition
        whose decided transaction the participant aborted: ``fail`` (stop, write nothing) or
        ``write`` (write the replay's records for it, with a warning).
    """

    commitRetries: int = 8
    commitTimeoutSeconds: float = 120.0
    retentionBatches: int = 100
    maxParallelCommits: int = 16
    retryInitialSeconds: float = 0.2
    retryMaxSeconds: float = 10.0
    rewriteMismatch: str = "fail"

    def __post_init__(self) -> None:
        for name, minimum in (
            ("commitRetries", 0),
            ("commitTimeoutSeconds", 0),
            ("retentionBatches", 0),
            ("maxParallelCommits", 1),
            ("retryInitialSeconds", 0),
            ("retryMaxSeconds", 0),
        ):
            value = getattr(self, name)
            if value < minimum:
                raise ValueError(f"coordinator setting {name} must be >= {minimum}, got {value}")
        if self.rewriteMismatch not in REWRITE_MISMATCH_CHOICES:
            raise ValueError(
                f"option {REWRITE_MISMATCH_OPTION}={self.rewriteMismatch!r}: use one of "
                f"{', '.join(REWRITE_MISMATCH_CHOICES)}"
            )
