"""The driver half of the protocol: finish or discard prepared transactions, from any process.

A ``Committer`` sees only handles (JSON values in the decision log), never an open transaction,
so the Spark driver, a restarted query or ``twophase recover`` on another machine can all use it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from twophase.protocol.handles import Handle, RecoveryScope, dumpsHandle


class Committer(ABC):
    """Every method is idempotent: a restart may call it again for the same handle.

    ``commit`` makes a prepared transaction visible, ``abort`` discards one, ``recoverAndCommit``
    commits a handle of a batch decided before a restart, ``recoverAndAbort`` sweeps this sink's
    prepared transactions that no decision keeps. Raise ``TransientCommitError`` when a retry
    may succeed and ``TransactionLostError`` when a decided transaction is gone.
    """

    @abstractmethod
    def commit(self, handle: Handle) -> None:
        """Idempotent: make a prepared transaction visible; no-op when already done."""

    @abstractmethod
    def abort(self, handle: Handle) -> None:
        """Idempotent: discard a prepared transaction; no-op when already gone."""

    def recoverAndCommit(self, handle: Handle) -> None:
        """Idempotent: commit a handle of a decided batch after a restart."""
        self.commit(handle)

    @abstractmethod
    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle] | None:
        """Idempotent: abort this sink's prepared transactions that no decision keeps.

        Returns what it aborted, for logs and ``twophase status`` (``None`` means nothing).
        """

    def completeBatch(  # noqa: B027 - optional hook
        self, sinkId: str, batchId: int, handles: Sequence[Handle]
    ) -> None:
        """Idempotent: after every handle of decided batch ``batchId`` is committed, publish the
        batch as one unit; a retry after a crash calls it again, so it must recognise its own
        earlier success.

        Default: nothing (each handle's ``commit`` made its part visible). A table format that
        makes a whole batch visible in one log commit (``twophase.delta``) does that commit
        here, once per batch instead of once per task; the coordinator calls it with the
        batch's live handles before it writes ``committed(N)``, batches in order.
        """

    def commitReplacement(self, original: Handle, replacement: Handle) -> None:
        """Idempotent: commit the replay's handle that stands for a decided, lost ``original``.

        Default: ``commit(replacement)``. A sink whose handle spans several transactions (one
        per target of ``twophase.multi``) commits the replacement's part only where the
        original's part is lost, and aborts the rest, so what did commit is not written twice.
        """
        self.commit(replacement)

    def fingerprint(self, handle: Handle) -> str | None:
        """The fingerprint of the records ``handle`` holds (``twophase.protocol.fingerprint``).

        A sink whose participant can abort a decided transaction on its own (Kafka's transaction
        timeout) returns the one its writer put in the handle: the coordinator then writes a lost
        partition again from Spark's replay of the batch, once the replay's fingerprint matches.
        ``None`` (the default): a lost decided transaction stops the query with
        ``TransactionLostError``.
        """
        return None

    def describe(self, handle: Handle) -> str:
        """A short human description of a handle for logs and errors (never secrets)."""
        return dumpsHandle(handle)
