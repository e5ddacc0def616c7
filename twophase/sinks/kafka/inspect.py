"""What Kafka holds for a Kafka sink, for ``twophase doctor``: open transactions and stalls.

Read-only requests through kafka-python's admin client (its public calls for KIP-664's
transaction tooling): ListTransactions of the sink's transactional-id prefix in the states
that still hold records back (``Ongoing``, ``PrepareCommit``, ``PrepareAbort``), then
DescribeTransactions of those ids for the start time, the timeout (so when the broker aborts
the transaction) and the partitions each one writes. For the sink's topic and those
partitions, ListOffsets twice (``read_uncommitted`` gives the high watermark,
``read_committed`` the last stable offset): a partition whose last stable offset is behind is
one whose ``read_committed`` readers stand still, since the oldest open transaction writing it
began. Recovery (``KafkaCommitter.recoverAndAbort``) fences only ids the sink makes
(``ownedIds``), so another id with the prefix is ``foreign``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from twophase.clients.kafka import kafkaPythonConfig, protectKafkaPythonLogs
from twophase.doctor.findings import CannotCheck, Held, Inspection, Stall
from twophase.redaction import getLogger, redact
from twophase.sinks.kafka.acls import describeSinkAcls
from twophase.sinks.kafka.committer import FOREIGN_ID, preparedNames
from twophase.sinks.kafka.settings import ownedIds

if TYPE_CHECKING:
    from twophase.sinks.kafka.committer import KafkaCommitter

log = getLogger(__name__)

OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort")
"""Transaction states in which a transaction still holds back the last stable offset."""

TIMEOUT_SECONDS = 10.0
"""Bound of reaching the cluster and of each request, so a probe answers in time (the sink's
``requestTimeoutSeconds`` when smaller)."""


handleKey = preparedNames
"""What a logged handle names on the brokers, as the committer's sweep names it."""


def inspect(committer: KafkaCommitter, sinkId: str, now: datetime) -> Inspection:
    """Read-only: the sink's open transactions and the partitions they stall.

    Raises ``CannotCheck`` naming the bootstrap servers when the cluster cannot be reached or
    refuses to list transactions.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    s = committer.settings
    servers = redact(s.bootstrapServers)
    prefix = s.prefixFor(sinkId)
    timeout = min(TIMEOUT_SECONDS, s.requestTimeoutSeconds)
    protectKafkaPythonLogs()
    try:
        admin = KafkaAdminClient(
            **kafkaPythonConfig(s.producerConfig),
            request_timeout_ms=int(timeout * 1000),
            bootstrap_timeout_ms=int(timeout * 1000),
            reconnect_backoff_max_ms=1000,
        )
    except KafkaError as exc:
        raise CannotCheck(
            f"kafka: cannot reach the cluster at {servers} within {timeout:g} s "
            f"({type(exc).__name__}). Fix: start the brokers, or give the right "
            "--sink-option kafka.bootstrap.servers=... and security options"
        ) from None
    try:
        inspection = Inspection("kafka", f"{servers}, transactional ids {prefix}-*")
        described = _openTransactions(admin, prefix)
        owned = ownedIds(prefix)
        topics = {s.topic} if s.topic else set()
        for info in described.values():
            topics.update(tp.topic for tp in info.topic_partitions)
        stalls = _stalls(admin, sorted(topics))
        claimed: set[tuple[str, int]] = set()
        for tid, info in sorted(described.items()):
            start = _moment(info.transaction_start_time_ms)
            timeoutMs = int(info.transaction_timeout_ms)
            mine = tuple(
                st
                for st in stalls
                if any(
                    (tp.topic, tp.partition) == (st.topic, st.partition)
                    for tp in info.topic_partitions
                )
            )
            claimed.update((st.topic, st.partition) for st in mine)
            state = str(getattr(info.state, "value", info.state))
            inspection.held.append(
                Held(
                    system="kafka",
                    key=tid,
                    what="open transaction",
                    since=start,
                    abortsAt=None
                    if start is None or timeoutMs <= 0
                    else _moment(int(info.transaction_start_time_ms) + timeoutMs),
                    state=state,
                    detail=f"producer id {info.producer_id}, epoch {info.producer_epoch}, "
                    f"timeout {timeoutMs} ms, "
                    f"{len(info.topic_partitions)} partition(s)",
                    foreign=None if owned.match(tid) else FOREIGN_ID,
                    stalls=mine,
                )
            )
        inspection.otherStalls = [st for st in stalls if (st.topic, st.partition) not in claimed]
        inspection.grants, inspection.grantsMissing = describeSinkAcls(
            s.producerConfig, s.topic, prefix, timeout
        )
        return inspection
    except KafkaError as exc:
        raise CannotCheck(
            f"kafka: the cluster at {servers} did not answer doctor's requests "
            f"({type(exc).__name__}: {redact(str(exc))}). Fix: check the brokers, and that "
            "the principal may DESCRIBE the sink's transactional ids and topic"
        ) from None
    finally:
        admin.close()


def _openTransactions(admin: Any, prefix: str) -> dict[str, Any]:
    """DescribeTransactions of every open transaction whose id starts with ``prefix-``."""
    from kafka.errors import KafkaError, UnsupportedVersionError

    pattern = "".join(c if c.isalnum() else "\\" + c for c in prefix) + "-.*"
    try:
        listed = admin.list_transactions(
            state_filters=list(OPEN_STATES), transactional_id_pattern=pattern
        )
    except UnsupportedVersionError:  # brokers before 4.1 filter ids on this side only
        listed = admin.list_transactions(state_filters=list(OPEN_STATES))
    ids = sorted(
        {
            str(t.transactional_id)
            for rows in listed.values()
            for t in rows
            if str(t.transactional_id).startswith(prefix + "-")
        }
    )
    if not ids:
        return {}
    try:
        return dict(admin.describe_transactions(ids))
    except KafkaError:  # one id ended meanwhile: describe them one by one
        described: dict[str, Any] = {}
        for tid in ids:
            try:
                described.update(admin.describe_transactions([tid]))
            except KafkaError as exc:
                log.debug("kafka: doctor: cannot describe %s: %s", tid, exc)
        return {t: d for t, d in described.items() if _stateOf(d) in OPEN_STATES}


def _stateOf(info: Any) -> str:
    return str(getattr(info.state, "value", info.state))


def _stalls(admin: Any, topics: list[str]) -> list[Stall]:
    """Partitions of ``topics`` whose last stable offset is behind their high watermark."""
    from kafka import TopicPartition
    from kafka.admin import OffsetSpec
    from kafka.protocol.consumer.offsets import IsolationLevel

    if not topics:
        return []
    partitions: list[Any] = []
    for topic in admin.describe_topics(topics):
        if topic.get("error_code", 0) != 0:
            continue  # not created yet, or not ours to describe
        name = str(topic["name"])
        partitions.extend(
            TopicPartition(name, int(p["partition_index"])) for p in topic["partitions"]
        )
    if not partitions:
        return []
    specs = {tp: OffsetSpec.LATEST for tp in partitions}
    high = admin.list_partition_offsets(specs)
    stable = admin.list_partition_offsets(specs, isolation_level=IsolationLevel.READ_COMMITTED)
    stalls = []
    for tp in sorted(partitions, key=lambda t: (t.topic, t.partition)):
        hw, lso = int(high[tp].offset), int(stable[tp].offset)
        if lso < hw:
            stalls.append(Stall(tp.topic, tp.partition, lso, hw))
    return stalls


def _moment(millis: Any) -> datetime | None:
    value = int(millis)
    return None if value <= 0 else datetime.fromtimestamp(value / 1000, UTC)
