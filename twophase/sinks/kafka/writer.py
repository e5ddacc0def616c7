"""The executor half of the Kafka sink: each task attempt's records in one open transaction.

A task attempt of partition p writes with a transactional producer whose ``transactional.id``
is ``<prefix>-<p>`` (``<prefix>-<p>-a<a>`` for attempt a > 0, so that a retry or speculative
copy can never fence the attempt whose result Spark keeps), produces the rows as it reads
them, flushes, checks every delivery report, and returns the producer id and epoch in its
handle. The transaction stays open: ``read_committed`` consumers see nothing of it until
``KafkaCommitter`` ends it.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from twophase.protocol import Handle, TransactionContext, TransactionWriter
from twophase.redaction import getLogger
from twophase.sinks.kafka import producer as producing
from twophase.sinks.kafka.handles import KIND, describeHandle
from twophase.sinks.kafka.producer import KafkaTransaction
from twophase.sinks.kafka.settings import KafkaSettings, transactionalIdFor

log = getLogger(__name__)


class KafkaWriter(TransactionWriter[KafkaTransaction]):
    """Executor side: a transactional producer per task attempt, prepared and left open.

    Nothing a task writes is visible to ``read_committed`` consumers before the driver commits.
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> KafkaWriter:
        return cls(KafkaSettings.fromOptions(options))

    def transactionTimeoutMs(self) -> int:
        """``kafka.transaction.timeout.ms``, else the brokers' maximum (cached per process)."""
        return self.settings.resolvedTransactionTimeoutMs()

    def beginTransaction(self, ctx: TransactionContext) -> KafkaTransaction:
        """Executor: a producer for this partition's transactional id, fenced and begun."""
        prefix = self.settings.prefixFor(ctx.sinkId)
        return producing.beginTransaction(
            ctx,
            transactionalIdFor(prefix, ctx.partitionId, ctx.attemptNumber),
            prefix,
            self.settings.producerConfig,
            defaultTopic=self.settings.topic,
            transactionTimeoutMs=self.transactionTimeoutMs(),
            flushTimeoutSeconds=self.settings.flushTimeoutSeconds,
            initTimeoutSeconds=self.settings.initTimeoutSeconds,
        )

    def write(self, txn: KafkaTransaction, batch: pa.RecordBatch) -> None:
        """Executor: produce the batch's rows into the open transaction."""
        producing.write(txn, batch)

    def preCommit(self, txn: KafkaTransaction) -> Handle:
        """Executor: flush, check every delivery, return the handle; the transaction stays open."""
        ctx = txn.ctx
        handle: Handle = {
            "kind": KIND,
            "batchId": ctx.batchId,
            "partitionId": ctx.partitionId,
            "attempt": ctx.attemptNumber,
        }
        handle.update(producing.preCommit(txn))
        log.debug("kafka: prepared %s", describeHandle(handle))
        return handle

    def abortTransaction(self, txn: KafkaTransaction) -> None:
        """Executor, best effort: abort the open transaction of a failed task."""
        producing.abortTransaction(txn)
