"""What ``twophase status`` says is in doubt: the oldest batch not committed, only what is known.

The metrics (:mod:`~twophase.metrics.reading`) give the oldest batch not committed: decided and
waiting for its commit, or planned by Spark (``offsets/N``) with no decision. The second kind is
three different things, and status tells them apart by the log's record of the batch:

- ``aborted(N)`` with ``stopped``: a clean stop gave the batch up before any of its tasks began,
  so nothing of it was prepared: nothing is in doubt, and the next start runs it;
- ``aborted(N)`` without: the batch failed and its transactions were aborted (its figures say
  how many): nothing is in doubt either, and Spark runs it again at the next start;
- no record: the log knows nothing of it (a batch running now, or a driver that died during
  its tasks). Whether any of its transactions are prepared only the system can tell, so status
  names the command that asks it (``twophase doctor``) instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TextIO

from twophase.coordinator import DecisionLog
from twophase.coordinator.figures import BatchFigures
from twophase.metrics import SinkMetrics


@dataclass(frozen=True)
class Doubt:
    """The oldest batch in doubt (``metrics.oldestInDoubt`` unless the log aborted it), and
    the aborted batch Spark runs again, if that is what Spark planned last."""

    metrics: SinkMetrics
    inDoubt: bool
    aborted: BatchFigures | None
    doctor: str

    @classmethod
    def of(cls, metrics: SinkMetrics, log: DecisionLog, checkpoint: str, sinkId: str) -> Doubt:
        oldest = metrics.oldestInDoubt
        aborted = None
        if oldest is not None and oldest.state == "undecided":
            figures = log.figures(oldest.batchId)
            if figures is not None and figures.outcome == "aborted":
                aborted = figures
        doctor = f"twophase doctor --checkpoint {checkpoint} --sink-id {sinkId}"
        return cls(metrics, oldest is not None and aborted is None, aborted, doctor)

    def says(self) -> str:
        """What is in doubt, in one sentence (``nothing`` when nothing is)."""
        doubt = self.metrics.oldestInDoubt
        if doubt is None or not self.inDoubt:
            return "nothing"
        age = doubt.ageSeconds(self.metrics.readAt)
        if doubt.state == "decided":
            what = f"batch {doubt.batchId}: decided, not committed ({doubt.handles} handles), for "
            what += f"{age:.1f} s"
        else:
            what = (
                f"batch {doubt.batchId}: planned by Spark (offsets/{doubt.batchId}) {age:.1f} s "
                "ago, and the log holds neither a decision nor an abort of it: whether any of its "
                f"transactions are prepared only the system can tell ({self.doctor})"
            )
        timeout = self.metrics.transactionTimeoutSeconds
        return what + (f" (transaction timeout {timeout:g} s)" if timeout is not None else "")

    def toRunAgain(self) -> str | None:
        """The aborted batch Spark runs again at the next start, in one sentence, or ``None``."""
        f = self.aborted
        if f is None:
            return None
        if f.stopped:
            return (
                f"batch {f.batchId}: stopped cleanly before any of its tasks began, nothing of "
                "it was prepared; the next start runs it"
            )
        took = "" if f.abortSeconds is None else f" in {f.abortSeconds * 1000:.1f} ms"
        return (
            f"batch {f.batchId}: aborted ({_count(f.aborted)} transactions aborted{took}, "
            f"{_count(f.retries)} retries), nothing of it decided; the next start runs it again"
        )

    def toJson(self) -> dict[str, Any]:
        """``inDoubt`` of ``--json``: the oldest batch in doubt (``null`` when none, or when the
        log aborted it), pending handles, the transaction timeout, the batch to run again."""
        doubt = self.metrics.oldestInDoubt
        again = None
        if self.aborted is not None:
            again = {
                "batchId": self.aborted.batchId,
                "outcome": "stopped" if self.aborted.stopped else "aborted",
                "aborted": self.aborted.aborted,
                "retries": self.aborted.retries,
                "abortSeconds": self.aborted.abortSeconds,
                "says": self.toRunAgain(),
            }
        return {
            "oldest": doubt.toJson(self.metrics.readAt) if doubt and self.inDoubt else None,
            "says": self.says(),
            "pendingCommittables": self.metrics.pendingCommittables,
            "decidedUncommittedBatches": self.metrics.decidedUncommittedBatches,
            "transactionTimeoutSeconds": self.metrics.transactionTimeoutSeconds,
            "toRunAgain": again,
        }

    def write(self, out: TextIO) -> None:
        out.write(f"  in doubt              {self.says()}\n")
        again = self.toRunAgain()
        if again is not None:
            out.write(f"  to run again          {again}\n")


def _count(value: int | None) -> str:
    return "?" if value is None else str(value)


__all__ = ["Doubt"]
