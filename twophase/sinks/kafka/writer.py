"""The executor half of the Kafka sink: each task attempt's records in one open transaction.

A task attempt writes with a transactional producer of its Python worker's pool
(``twophase.sinks.kafka.pool``: ids ``<prefix>-w<worker token>-<n>``, never shared by two
workers, reused by later batches only), produces the rows as it reads them, flushes, checks
every delivery report, and returns the producer id and epoch in its handle. The transaction
stays open: ``read_committed`` consumers see nothing of it until ``KafkaCommitter`` ends it.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from twophase.protocol import Handle, TransactionContext, TransactionWriter
from twophase.redaction import getLogger
from twophase.resources import Resources
from twophase.sinks.kafka import producer as producing
from twophase.sinks.kafka import sending
from twophase.sinks.kafka.encoding import RecordEncoding
from twophase.sinks.kafka.handles import KIND, describeHandle
from twophase.sinks.kafka.producer import KafkaTransaction
from twophase.sinks.kafka.settings import KafkaSettings

log = getLogger(__name__)


class KafkaWriter(TransactionWriter[KafkaTransaction]):
    """Executor side: a pooled transactional producer per task attempt, prepared, left open.

    Nothing a task writes is visible to ``read_committed`` consumers before the driver commits.
    """

    def __init__(self, settings: KafkaSettings, resources: Resources | None = None) -> None:
        self.settings = settings
        self.resources = resources
        """Where the pooled producers are kept (``None``: the worker process's)."""
        self._encoding: RecordEncoding | None = None

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> KafkaWriter:
        return cls(KafkaSettings.fromOptions(options))

    def transactionTimeoutMs(self) -> int:
        """``kafka.transaction.timeout.ms``, else one minute or the brokers' maximum if lower."""
        return self.settings.resolvedTransactionTimeoutMs()

    def beginTransaction(self, ctx: TransactionContext) -> KafkaTransaction:
        """Executor: a pooled producer (in the background when the topic is known)."""
        return producing.beginTransaction(
            ctx,
            self.settings.prefixFor(ctx.sinkId),
            self.settings.producerConfig,
            defaultTopic=self.settings.topic,
            transactionTimeoutMs=self.transactionTimeoutMs(),
            flushTimeoutSeconds=self.settings.flushTimeoutSeconds,
            initTimeoutSeconds=self.settings.initTimeoutSeconds,
            requestTimeoutSeconds=self.settings.requestTimeoutSeconds,
            deadLetterTopic=self.settings.badRecords,
            resources=self.resources,
            encoding=self.encoding(),
        )

    def encoding(self) -> RecordEncoding:
        """How rows become record bytes; built once per writer."""
        if self._encoding is None:
            s = self.settings
            self._encoding = RecordEncoding(s.valueFormat, s.keyFormat, s.registered)
        return self._encoding

    def write(self, txn: KafkaTransaction, batch: pa.RecordBatch) -> None:
        """Executor: produce the batch's rows into the open transaction."""
        sending.write(txn, batch)

    def preCommit(self, txn: KafkaTransaction) -> Handle:
        """Executor: flush, check every delivery, return the handle; the transaction stays open."""
        ctx = txn.ctx
        handle: Handle = {
            "kind": KIND,
            "batchId": ctx.batchId,
            "partitionId": ctx.partitionId,
            "attempt": ctx.attemptNumber,
        }
        handle.update(sending.preCommit(txn))
        if txn.setAside:
            handle["setAside"] = txn.setAside
            log.info(
                "kafka: batch %s partition %s set %d row(s) aside in %s (option badRecords)",
                ctx.batchId,
                ctx.partitionId,
                txn.setAside,
                txn.deadLetterTopic,
            )
        log.debug("kafka: prepared %s", describeHandle(handle))
        return handle

    def abortTransaction(self, txn: KafkaTransaction) -> None:
        """Executor, best effort: abort the open transaction of a failed task."""
        producing.abortTransaction(txn)
