"""A record too large for Kafka, told as its position in the task, its size, the limit, the fix.

Two limits refuse a record, in two places:

- the producer's ``message.max.bytes`` (librdkafka; 1000000 bytes unless the option
  ``kafka.message.max.bytes`` says otherwise): librdkafka refuses a larger record when it is
  produced, so the task knows the record's position at once;
- the topic's ``max.message.bytes`` (the brokers' ``message.max.bytes`` unless the topic sets
  its own; 1048588 bytes by default): it bounds each record *batch* the producer sends, so the
  broker refuses a whole batch, small records included, and every record of it is reported
  undelivered. The task tracks its largest record (key and value bytes) as it produces, reads
  the topic's limit when the refusal comes, and says whether that record cannot fit alone or
  the producer's batches are larger than the topic takes.

No message shows a record's bytes, only sizes and positions (counting from 0 within what the
task wrote).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from twophase.clients.kafka import topicMaxMessageBytes
from twophase.protocol import TransactionContext

PRODUCER_DEFAULT_MAX_BYTES = 1_000_000
"""librdkafka's default ``message.max.bytes``."""

BATCH_OVERHEAD_BYTES = 70
"""What a one-record batch adds to its key and value: the batch header (61 bytes) and the
record's framing. Measured on Kafka 4.1, topic ``max.message.bytes=2000``: a record with a
1930-byte value is taken, one of 1935 bytes refused."""


def recordSizes(values: pa.Array, keys: pa.Array | None) -> np.ndarray:
    """Each row's key and value bytes (a null counts 0)."""
    sizes = pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False)
    if keys is not None:
        sizes = sizes + pc.fill_null(pc.binary_length(keys), 0).to_numpy(zero_copy_only=False)
    return np.asarray(sizes, dtype=np.int64)


def producerLimit(config: Mapping[str, Any]) -> int:
    """The producer's ``message.max.bytes``."""
    try:
        return int(config.get("message.max.bytes", PRODUCER_DEFAULT_MAX_BYTES))
    except (TypeError, ValueError):
        return PRODUCER_DEFAULT_MAX_BYTES


def _where(ctx: TransactionContext, topic: str) -> str:
    return (
        f"kafka sink {ctx.sinkId}, batch {ctx.batchId}, partition {ctx.partitionId} (attempt "
        f"{ctx.attemptNumber}), topic {topic}"
    )


def _outcome(ctx: TransactionContext) -> str:
    return (
        f"Nothing of batch {ctx.batchId} becomes visible: the task's transaction is aborted "
        "and the query fails."
    )


def producerRefused(
    ctx: TransactionContext, topic: str, row: int, size: int, config: Mapping[str, Any]
) -> str:
    """A record librdkafka refused as larger than the producer's ``message.max.bytes``."""
    limit = producerLimit(config)
    return (
        f"{_where(ctx, topic)}: row {row} of partition {ctx.partitionId} (counting from 0) is "
        f"{size} bytes (key and value), over the producer's message.max.bytes of {limit} "
        "(which counts the record's framing too): librdkafka refused it (MSG_SIZE_TOO_LARGE). "
        f"{_outcome(ctx)} Fix: raise the producer's limit (option kafka.message.max.bytes) "
        "together with the topic's max.message.bytes (the broker's limit, 1048588 bytes by "
        f"default), or filter, split or shrink the records over {limit} bytes upstream; then "
        "restart the query: the batch is written again."
    )


def brokerRefused(
    ctx: TransactionContext,
    topic: str,
    partition: int,
    records: int,
    largest: tuple[int, int],
    config: Mapping[str, Any],
    timeoutSeconds: float,
) -> str:
    """The broker refused a batch of ``records`` records as larger than the topic's
    ``max.message.bytes``; ``largest`` is the task's largest record: (bytes, row)."""
    size, row = largest
    limit, why = topicMaxMessageBytes(config, topic, timeoutSeconds)
    head = (
        f"{_where(ctx, topic)}: the broker refused a batch of {records} record(s) for "
        f"{topic} [{partition}] as too large (MSG_SIZE_TOO_LARGE): the topic's "
        f"max.message.bytes{'' if limit is None else f' ({limit} bytes)'} bounds each record "
        "batch the producer sends (after compression)"
    )
    largestRow = f"row {row} of partition {ctx.partitionId} (counting from 0), {size} bytes"
    command = (
        f"kafka-configs.sh --alter --entity-type topics --entity-name {topic} --add-config "
        "max.message.bytes=<bytes>"
    )
    if limit is None:
        return (
            f"{head}; it could not be read ({why}). The task's largest record is "
            f"{largestRow} (key and value). {_outcome(ctx)} Fix: raise the topic's "
            f"max.message.bytes ({command}), or set the option kafka.message.max.bytes to it so "
            "that the producer's batches stay below it and a record over it fails with its "
            "position; then restart the query: the batch is written again."
        )
    fits = limit - BATCH_OVERHEAD_BYTES
    if size > fits:
        return (
            f"{head}, and the task's largest record, {largestRow} (key and value), cannot "
            f"fit in a batch of its own (about {fits} bytes can). "
            f"{_outcome(ctx)} Fix: raise the topic's max.message.bytes ({command}), or filter, "
            f"split or shrink the records over {fits} bytes upstream; then restart the query: "
            "the batch is written again."
        )
    return (
        f"{head}. No record is too large alone (the largest is {largestRow}): "
        "the producer's batches are, as librdkafka fills them up to its message.max.bytes "
        f"({producerLimit(config)}). {_outcome(ctx)} Fix: set the option "
        f"kafka.message.max.bytes={limit} (the topic's limit) so that the producer's batches "
        f"stay below it, or raise the topic's max.message.bytes ({command}); then restart the "
        "query: the batch is written again."
    )
