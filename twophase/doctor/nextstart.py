"""What the next start does with a decided, unfinished batch: the words status, doctor, recover say.

The next start of the query (and ``twophase recover``, which does the same without Spark)
commits every transaction of a decided batch that is not marked committed. A batch whose
system aborted some of its partitions' transactions by itself (Kafka's transaction timeout:
the log's rewrite record, ``BatchState.awaitingRewrite``) is different: only the query's
restart can finish it, since only Spark's replay of the batch has the records to write those
partitions again; recover commits the batch's other transactions and leaves it decided. The
three commands describe each batch with the sentences of this module, word for word, so they
never disagree about what the next start will do.
"""

from __future__ import annotations

from dataclasses import dataclass

from twophase.coordinator.records import BatchState


@dataclass(frozen=True)
class Unfinished:
    """One decided batch not marked committed, as the next start sees it."""

    batchId: int
    transactions: int
    """The decided (or replacing) transactions a commit can finish."""
    partitionsToCommit: tuple[int, ...]
    """Their partitions."""
    awaitingRewrite: tuple[int, ...] = ()
    """The partitions only the replay can write again."""

    @classmethod
    def of(cls, state: BatchState) -> Unfinished:
        live = state.liveHandles
        partitions = tuple(sorted({h.partitionId for h in live}))
        return cls(state.batchId, len(live), partitions, tuple(sorted(state.awaitingRewrite)))

    @property
    def onlyRestart(self) -> bool:
        """True when what is left of the batch is the restart's alone (a rewrite)."""
        return bool(self.awaitingRewrite)

    def describe(self) -> str:
        """The batch's state and what the next start does with it, in one sentence."""
        count = self.transactions
        if not self.awaitingRewrite:
            return (
                f"batch {self.batchId} is decided, not committed: the next start of the query "
                f"commits its {_transactions(count)}, and so does twophase recover (with the "
                "query stopped)"
            )
        others = (
            f"commits only its other {_transactions(count)} (partitions "
            f"{list(self.partitionsToCommit)})"
            if count
            else "has nothing else of it to commit"
        )
        return (
            f"batch {self.batchId} is decided, and the transactions of partitions "
            f"{list(self.awaitingRewrite)} were aborted by the system (its transaction timeout "
            "passed before the commit): only the next start of the query writes them again, from "
            f"Spark's replay of the batch; twophase recover cannot, and {others}"
        )

    def fix(self, recover: str) -> str:
        """The one command that finishes the batch; ``recover`` is the ``twophase recover``
        command spelled for the checkpoint and sink."""
        if self.awaitingRewrite:
            return (
                "restart the query: only its replay of the batch has the records to write "
                f"partitions {list(self.awaitingRewrite)} again (twophase recover cannot "
                "rewrite them)"
            )
        return f"{recover}   (with the query stopped), or restart the query: either commits it"


def _transactions(count: int) -> str:
    return f"{count} transaction" if count == 1 else f"{count} transactions"


__all__ = ["Unfinished"]
