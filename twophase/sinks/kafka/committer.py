"""The driver half of the Kafka sink: end each prepared transaction from another client.

``commit`` ends a task's still-open transaction with ``EndTxn(transactional id, producer id,
epoch, commit)``, as Flink's KafkaSink does when it resumes a transaction. A repeated commit
is a no-op success. When the broker says the producer id and epoch can no longer end the
transaction (it aborted the transaction after ``transaction.timeout.ms``, or something fenced
it), the committer reads the transaction's last record back with a ``read_committed`` consumer:
visible means committed before (a no-op success), invisible means lost, and
``TransactionLostError`` names the batch, the partition and the transactional id. Recovery
fences and aborts this sink's lingering transactions (broker listing + ``init_transactions``,
through the framework's sweep), except those a decided batch still has to commit. Everything
it needs comes from the options kept in ``sink.json`` (plus secrets from
``TWOPHASE_KAFKA_OPTIONS``), so ``twophase recover`` can run it anywhere.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar

from twophase.clients.kafka import errorText, newClient
from twophase.protocol import (
    CommitStatus,
    Committer,
    Handle,
    Prepared,
    RecoveryScope,
    TransactionLostError,
    TransientCommitError,
)
from twophase.redaction import getLogger
from twophase.resources import Resources
from twophase.sinks.kafka.errors import KafkaCommitError
from twophase.sinks.kafka.handles import KIND, checkHandle, describeHandle
from twophase.sinks.kafka.probe import ProbeVerdict, probeRecord
from twophase.sinks.kafka.producer import withTimeouts
from twophase.sinks.kafka.settings import KafkaSettings, ownedIds
from twophase.sinks.kafka.txn import (
    INVALID_TXN_STATE,
    NONE,
    TransactionClient,
    errorName,
    sharedClient,
)

log = getLogger(__name__)

WARN_FRACTION = 0.5
"""Warn when a transaction has been open longer than this share of its timeout at commit."""

FOREIGN_ID = (
    "its id has the sink's prefix but is not one the sink makes, so recovery never fences it"
)
"""Why recovery leaves an open transaction with the sink's prefix alone."""


def preparedNames(handle: Handle) -> tuple[str, ...]:
    """What a logged handle names on the brokers: its transactional id."""
    tid = handle.get("transactionalId") if handle.get("kind") == KIND else None
    return (tid,) if isinstance(tid, str) else ()


class KafkaCommitter(Committer):
    """Driver side, in any process: commit, abort and sweep the sink's Kafka transactions.

    Guarantees:

    - ``commit`` is idempotent: a committed transaction is committed again as a no-op, and a
      lost one raises ``TransactionLostError`` naming the batch, partition and transactional
      id, never a silent success.
    - ``abort`` and ``recoverAndAbort`` end only transactions of this sink's transactional ids,
      and never one that ``scope.keep`` names. The sweep is the framework's
      (``twophase.protocol.sweep``) over ``listPrepared``, fencing up to eight ids at once.
    """

    abortConcurrency: ClassVar[int] = 8

    def __init__(self, settings: KafkaSettings, resources: Resources | None = None) -> None:
        self.settings = settings
        self.resources = resources or Resources.ofProcess()
        """Where the transaction client is kept (the process's, unless a test gives its own)."""
        self._warnedNoListing = False

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> KafkaCommitter:
        return cls(KafkaSettings.fromOptions(options))

    def transactionTimeoutMs(self) -> int:
        """``kafka.transaction.timeout.ms``, else the brokers' maximum (cached per process)."""
        return self.settings.resolvedTransactionTimeoutMs()

    def client(self) -> TransactionClient:
        """The driver's transaction client (shared by the process, see ``sharedClient``)."""
        return sharedClient(
            self.settings.producerConfig,
            timeoutSeconds=self.settings.requestTimeoutSeconds,
            resources=self.resources,
        )

    def commit(self, handle: Handle) -> CommitStatus | None:
        """Driver, idempotent: EndTxn(commit) with the handle's producer id and epoch.

        Success, also for a transaction committed before. Retriable broker answers and network
        failures raise ``TransientCommitError``. A transaction the broker no longer lets this
        producer id and epoch end is read back: committed -> ``ALREADY_COMMITTED``, aborted ->
        ``TransactionLostError``.
        """
        h = checkHandle(handle)
        if h["records"] == 0:
            return None
        self._warnIfOld(h)
        code = self.client().endTransaction(
            h["transactionalId"], h["producerId"], h["producerEpoch"], commit=True
        )
        if code == NONE:
            log.debug("kafka: committed %s", self.describe(h))
            return None
        return self._settleUnended(h, code)

    def abort(self, handle: Handle) -> None:
        """Driver, idempotent: EndTxn(abort) with exactly this producer id and epoch.

        Never touches a newer transaction of the same id (its epoch is higher: the broker
        answers PRODUCER_FENCED, which means this one is gone already).
        """
        h = checkHandle(handle)
        if h["records"] == 0:
            return
        code = self.client().endTransaction(
            h["transactionalId"], h["producerId"], h["producerEpoch"], commit=False
        )
        if code == INVALID_TXN_STATE:
            log.warning(
                "kafka: abort of %s: the broker says the transaction is not open "
                "(%s): it was committed or aborted before",
                self.describe(h),
                errorName(code),
            )
        elif code != NONE:
            log.debug("kafka: abort of %s: already gone (%s)", self.describe(h), errorName(code))

    def preparedNames(self, handle: Handle) -> tuple[str, ...]:
        """What a handle names on the brokers: its transactional id."""
        return preparedNames(handle)

    def listPrepared(self, scope: RecoveryScope) -> list[Prepared]:
        """Read-only: this sink's ongoing transactions (broker ListTransactions of ids
        ``<prefix>-...``); an id the sink does not make (``ownedIds``) is listed as foreign and
        never fenced. When the brokers cannot list transactions, warns once and lists nothing:
        the next task of each id fences it.
        """
        prefix = self.settings.prefixFor(scope.sinkId)
        listings = self.client().listOngoing(prefix + "-")
        if listings is None:
            if not self._warnedNoListing:
                self._warnedNoListing = True
                log.warning(
                    "kafka: the brokers at %s cannot list transactions (ListTransactions needs "
                    "Kafka 3.0+ and DESCRIBE on the transactional ids); lingering transactions "
                    "of sink %s are fenced only when their id is used again, or aborted by "
                    "the broker after transaction.timeout.ms",
                    self.settings.bootstrapServers,
                    scope.sinkId,
                )
            return []
        owned = ownedIds(prefix)
        return [
            Prepared(
                t.transactionalId,
                {
                    "kind": KIND,
                    "transactionalId": t.transactionalId,
                    "producerId": t.producerId,
                    "state": t.state,
                },
                what="open transaction",
                state=t.state,
                foreign=None if owned.match(t.transactionalId) else FOREIGN_ID,
            )
            for t in listings
        ]

    def abortPrepared(self, item: Prepared) -> None:
        """Fence the listed id with ``init_transactions``, which aborts what is open on it; the
        framework's sweep fences up to ``abortConcurrency`` ids at once."""
        self._fence(item.name, self.transactionTimeoutMs())

    def fingerprint(self, handle: Handle) -> str | None:
        """The records' fingerprint the writer put in the handle: a transaction the broker
        aborted after the decision (its timeout) is written again from the batch's replay."""
        value = handle.get("fingerprint")
        return value if isinstance(value, str) else None

    def describe(self, handle: Handle) -> str:
        """``kafka batch N partition p attempt a: transactional id X (producer id P, epoch E)``."""
        return describeHandle(handle)

    def _fence(self, transactionalId: str, timeoutMs: int) -> None:
        """Abort whatever is open on ``transactionalId`` by initialising a producer with it."""
        from confluent_kafka import KafkaException, Producer

        config: dict[str, Any] = withTimeouts(self.settings.producerConfig, timeoutMs)
        config["transactional.id"] = transactionalId
        producer = newClient(Producer, config, "fencing producer")
        try:
            producer.init_transactions(self.settings.initTimeoutSeconds)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if getattr(error, "retriable", lambda: False)() or "timed out" in str(exc).lower():
                raise TransientCommitError(
                    f"kafka: fencing transactional id {transactionalId}: {errorText(exc)}"
                ) from exc
            raise
        finally:
            producer.close()  # nothing is open after init_transactions: close aborts nothing

    def _warnIfOld(self, h: Handle) -> None:
        startedAtMs = h.get("startedAtMs")
        timeoutMs = h.get("transactionTimeoutMs")
        if not isinstance(startedAtMs, int) or not isinstance(timeoutMs, int) or timeoutMs <= 0:
            return
        ageMs = int(time.time() * 1000) - startedAtMs
        if ageMs > WARN_FRACTION * timeoutMs:
            log.warning(
                "kafka: %s has been open for %.0f s, %.0f%% of its transaction.timeout.ms "
                "(%.0f s): past the timeout the broker aborts it and the batch's replay must "
                "write it again (see docs/kafka.md); raise kafka.transaction.timeout.ms if "
                "batches take this long",
                self.describe(h),
                ageMs / 1000,
                100 * ageMs / timeoutMs,
                timeoutMs / 1000,
            )

    def _settleUnended(self, h: Handle, code: int) -> CommitStatus:
        """EndTxn(commit) said the transaction cannot be ended: committed before, or lost?"""
        verdict, detail = self._probe(h)
        if verdict is ProbeVerdict.COMMITTED:
            log.info(
                "kafka: %s was committed before (EndTxn answered %s; %s)",
                self.describe(h),
                errorName(code),
                detail,
            )
            return CommitStatus.ALREADY_COMMITTED
        if verdict is ProbeVerdict.UNDECIDED:
            raise TransientCommitError(
                f"kafka: commit of {self.describe(h)}: EndTxn answered {errorName(code)} and "
                f"the outcome is not readable yet ({detail})"
            )
        if verdict is ProbeVerdict.GONE:
            raise KafkaCommitError(
                f"kafka: commit of {self.describe(h)}: EndTxn answered {errorName(code)} and "
                f"the transaction's records are no longer in the log ({detail}), so whether it "
                "was committed cannot be told; check the topic by hand"
            )
        raise TransactionLostError(self._lostMessage(h, code, detail))

    def _lostMessage(self, h: Handle, code: int, detail: str) -> str:
        ageMs = int(time.time() * 1000) - int(h.get("startedAtMs") or 0)
        timeoutMs = int(h.get("transactionTimeoutMs") or 0)
        cause = (
            f"it was opened {ageMs / 1000:.0f} s ago, longer than its transaction.timeout.ms of "
            f"{timeoutMs / 1000:.0f} s, so the broker aborted it"
            if timeoutMs and ageMs > timeoutMs
            else "the broker aborted it (a producer with the same transactional id fenced it, "
            "or an administrator aborted it)"
        )
        return (
            f"kafka: batch {h.get('batchId')} partition {h.get('partitionId')} is decided but its "
            f"transaction is LOST: transactional id {h['transactionalId']}, producer id "
            f"{h['producerId']}, epoch {h['producerEpoch']}, {h['records']} record(s). EndTxn "
            f"answered {errorName(code)} and {detail}: {cause}. These records will never be "
            "visible to read_committed consumers from this transaction."
        )

    def _probe(self, h: Handle) -> tuple[ProbeVerdict, str]:
        """Read the transaction's last record with ``read_committed``: is it visible?"""
        probe = h.get("probe")
        if not isinstance(probe, dict):
            return ProbeVerdict.ABORTED, "the handle names no record to check"
        return probeRecord(
            self.settings.producerConfig,
            str(probe["topic"]),
            int(probe["partition"]),
            int(probe["offset"]),
            timeoutSeconds=self.settings.requestTimeoutSeconds,
        )
