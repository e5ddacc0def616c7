"""The protocol's errors: try again later, a transaction gone, a sink that broke its contract."""

from __future__ import annotations


class TransientCommitError(Exception):
    """Raised by ``commit``/``abort`` when a retry may succeed (server down, timeout).

    The coordinator retries only these (with backoff); any other exception fails the batch
    at once, because retrying a permanent error hides it.
    """


class TransactionLostError(Exception):
    """A decided transaction can no longer be committed (the participant aborted it).

    Raised loudly with the batch, the participant and the transaction. When the sink
    fingerprints its handles (``Committer.fingerprint``) the coordinator has the batch's replay
    write it again; ``rewritable = False`` says the replay cannot be checked for this loss (a
    part of a composite handle without a fingerprint), and the query stops instead.
    """

    rewritable: bool = True


class SinkContractError(TypeError):
    """A sink's method returned something the framework cannot use.

    Names the sink class, the method, what it returned and what it must return, so the
    author of the sink sees the fix instead of a ``TypeError`` deep in the coordinator.
    """
