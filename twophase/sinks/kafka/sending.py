"""The send path of a task's Kafka transaction: rows to records, the flush, preCommit's checks.

``write`` produces each Arrow batch into the task's transaction (``producer.py`` begins it on a
pooled producer); ``preCommit`` flushes, checks that every record was acknowledged and hands the
open transaction's handle to the driver, the producer staying in the pool holding it.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaException

from twophase.clients.kafka import errorText
from twophase.redaction import redact
from twophase.sinks.kafka import pool
from twophase.sinks.kafka.columns import ColumnLayout
from twophase.sinks.kafka.deadletter import (
    NULL_TOPIC,
    TOO_LARGE,
    UNSERIALIZABLE,
    deadLetter,
    describeRefusal,
)
from twophase.sinks.kafka.deliveries import MSG_SIZE_TOO_LARGE, QUEUE_FULL
from twophase.sinks.kafka.encoding import Encoded
from twophase.sinks.kafka.errors import KafkaWriteError, RecordTooLargeError
from twophase.sinks.kafka.oversize import (
    brokerRefused,
    producerLimit,
    producerRefused,
    recordSizes,
)
from twophase.sinks.kafka.producer import (
    KafkaTransaction,
    acquire,
    awaitStart,
    begin,
    producerLogOf,
)

BATCH_CHUNK = 5000
"""Records handed to ``produce_batch`` at once."""


def write(txn: KafkaTransaction, batch: pa.RecordBatch) -> None:
    """Produce one Arrow batch into the transaction; fail at the first delivery error."""
    encoding = txn.encoding
    if txn.layout is None:
        formats = encoding.formats
        txn.layout = ColumnLayout.of(
            batch.schema, txn.defaultTopic, formats["value"].format, formats["key"].format
        )
    layout = txn.layout
    base = txn.produced  # the task's position of the batch's first row
    encoded = encoding.encode(batch, layout)
    topics = batch.column(layout.topic).to_pylist() if layout.topic is not None else None
    if encoded.failed and txn.deadLetterTopic is None:  # fails before any record is produced
        _setAsideUnserializable(txn, batch, layout, encoded, base, topics)
    awaitStart(txn)
    if txn.producer is None:
        acquire(txn, str(txn.defaultTopic or next((t for t in topics or () if t), "")))
    producer = txn.producer
    assert producer is not None
    if not txn.began:
        begin(txn, producer)
    if encoded.failed:
        batch, encoded = _setAsideUnserializable(txn, batch, layout, encoded, base, topics)
        topics = batch.column(layout.topic).to_pylist() if layout.topic is not None else None
    sizes = recordSizes(encoded.valueArray, encoded.keyArray)
    if len(sizes) and int(sizes.max()) > txn.largest[0]:
        txn.largest = (int(sizes.max()), base + int(sizes.argmax()))
    values, keys = encoded.values, encoded.keys
    if (
        layout.topic is None
        and layout.partition is None
        and layout.headers is None
        and hasattr(producer, "produce_batch")  # not in older confluent-kafka
    ):
        aside = _produceBatch(txn, str(txn.defaultTopic), values, keys, sizes, base)
        if aside:  # the fingerprint covers what reached the topic: the rows not set aside
            skip = set(aside)
            values = [v for i, v in enumerate(values) if i not in skip]
            keys = None if keys is None else [k for i, k in enumerate(keys) if i not in skip]
        txn.fingerprint.add(values, keys, extra=str(txn.defaultTopic).encode())
    else:
        partitions = (
            batch.column(layout.partition).to_pylist() if layout.partition is not None else None
        )
        headers = batch.column(layout.headers).to_pylist() if layout.headers is not None else None
        produce = producer.produce
        for i, value in enumerate(values):
            topic = topics[i] if topics is not None else txn.defaultTopic
            if topic is None:
                if txn.deadLetterTopic is not None:
                    key = keys[i] if keys is not None else None
                    _setAside(txn, NULL_TOPIC, None, base + i, value, key, sizes[i])
                    continue
                raise KafkaWriteError(
                    f"kafka sink: row {base + i} of partition {txn.ctx.partitionId} (counting "
                    "from 0) has a null topic; set .option('topic', <name>) for a default "
                    "topic, or the option badRecords=<topic> to set such rows aside"
                )
            kwargs: dict[str, Any] = {}
            extra = str(topic).encode()
            if keys is not None and keys[i] is not None:
                kwargs["key"] = keys[i]
            if partitions is not None and partitions[i] is not None:
                kwargs["partition"] = int(partitions[i])
                extra += b"\x00p%d" % kwargs["partition"]
            if headers is not None and headers[i]:
                kwargs["headers"] = [(h["key"], h["value"]) for h in headers[i]]
                extra += b"\x00h" + repr(kwargs["headers"]).encode()
            while True:
                try:
                    produce(topic, value, **kwargs)
                    txn.fingerprint.addRecord(value, kwargs.get("key"), extra=extra)
                    txn.produced += 1
                    break
                except BufferError:
                    producer.poll(0.05)
                    _raiseDeliveryErrors(txn)
                except KafkaException as exc:
                    code = _errorCode(exc.args[0] if exc.args else None)
                    if code == MSG_SIZE_TOO_LARGE and txn.deadLetterTopic is not None:
                        own = kwargs.get("headers")
                        key = kwargs.get("key")
                        _setAside(txn, TOO_LARGE, str(topic), base + i, value, key, sizes[i], own)
                        break
                    if code == MSG_SIZE_TOO_LARGE:
                        message = producerRefused(
                            txn.ctx, str(topic), base + i, int(sizes[i]), txn.config
                        )
                        raise RecordTooLargeError(redact(message)) from exc
                    raise KafkaWriteError(
                        f"kafka: producing to {topic}: {errorText(exc, named=True)}"
                    ) from exc
    producer.poll(0)
    _raiseDeliveryErrors(txn)


def _setAsideUnserializable(
    txn: KafkaTransaction,
    batch: pa.RecordBatch,
    layout: ColumnLayout,
    encoded: Encoded,
    base: int,
    topics: list[Any] | None,
) -> tuple[pa.RecordBatch, Encoded]:
    """Rows whose key or value cannot be serialized (``value.format``, ``key.format``): fail
    the task, naming the first, or with ``badRecords`` set them aside; the batch without them."""
    rows = sorted(encoded.failed)
    if txn.deadLetterTopic is None:
        first = rows[0]
        raise KafkaWriteError(
            f"kafka sink: row {base + first} of partition {txn.ctx.partitionId} (counting from "
            f"0) cannot be serialized: {redact(encoded.failed[first])} ({len(rows)} such row(s) "
            "in this batch). Fix the rows or the schema, or set the option badRecords=<topic> "
            "to set such rows aside"
        )
    for row in rows:
        value, key = txn.encoding.shown(batch, layout, row)
        topic = topics[row] if topics is not None else txn.defaultTopic
        size = len(value or b"") + len(key or b"")
        why = encoded.failed[row]
        _setAside(txn, UNSERIALIZABLE, topic, base + row, value, key, size, error=why)
    keep = pa.array([i not in encoded.failed for i in range(batch.num_rows)])
    return batch.filter(keep), encoded.without(set(rows))


def _produceBatch(
    txn: KafkaTransaction,
    topic: str,
    values: list[Any],
    keys: list[Any] | None,
    sizes: Any,
    base: int,
) -> list[int]:
    """The fast path: one topic, no explicit partitions or headers: ``produce_batch``.
    ``sizes`` are the rows' key and value bytes, ``base`` the task's position of row 0.
    Returns the rows set aside (``badRecords``), as positions in ``values``.

    Records of a chunk are handed over only when the local queue has room for the chunk, so a
    full queue is rare; when it happens anyway the refused records must be a suffix of the
    chunk (then they are produced again, in order), else the task fails rather than reorder.
    """
    if keys is None:
        messages = [{"value": v} for v in values]
    elif None not in keys:
        messages = [{"value": v, "key": k} for v, k in zip(values, keys, strict=True)]
    else:
        messages = [
            {"value": v} if k is None else {"value": v, "key": k}
            for v, k in zip(values, keys, strict=True)
        ]
    producer = txn.producer
    assert producer is not None
    aside: list[int] = []
    chunk = max(1, min(BATCH_CHUNK, txn.queueLimit // 2))
    for start in range(0, len(messages), chunk):
        pending = messages[start : start + chunk]
        first = start  # the position in ``messages`` of pending[0]
        while pending:
            while len(producer) + len(pending) > txn.queueLimit:
                producer.poll(0.005)
            _raiseDeliveryErrors(txn)
            try:
                producer.produce_batch(topic, pending)
            except KafkaException as exc:
                raise KafkaWriteError(
                    f"kafka: producing to {topic}: {errorText(exc, named=True)}",
                    reason=KafkaWriteError.classify(exc),
                ) from exc
            refused = [i for i, m in enumerate(pending) if "_error" in m]
            codes = {i: _errorCode(pending[i]["_error"]) for i in refused}
            tooLarge = [i for i in refused if codes[i] == MSG_SIZE_TOO_LARGE]
            if tooLarge and txn.deadLetterTopic is None:
                row = first + tooLarge[0]
                message = producerRefused(txn.ctx, topic, base + row, int(sizes[row]), txn.config)
                raise RecordTooLargeError(redact(message)) from KafkaException(
                    pending[tooLarge[0]]["_error"]
                )
            again = [i for i in refused if codes[i] == QUEUE_FULL]
            other = [i for i in refused if codes[i] not in (QUEUE_FULL, MSG_SIZE_TOO_LARGE)]
            resent = len(pending) - len(again)  # the queue-full ones must be the chunk's tail
            if other or again != list(range(resent, len(pending))):
                shown = pending[(other or again)[0]]["_error"]
                raise KafkaWriteError(
                    f"kafka: producing to {topic} failed: {redact(str(shown))} "
                    f"({len(refused)} of {len(pending)} records refused)"
                )
            txn.produced += resent - len(tooLarge)
            for i in tooLarge:
                row = first + i
                m = pending[i]
                _setAside(txn, TOO_LARGE, topic, base + row, m["value"], m.get("key"), sizes[row])
                aside.append(row)
            pending = pending[resent:]
            for m in pending:
                del m["_error"]
            first += resent
            if pending:
                producer.poll(0.05)
    return aside


def _setAside(
    txn: KafkaTransaction,
    reason: str,
    topic: str | None,
    row: int,
    value: Any,
    key: Any,
    size: Any,
    headers: list[tuple[str, Any]] | None = None,
    error: str | None = None,
) -> None:
    """Produce the dead-letter record of a refused row into the task's transaction."""
    dead = txn.deadLetterTopic
    producer = txn.producer
    assert dead is not None and producer is not None
    bytes_, limit = int(size), producerLimit(txn.config)
    letter = deadLetter(
        txn.ctx,
        reason=reason,
        error=redact(error) if error is not None else describeRefusal(reason, bytes_, limit),
        topic=topic,
        row=row,
        value=value,
        key=key,
        size=bytes_,
        limit=limit,
        headers=headers,
    )
    while True:
        try:
            producer.produce(dead, letter.value, key=letter.key, headers=letter.headers)
            break
        except BufferError:
            producer.poll(0.05)
            _raiseDeliveryErrors(txn)
        except KafkaException as exc:
            raise KafkaWriteError(
                f"kafka: setting row {row} of partition {txn.ctx.partitionId} aside in the "
                f"dead-letter topic {dead} (option badRecords): {errorText(exc, named=True)}",
                reason=KafkaWriteError.classify(exc),
            ) from exc
    txn.fingerprint.addRecord(letter.value, letter.key, extra=letter.fingerprintExtra)
    txn.produced += 1
    txn.setAside += 1


def _errorCode(error: Any) -> int | None:
    code = getattr(error, "code", None)
    return int(code()) if callable(code) else None


def _raiseDeliveryErrors(txn: KafkaTransaction) -> None:
    deliveries = txn.deliveries
    if deliveries.tooLarge:
        (topic, partition), records = next(iter(deliveries.tooLarge.items()))
        message = brokerRefused(
            txn.ctx,
            topic,
            partition,
            records,
            txn.largest,
            txn.config,
            min(txn.requestTimeoutSeconds, 10.0),
        )
        raise RecordTooLargeError(redact(message)) from KafkaException(deliveries.tooLargeError)
    if deliveries.failed:
        raise KafkaWriteError(
            f"kafka: {deliveries.failed} record(s) of transactional id {txn.transactionalId} "
            f"were not delivered: {'; '.join(deliveries.errors)}"
        )


def preCommit(txn: KafkaTransaction) -> dict[str, Any]:
    """Flush, check every delivery report, take producer id and epoch; keep the txn open.

    Returns the handle fields that describe the transaction (the participant adds its own);
    a transaction without records has nothing to commit, and its producer goes back to the
    pool ready for the next task.
    """
    awaitStart(txn)
    producer = txn.producer
    entry = txn.pooled
    if producer is None or txn.produced == 0:
        if producer is not None and txn.began:
            producer.commit_transaction(txn.initTimeoutSeconds)  # local: no partition added
        txn.state = "prepared"
        if entry is not None:
            pool.ready(entry)
        # No transaction: the sink's prefix stands for an id (nothing to commit or sweep).
        return {"transactionalId": txn.transactionalId or txn.prefix, "records": 0}
    deadline = time.monotonic() + txn.flushTimeoutSeconds
    remaining = producer.flush(txn.flushTimeoutSeconds)
    while remaining and time.monotonic() < deadline:
        remaining = producer.flush(max(0.1, deadline - time.monotonic()))
    _raiseDeliveryErrors(txn)
    if remaining:
        raise KafkaWriteError(
            f"kafka: {remaining} record(s) of transactional id {txn.transactionalId} were not "
            f"acknowledged within {txn.flushTimeoutSeconds:.0f} s"
        )
    if txn.deliveries.acked != txn.produced:
        raise KafkaWriteError(
            f"kafka: transactional id {txn.transactionalId}: {txn.produced} records produced "
            f"but {txn.deliveries.acked} acknowledged"
        )
    producerLog = producerLogOf(txn)
    producerId, epoch = producerLog.current()
    if producerLog.fatal is not None:
        raise KafkaWriteError(
            f"kafka: transactional id {txn.transactionalId} failed: {producerLog.fatal}; the "
            "transaction cannot be committed"
        )
    if producerId < 0 or (producerId, epoch) != txn.beganAs:
        raise KafkaWriteError(
            f"kafka: transactional id {txn.transactionalId}: librdkafka reports producer id "
            f"{producerId} epoch {epoch}, but the transaction began with producer id "
            f"{txn.beganAs[0]} epoch {txn.beganAs[1]}: the transaction cannot be committed"
        )
    handle: dict[str, Any] = {
        "transactionalId": txn.transactionalId,
        "producerId": producerId,
        "producerEpoch": epoch,
        "records": txn.produced,
        "fingerprint": txn.fingerprint.toText(),
        "startedAtMs": txn.startedAtMs,
        "transactionTimeoutMs": txn.transactionTimeoutMs,
    }
    last = txn.deliveries.last
    if last is not None:
        handle["probe"] = {
            "topic": last.topic(),
            "partition": last.partition(),
            "offset": last.offset(),
        }
    txn.state = "prepared"
    assert entry is not None
    pool.prepared(entry, txn.ctx.runId, txn.ctx.batchId)
    return handle
