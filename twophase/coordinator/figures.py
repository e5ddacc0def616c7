"""What the decision log records for operators: each batch's figures, beside its state changes.

The protocol never reads these fields; ``twophase status`` and the metrics do. They are written
in the records the coordinator writes anyway, so a batch costs no extra write:

- ``decided(N)``: ``rows``, ``bytes`` (Arrow bytes the tasks handed to the sink's writer),
  ``tasks`` (task results given to the decision) and ``prepareSeconds`` (the slowest task);
- ``committed(N)``: ``commitSeconds``, ``decisionSeconds`` (writing ``decided(N)``),
  ``committedBy`` (``commit``, ``rollForward`` or ``recovery``), ``committed`` (handles),
  ``retries``, ``aborted`` (other transactions of N aborted after the commit; the record
  is written once more only when there were any), and ``times``: when the batch's phases
  began and ended (``BatchTimes``), where a batch's time goes;
- ``aborted(N)``: ``aborted``, ``retries``, ``abortSeconds``, and ``stopped`` when a clean stop
  gave the batch up before any of its tasks began (nothing of it was prepared);
- ``recovery(N)``, a record of its own and only when the recovery before batch N did
  something: one entry per such recovery (batches finished, handles committed, lingering
  transactions aborted, partitions left to rewrite, seconds).

A record written before these fields existed reads as unknown (``None``), never as zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from twophase.coordinator import slots
from twophase.coordinator.records import BatchStatus, isoTimeOrNone, parseTimeOrNone
from twophase.coordinator.storage import CorruptRecord, LogStorage
from twophase.redaction import getLogger

log = getLogger(__name__)

RECOVERY_RUNS_KEPT = 10
"""How many recoveries before one batch its ``recovery(N)`` record keeps (the newest)."""


class CommittedBy(StrEnum):
    """Which call committed a decided batch's handles."""

    COMMIT = "commit"
    """The batch's own commit, right after its decision."""
    ROLL_FORWARD = "rollForward"
    """Spark's commit or abort of a batch an earlier attempt had decided (a retried commit)."""
    RECOVERY = "recovery"
    """The recovery before a later batch (after a crash or a failed commit)."""


@dataclass(frozen=True)
class BatchTimes:
    """When the phases of one batch ran, in epoch seconds, as the Spark binding saw them.

    ``planned``: the driver's work before the tasks (options, the log's claim, recovery);
    ``tasks``: the first task's start to the last one's end (on the executors' clocks for
    ``format()``; the job around the tasks for ``foreachBatch``). The coordinator adds the rest:
    its commit call, the decision, the last handle committed (see ``TIMES``).
    """

    planned: tuple[float, float] | None = None
    tasks: tuple[float, float] | None = None

    def stamps(self) -> dict[str, float]:
        found: dict[str, float] = {}
        for names, span in ((("planStarted", "planEnded"), self.planned),
                            (("tasksStarted", "tasksEnded"), self.tasks)):  # fmt: skip
            if span is not None:
                found.update(zip(names, span, strict=True))
        return found


TIMES = (
    "planStarted",
    "planEnded",
    "tasksStarted",
    "tasksEnded",
    "commitCalled",
    "decided",
    "committed",
)
"""The phases' instants ``committed(N)`` may record in ``times``, in the order they happen:
``commitCalled`` when the driver's commit began, ``decided`` when ``decided(N)`` was written,
``committed`` when the last handle was committed (the batch visible)."""


@dataclass(frozen=True)
class CommitFigures:
    """What ``committed(N)`` records beside ``commitSeconds``."""

    committedBy: CommittedBy
    committed: int
    retries: int = 0
    decisionSeconds: float | None = None
    aborted: int = 0
    times: Mapping[str, float] | None = None
    """Some of ``TIMES`` (epoch seconds), when the batch's own commit knew them."""

    def toJson(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "committedBy": str(self.committedBy),
            "committed": self.committed,
            "retries": self.retries,
            "aborted": self.aborted,
        }
        if self.decisionSeconds is not None:
            data["decisionSeconds"] = round(self.decisionSeconds, 6)
        if self.times:
            data["times"] = {k: round(self.times[k], 4) for k in TIMES if k in self.times}
        return data


@dataclass(frozen=True)
class AbortFigures:
    """What ``aborted(N)`` records: the transactions aborted, the retries, the time taken."""

    aborted: int
    retries: int = 0
    abortSeconds: float = 0.0
    stopped: bool = False
    """The batch was given up by a clean stop before any of its tasks began: nothing of it was
    prepared (``twophase.stopGracefully``)."""

    def toJson(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "aborted": self.aborted,
            "retries": self.retries,
            "abortSeconds": round(self.abortSeconds, 6),
        }
        if self.stopped:
            data["stopped"] = True
        return data


@dataclass(frozen=True)
class RecoveryFigures:
    """What the recoveries before one batch did (summed over the runs ``recovery(N)`` keeps)."""

    runs: int
    batchesFinished: tuple[int, ...]
    handlesCommitted: int
    transactionsAborted: int
    partitionsToRewrite: int
    seconds: float

    def toJson(self) -> dict[str, Any]:
        data = asdict(self)
        data["batchesFinished"] = list(self.batchesFinished)
        return data


def recoveryEntry(
    at: datetime,
    batchesFinished: Sequence[int],
    handlesCommitted: int,
    transactionsAborted: int,
    awaitingRewrite: Mapping[int, Sequence[int]],
    seconds: float,
) -> dict[str, Any]:
    """One recovery's entry in ``recovery(N)``."""
    return {
        "at": isoTimeOrNone(at),
        "batchesFinished": list(batchesFinished),
        "handlesCommitted": handlesCommitted,
        "transactionsAborted": transactionsAborted,
        "awaitingRewrite": {str(b): list(p) for b, p in awaitingRewrite.items()},
        "seconds": round(seconds, 6),
    }


@dataclass(frozen=True)
class BatchFigures:
    """One batch of one sink as the log recorded it; ``None`` where the record does not say.

    ``committed`` counts the handles the batch's own commit committed, ``alreadyCommitted``
    those a later call committed again (a retried commit or the recovery after a crash: the
    participant's commit is idempotent and cannot tell a handle it commits from one already
    committed), ``failed`` the decided transactions the participant lost (Kafka's timeout).
    """

    batchId: int
    outcome: str
    """``committed``, ``decided`` (waiting for its commit) or ``aborted``."""
    rows: int | None = None
    bytes: int | None = None
    tasks: int | None = None
    prepared: int | None = None
    committed: int | None = None
    alreadyCommitted: int | None = None
    aborted: int | None = None
    retries: int | None = None
    failed: int | None = None
    prepareSeconds: float | None = None
    decisionSeconds: float | None = None
    commitSeconds: float | None = None
    abortSeconds: float | None = None
    committedBy: str | None = None
    decidedAt: datetime | None = None
    finishedAt: datetime | None = None
    """When ``committed(N)`` or ``aborted(N)`` was written."""
    recovery: RecoveryFigures | None = None
    """What the recovery before this batch did, when it did something."""
    stopped: bool = False
    """An aborted batch that a clean stop gave up before any of its tasks began: nothing of it
    was prepared, and Spark plans it again at the next start."""
    times: Mapping[str, float] | None = None
    """When the batch's phases ran (``TIMES``, epoch seconds), as far as its commit knew."""

    def toJson(self) -> dict[str, Any]:
        data = asdict(self)
        data["decidedAt"] = isoTimeOrNone(self.decidedAt)
        data["finishedAt"] = isoTimeOrNone(self.finishedAt)
        data["recovery"] = None if self.recovery is None else self.recovery.toJson()
        data["times"] = None if self.times is None else dict(self.times)
        return data


def readFigures(
    storage: LogStorage, batchId: int, paths: Mapping[BatchStatus, str]
) -> BatchFigures | None:
    """The figures of batch N from its records, or ``None`` when it has no readable state.

    Tolerant by design: a record of an older release lacks fields (read as ``None``), and an
    unreadable record is skipped with a WARNING, as the protocol's own reading does.
    """
    bodies = {status: _body(storage, batchId, status, paths) for status in paths}
    decided, committed = bodies.get(BatchStatus.DECIDED), bodies.get(BatchStatus.COMMITTED)
    aborted, rewrite = bodies.get(BatchStatus.ABORTED), bodies.get(BatchStatus.REWRITE)
    recovery = _recovery(bodies.get(BatchStatus.RECOVERY))
    if committed is not None:
        outcome = "committed"
    elif decided is not None:
        outcome = "decided"
    elif aborted is not None:
        outcome = "aborted"
    else:
        return None
    handles = decided.get("handles") if decided is not None else None
    prepared = len(handles) if isinstance(handles, list) else None
    failed = len(rewrite.get("lost", ())) if rewrite is not None else (0 if decided else None)
    figures: dict[str, Any] = {"batchId": batchId, "outcome": outcome, "recovery": recovery}
    if decided is not None:
        figures.update(
            rows=_int(decided.get("rows")),
            bytes=_int(decided.get("bytes")),
            tasks=_int(decided.get("tasks")),
            prepared=prepared,
            failed=failed,
            prepareSeconds=_float(decided.get("prepareSeconds")),
            decidedAt=_time(decided.get("decidedAt")),
        )
    if outcome == "committed" and committed is not None:
        by = committed.get("committedBy")
        count = _int(committed.get("committed"))
        if count is None and prepared is not None:  # an older record: every handle committed
            count = prepared - (failed or 0)
        figures.update(
            committedBy=by,
            committed=count if by in (None, str(CommittedBy.COMMIT)) else 0,
            alreadyCommitted=count if by not in (None, str(CommittedBy.COMMIT)) else 0,
            aborted=_int(committed.get("aborted")),
            retries=_int(committed.get("retries")),
            decisionSeconds=_float(committed.get("decisionSeconds")),
            commitSeconds=_float(committed.get("commitSeconds")),
            finishedAt=_time(committed.get("committedAt")),
            times=_times(committed.get("times")),
        )
    elif outcome == "aborted" and aborted is not None:
        figures.update(
            aborted=_int(aborted.get("aborted")),
            retries=_int(aborted.get("retries")),
            abortSeconds=_float(aborted.get("abortSeconds")),
            finishedAt=_time(aborted.get("abortedAt")),
            stopped=aborted.get("stopped") is True,
        )
    return BatchFigures(**figures)


def _body(
    storage: LogStorage, batchId: int, status: BatchStatus, paths: Mapping[BatchStatus, str]
) -> dict[str, Any] | None:
    try:
        if status is BatchStatus.DECIDED:  # at the end of the slot, past a takeover's fence
            found = slots.decision(storage, batchId, paths[status])
            if found is None:
                return None
            body = found
        else:
            body = storage.readRecord(paths[status])
        if body.get("batchId") != batchId or body.get("state") != str(status):
            raise CorruptRecord("its content names another batch or state")
    except FileNotFoundError:
        return None  # pruned or reset between listing and reading
    except CorruptRecord as exc:
        log.warning("decision log %s: ignoring record %s: %s", storage.url, paths[status], exc)
        return None
    return body


def _recovery(body: Mapping[str, Any] | None) -> RecoveryFigures | None:
    runs = body.get("runs") if body is not None else None
    if not isinstance(runs, list) or not runs:
        return None
    try:
        return RecoveryFigures(
            runs=len(runs),
            batchesFinished=tuple(sorted({int(b) for r in runs for b in r["batchesFinished"]})),
            handlesCommitted=sum(int(r["handlesCommitted"]) for r in runs),
            transactionsAborted=sum(int(r["transactionsAborted"]) for r in runs),
            partitionsToRewrite=sum(len(p) for r in runs for p in r["awaitingRewrite"].values()),
            seconds=sum(float(r["seconds"]) for r in runs),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _times(value: Any) -> dict[str, float] | None:
    """The known ``TIMES`` of a ``times`` object; anything else in it is left out."""
    if not isinstance(value, Mapping):
        return None
    found = {k: _float(value.get(k)) for k in TIMES}
    return {k: v for k, v in found.items() if v is not None} or None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _time(value: Any) -> datetime | None:
    try:
        return parseTimeOrNone(value)
    except ValueError:
        return None
