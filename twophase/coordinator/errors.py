"""The coordinator's errors: each one names the sink, the batch and what an operator can do."""

from __future__ import annotations

import errno
import ssl
from collections.abc import Sequence

from twophase.protocol import TransactionLostError
from twophase.redaction import redact


class CoordinatorError(Exception):
    """Base class of every error the coordinator raises on its own account."""

    errorCode = "TWOPHASE_LOG_CONFLICT"


class LogOwnershipError(CoordinatorError):
    """The decision log belongs to another streaming query; writing to it could lose data.

    A new checkpoint location means a new query id and batch ids that start again at 0, so the
    old query's ``committed(0)`` would make the new query skip its own batch 0. The log refuses
    instead, and says how to proceed.
    """

    errorCode = "TWOPHASE_LOG_OWNERSHIP"

    def __init__(self, url: str, sinkId: str, logQueryId: str, queryId: str, detail: str = ""):
        self.url = url
        self.sinkId = sinkId
        self.logQueryId = logQueryId
        self.queryId = queryId
        message = (
            f"twophase sink {sinkId}: the decision log at {url} belongs to streaming query "
            f"{logQueryId}, not to this query {queryId}. Writing here could skip or duplicate "
            "data. If this is a fresh start of the same pipeline on purpose, set option "
            "twophase.resetLog=true (outstanding decisions of the old query are committed "
            "first, then the log is cleared), or give the query a new checkpoint location or a "
            "new twophase.sinkId."
        )
        super().__init__(f"{message} {detail}".rstrip())


class UnfencedLogStoreError(CoordinatorError):
    """The decision log's store cannot create a record only where none exists, in one step.

    Without that, two drivers running at once on one checkpoint (a retried application master,
    a replaced pod whose node is only partitioned, a job started twice) could both decide the
    same batch and both commit it. Refused before anything is written, unless the user accepts
    that risk by name.
    """

    errorCode = "TWOPHASE_UNFENCED_LOG_STORE"

    def __init__(self, store: str, path: str) -> None:
        self.store = store
        self.path = path
        super().__init__(
            f"twophase decision log at {store}://{path.rsplit('/', 1)[0]}: the {store!r} store "
            "has no create-if-absent that twophase knows (a hard link on local disk, S3's "
            "If-None-Match: * PUT), so two drivers running at once on this checkpoint could both "
            "decide the same batch and write it twice. Put the checkpoint (or "
            "twophase.logLocation) on local disk or S3, or, if only one driver can ever run "
            "this query at a time, accept the risk with option twophase.unfencedLogStore=true."
        )

    def __reduce__(self) -> tuple[type[UnfencedLogStoreError], tuple[str, str]]:
        return type(self), (self.store, self.path)


class DriverFencedError(CoordinatorError):
    """A newer driver holds the decision log: this one must not decide, sweep or mark anything.

    Raised to a driver whose run is older than the newest run of the log (a replacement started
    while it still runs, or while it was frozen), before it writes anything of its own. What was
    decided stays decided; the newer driver finishes it.
    """

    errorCode = "TWOPHASE_DRIVER_FENCED"

    def __init__(self, url: str, sinkId: str, epoch: int | None, newer: str, doing: str) -> None:
        self.url = url
        self.sinkId = sinkId
        self.epoch = epoch
        self.newer = newer
        self.doing = doing
        mine = "this driver holds no run of it" if epoch is None else f"this driver is run {epoch}"
        super().__init__(
            f"twophase sink {sinkId}: another driver took the decision log at {url}: {newer}; "
            f"{mine}. Two drivers on one checkpoint would write batches twice, so this driver "
            f"stops before it {doing}; nothing of its own was committed, and the other driver "
            "goes on from the log. If that driver should not be running, stop it first, then "
            "start this query again: a new start claims the log back."
        )

    def __reduce__(self) -> tuple[type[DriverFencedError], tuple[str, str, int | None, str, str]]:
        return type(self), (self.url, self.sinkId, self.epoch, self.newer, self.doing)


class DecisionLogWriteError(CoordinatorError, OSError):
    """A record could not be written to the decision log: a full or read-only disk, no access.

    Raised by every write of the log (the owner record, a decision, a rewrite record, the
    committed and aborted marks, ``sink.json``, removals) with the filesystem's ``OSError``
    chained and its ``errno`` kept (an ``OSError`` still, for callers that catch those). A
    refused write leaves no partial record and no temporary file, so nothing half written is
    ever read: once the log can be written again, a restart recovers from the log as it stands.
    """

    def __init__(self, url: str, record: str, cause: OSError, verb: str = "write") -> None:
        self.url = url
        self.record = record
        self.cause = cause
        self.verb = verb
        code = errno.errorcode.get(cause.errno or 0)
        untrusted = _isUntrusted(cause)
        reason = (
            f"{code} ({cause.strerror})"
            if code and cause.strerror
            else f"{type(cause).__name__}: {cause}"
        )
        fix = _untrustedFix(url, cause) if untrusted else _fixFor(_errnoOf(cause), url)
        super().__init__(
            redact(
                f"twophase decision log {url}: could not {verb} {record}: {reason.rstrip('.')}. "
                f"{fix + ' ' if fix else ''}Nothing "
                "decided is lost: once the log can be "
                "written again, restart the query; it recovers from the log, committing each "
                "decided batch once and discarding what no decision names (Spark writes those "
                "batches again)."
            )
        )
        # Only errno: an OSError with strerror set would print "[Errno N] ..." instead.
        self.errno = cause.errno
        # Recoverable for a full disk or an I/O error; not for a read-only filesystem or a
        # write this process may not make (a restart only repeats those).
        refused = isinstance(cause, PermissionError)  # S3's AccessDenied carries no errno
        closed = cause.errno in (errno.EROFS, errno.EACCES, errno.EPERM) or refused or untrusted
        self.errorCode = "TWOPHASE_LOG_NOT_WRITABLE" if closed else "TWOPHASE_LOG_WRITE"

    def __reduce__(self) -> tuple[type[DecisionLogWriteError], tuple[str, str, OSError, str]]:
        return type(self), (self.url, self.record, self.cause, self.verb)


def _isUntrusted(exc: BaseException) -> bool:
    """True when ``exc`` or an error it was raised from is a certificate that did not verify
    (an S3 log over HTTPS with the wrong CA): every retry meets the same certificate."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return True
        if "CERTIFICATE_VERIFY_FAILED" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _errnoOf(cause: OSError) -> int | None:
    """``cause``'s errno; ``EACCES`` for a ``PermissionError`` without one (S3's refusals)."""
    if cause.errno is None and isinstance(cause, PermissionError):
        return errno.EACCES
    return cause.errno


def _untrustedFix(url: str, cause: OSError) -> str:
    if "Fix:" in str(cause):  # the handshake's own words say which fix (an expired certificate)
        return ""
    return (
        f"The server holding {url} presented a certificate that does not verify: set "
        "AWS_CA_BUNDLE to a PEM file of its CA in the driver's environment."
    )


def _fixFor(code: int | None, url: str) -> str:
    """What an operator does about a write to the log at ``url`` refused with ``code``."""
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"The filesystem holding {url} is full (or its quota used up): free space on it."
    if code == errno.EROFS:
        return f"The filesystem holding {url} is read-only: make it writable again."
    if code in (errno.EACCES, errno.EPERM):
        return (
            f"This process is refused there: give it read and write access to {url} (on S3, "
            "the actions docs/security.md lists)."
        )
    return f"Make {url} writable again."


class DecisionConflictError(CoordinatorError):
    """A state change that the log's state machine forbids (e.g. aborting a decided batch).

    ``decided(N) -> committed(N)`` and ``aborted(N)`` (possibly followed by a fresh
    ``decided(N)`` when Spark replays N) are the only transitions.
    """


class CommitFailedError(CoordinatorError):
    """Decided handles of a batch could not be committed, even after retries.

    The decision stays in the log, so nothing is lost: the next start of the query (or the
    recovery before the next batch) commits these handles again (commits are idempotent).
    """

    errorCode = "TWOPHASE_COMMIT_FAILED"

    def __init__(
        self, sinkId: str, batchId: int, failures: Sequence[tuple[str, int, BaseException]]
    ):
        self.sinkId = sinkId
        self.batchId = batchId
        self.failures = list(failures)
        parts = [
            f"{description} ({attempts} attempt{'s' if attempts != 1 else ''}): "
            f"{type(error).__name__}: {error}"
            for description, attempts, error in self.failures
        ]
        super().__init__(
            f"twophase sink {sinkId}: batch {batchId} is decided but {len(parts)} handle(s) "
            f"could not be committed: {'; '.join(parts)}. The decision is durable: the next "
            "start of the query rolls it forward (commit is idempotent)."
        )


class RewritePendingError(TransactionLostError, CoordinatorError):
    """Decided transactions of a batch were aborted by their participant before the commit.

    Raised when the commit finds them gone (Kafka aborts a transaction older than its
    ``transaction.timeout.ms``). Nothing is lost: the decision and the partitions' fingerprints
    stay in the log, and the next start of the query writes those partitions again from Spark's
    replay of the batch, exactly once; the partitions that did commit are not written again.
    """

    errorCode = "TWOPHASE_REWRITE_PENDING"

    def __init__(
        self,
        sinkId: str,
        batchId: int,
        partitions: Sequence[int],
        details: str,
        again: Sequence[int] = (),
    ):
        self.sinkId = sinkId
        self.batchId = batchId
        self.partitions = list(partitions)
        self.again = list(again)
        """Partitions whose lost transaction was itself the replay's rewrite of an earlier loss."""
        advice = (
            f" The transactions of partitions {self.again} were themselves the replay's "
            "rewrite of an earlier loss: at this load a write of the batch outlives the "
            "system's transaction timeout however often the query restarts. Raise that timeout "
            "(Kafka: option kafka.transaction.timeout.ms, up to the broker's "
            "transaction.max.timeout.ms) or lighten the load, then restart."
            if self.again
            else ""
        )
        super().__init__(
            f"twophase sink {sinkId}: batch {batchId} is decided, but the transactions of "
            f"partitions {self.partitions} were aborted by the system before they could be "
            f"committed ({details}). Nothing is lost: restart the query. Spark replays batch "
            f"{batchId}, and twophase writes those partitions again, once, after checking the "
            "replay gives the same records; the partitions already committed are not written "
            f"twice.{advice}"
        )


class RewriteMismatchError(CoordinatorError):
    """The replay of a batch gave other records for a lost partition than the decision holds.

    The query is not deterministic (``rand()``, ``current_timestamp()``, an external lookup),
    its partitioning changed, or Spark grouped the partitions into tasks differently (a
    ``coalesce`` before a ``format()`` sink), so writing the replay would not restore what was
    decided.
    """

    errorCode = "TWOPHASE_REWRITE_MISMATCH"

    def __init__(
        self, sinkId: str, batchId: int, differences: Sequence[tuple[int, str]], option: str
    ):
        self.sinkId = sinkId
        self.batchId = batchId
        self.differences = list(differences)
        listed = "; ".join(f"partition {p}: {what}" for p, what in self.differences)
        super().__init__(
            f"twophase sink {sinkId}: batch {batchId} was decided, its transactions for "
            f"partitions {[p for p, _ in self.differences]} were aborted by the system, and "
            f"Spark's replay of the batch does not give the same records ({listed}). Writing "
            "the replay would not restore what was decided, so nothing of it was written. A "
            "deterministic query (no rand(), current_timestamp(), uuid() or external lookups "
            "before the sink, and the same number of partitions) replays the same records; a "
            ".coalesce(n) before writeStream.format(...) may group them into other tasks after "
            "a restart, which twophase.foreachBatch does not (it writes a lost transaction's "
            "input partitions again, however Spark groups them); Spark's own Kafka source may "
            "hand a batch's topic partitions to other tasks after a restart, where "
            'readStream.format("twophase.kafka") keeps them in place. To accept the replay\'s '
            f"records for these partitions instead (right only if the query changed, not the "
            f"grouping), restart once with option {option}=write."
        )


class LogFormatError(CoordinatorError):
    """A persisted record is in a format newer than this twophase reads.

    Raised by every reader of the decision log's records, the run claims, ``owner.json``,
    ``sink.json`` and a sink's handles, never skipped like a torn record: a newer release may
    mean something by it that this one would get wrong (an earlier release read a fence as no
    decision). The start of a query meets it before anything is committed or aborted.
    """

    errorCode = "TWOPHASE_LOG_FORMAT"

    def __init__(
        self, where: str, found: int, newest: int, writtenBy: str | None, reader: str
    ) -> None:
        self.where = where
        self.found = found
        self.newest = newest
        self.writtenBy = writtenBy
        self.reader = reader
        by = f", written by twophase {writtenBy}" if writtenBy else ""
        target = f"twophase {writtenBy} or later" if writtenBy else "the twophase that wrote it"
        super().__init__(
            f"{where} is in format {found}{by}; this twophase {reader} reads formats up to "
            f"{newest}, so it stops before acting on it (nothing was committed or aborted on "
            f"its account). Fix: upgrade to {target} on the driver and on every executor, "
            "then start the query again; or start the query on a new checkpoint location "
            "(and a new option sinkId) to leave this log behind."
        )

    def __reduce__(self) -> tuple[type[LogFormatError], tuple[str, int, int, str | None, str]]:
        return type(self), (self.where, self.found, self.newest, self.writtenBy, self.reader)


class SinkChangedError(CoordinatorError):
    """The query restarted with another sink than the one whose decided batches wait in the log.

    A decided batch must be committed by the sink that prepared it: another sink id looks in
    another log (the old decisions would stay in doubt while Spark replays the batch through the
    new sink), and another sink class cannot commit the old handles. Refused at the start,
    before anything is written for the new sink.
    """

    errorCode = "TWOPHASE_LOG_OWNERSHIP"

    def __init__(
        self, url: str, sinkId: str, change: str, asItWas: str, waiting: Sequence[int]
    ) -> None:
        self.url = url
        self.sinkId = sinkId
        self.change = change
        self.asItWas = asItWas
        self.waiting = list(waiting)
        super().__init__(
            f"twophase sink {sinkId}: {change}, and the decision log at {url} still holds "
            f"batches {', '.join(str(b) for b in self.waiting)} decided and not committed. "
            "They must be committed by the sink that prepared them before the query goes on "
            "with another one, or they would stay in doubt (holding their locks) while Spark "
            f"writes the batches again. Fix: start the query once more as it was ({asItWas}) "
            "and let it finish a batch, or run twophase recover --checkpoint "
            "<checkpointLocation> (it commits them); then start it with the new sink. Or start "
            "the new sink on a new checkpoint location."
        )

    def __reduce__(self) -> tuple[type[SinkChangedError], tuple[str, str, str, str, list[int]]]:
        return type(self), (self.url, self.sinkId, self.change, self.asItWas, self.waiting)
