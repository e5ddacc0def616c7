"""The Kafka source's options, validated once: which partitions, from where, how much per batch.

Options are those of Spark's own Kafka source, so a query moves between the two by changing the
format name:

- ``subscribe`` (comma-separated topics), ``subscribePattern`` (a regular expression matched
  against whole topic names) or ``assign`` (JSON ``{"topic": [0, 1]}``): exactly one;
- ``startingOffsets``: ``latest`` (default), ``earliest`` or JSON
  ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest; every partition named);
- ``maxOffsetsPerTrigger``: at most this many offsets per micro-batch, shared between
  partitions in proportion to their backlog;
- ``minPartitions``: split large ranges so a batch has at least this many tasks;
- ``minRecordsPerPartition`` (default 10000): topic partitions with fewer new records than this
  are read together, several in one Spark partition by one consumer, until it holds at least
  this many (0: one Spark partition per topic partition, as Spark's Kafka source plans; not
  used with ``minPartitions``). A Python task has a fixed cost that Spark's JVM tasks do not,
  so a batch of many small ranges is read faster, and sooner visible, in few tasks;
- ``failOnDataLoss`` (default true): fail when offsets were deleted before they were read, or a
  partition disappeared; false skips them with a warning;
- ``includeHeaders`` (default false): add the ``headers`` column;
- ``fetchOffset.numRetries`` (default 3) and ``fetchOffset.retryIntervalMs`` (default 1000):
  how often, and how far apart, the driver asks again for offsets or metadata the cluster did
  not answer within ``requestTimeoutSeconds`` before the query fails;
- ``kafka.<name>``: librdkafka consumer properties; ``kafka.isolation.level`` defaults to
  ``read_committed`` (Spark's source defaults to ``read_uncommitted``), so a pipeline Kafka ->
  Spark -> ``twophase.kafka`` stays exactly-once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from twophase.clients.kafka import librdkafkaConfig
from twophase.settings import (
    TwoPhaseConfigError,
    boolOption,
    floatOption,
    intOption,
    optionOf,
)
from twophase.sources.kafka.offsets import Offsets, parseOffsetsJson

BASE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
"""The source's columns, as Spark's Kafka source has them (Spark DDL)."""
HEADERS_SCHEMA = "headers array<struct<key: string, value: binary>>"
"""The ``headers`` column added by ``includeHeaders``."""

_FORBIDDEN_CONSUMER_OPTIONS = {
    "auto.offset.reset": "use the startingOffsets option (as with Spark's Kafka source)",
    "enable.auto.commit": "the source keeps its offsets in Spark's checkpoint and never commits",
    "group.instance.id": "the source assigns partitions itself and joins no group",
}

_CONSUMER_DEFAULTS = {"isolation.level": "read_committed"}


@dataclass(frozen=True)
class KafkaSourceSettings:
    """The Kafka source's options, validated once (``KafkaSourceSettings.fromOptions``)."""

    consumerConfig: dict[str, str] = field(hash=False, repr=False)  # may hold secrets
    subscribe: tuple[str, ...] = ()
    subscribePattern: str | None = None
    assign: tuple[tuple[str, int], ...] = ()
    startingOffsets: str | Offsets = "latest"
    maxOffsetsPerTrigger: int | None = None
    minPartitions: int | None = None
    minRecordsPerPartition: int = 10000
    failOnDataLoss: bool = True
    includeHeaders: bool = False
    pollTimeoutSeconds: float = 120.0
    requestTimeoutSeconds: float = 30.0
    fetchOffsetNumRetries: int = 3
    fetchOffsetRetryIntervalSeconds: float = 1.0
    maxRecordsPerArrowBatch: int = 10000

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> KafkaSourceSettings:
        config = dict(_CONSUMER_DEFAULTS)
        config.update(librdkafkaConfig(options, forbidden=_FORBIDDEN_CONSUMER_OPTIONS))
        isolation = config["isolation.level"].strip().lower()
        if isolation not in ("read_committed", "read_uncommitted"):
            raise TwoPhaseConfigError(
                f"option kafka.isolation.level={isolation!r} must be read_committed or "
                "read_uncommitted"
            )
        config["isolation.level"] = isolation
        subscribe = optionOf(options, "subscribe")
        pattern = optionOf(options, "subscribePattern")
        assign = optionOf(options, "assign")
        chosen = [
            n
            for n, v in (
                ("subscribe", subscribe),
                ("subscribePattern", pattern),
                ("assign", assign),
            )
            if v is not None and v.strip()
        ]
        if len(chosen) != 1:
            raise TwoPhaseConfigError(
                "the kafka source needs exactly one of the options subscribe, subscribePattern "
                f"or assign; got {', '.join(chosen) or 'none'}"
            )
        topics: tuple[str, ...] = ()
        if subscribe:
            topics = tuple(t.strip() for t in subscribe.split(",") if t.strip())
        if pattern:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise TwoPhaseConfigError(
                    f"option subscribePattern={pattern!r} is not a regular expression: {exc}"
                ) from None
        assigned: tuple[tuple[str, int], ...] = ()
        if assign:
            assigned = parseAssign(assign)
        starting: str | Offsets = "latest"
        text = (optionOf(options, "startingOffsets") or "latest").strip()
        if text.lower() in ("earliest", "latest"):
            starting = text.lower()
        else:
            starting = parseOffsetsJson(text, "startingOffsets")
        maxOffsets = intOption(options, "maxOffsetsPerTrigger", 0, minimum=0) or None
        minPartitions = intOption(options, "minPartitions", 0, minimum=0) or None
        return cls(
            consumerConfig=config,
            subscribe=topics,
            subscribePattern=pattern.strip() if pattern else None,
            assign=assigned,
            startingOffsets=starting,
            maxOffsetsPerTrigger=maxOffsets,
            minPartitions=minPartitions,
            minRecordsPerPartition=intOption(options, "minRecordsPerPartition", 10000, minimum=0),
            failOnDataLoss=boolOption(options, "failOnDataLoss", True),
            includeHeaders=boolOption(options, "includeHeaders", False),
            pollTimeoutSeconds=intOption(options, "kafkaConsumer.pollTimeoutMs", 120000, minimum=1)
            / 1000,
            requestTimeoutSeconds=floatOption(options, "requestTimeoutSeconds", 30.0),
            fetchOffsetNumRetries=intOption(options, "fetchOffset.numRetries", 3, minimum=0),
            fetchOffsetRetryIntervalSeconds=intOption(
                options, "fetchOffset.retryIntervalMs", 1000, minimum=0
            )
            / 1000,
            maxRecordsPerArrowBatch=intOption(options, "maxRecordsPerArrowBatch", 10000, minimum=1),
        )

    @property
    def readCommitted(self) -> bool:
        return self.consumerConfig["isolation.level"] == "read_committed"

    def schema(self, valueType: str | None = None, keyType: str | None = None) -> str:
        """Spark's DDL of the columns; ``valueType`` and ``keyType`` replace the binary type of
        ``value`` and ``key`` (decoded from a registry format)."""
        base = BASE_SCHEMA
        if valueType is not None:
            base = base.replace("value binary", f"value {valueType}")
        if keyType is not None:
            base = base.replace("key binary", f"key {keyType}")
        return f"{base}, {HEADERS_SCHEMA}" if self.includeHeaders else base

    def describeSubscription(self) -> str:
        if self.subscribe:
            return f"subscribe={','.join(self.subscribe)}"
        if self.subscribePattern:
            return f"subscribePattern={self.subscribePattern}"
        return f"assign={json.dumps(assignJson(self.assign))}"


def assignJson(assigned: Sequence[tuple[str, int]]) -> dict[str, list[int]]:
    """``(("t", 0), ("t", 1))`` -> ``{"t": [0, 1]}``: the form of option ``assign``."""
    result: dict[str, list[int]] = {}
    for topic, partition in assigned:
        result.setdefault(topic, []).append(partition)
    return result


def parseAssign(text: str) -> tuple[tuple[str, int], ...]:
    """Option ``assign`` (``{"t": [0, 1]}``) as ``(topic, partition)`` pairs."""
    try:
        value = json.loads(text)
        pairs = tuple((str(topic), int(p)) for topic, parts in value.items() for p in parts)
    except (ValueError, AttributeError, TypeError):
        raise TwoPhaseConfigError(
            f'option assign={text!r} must be JSON like {{"topicA": [0, 1], "topicB": [2]}}'
        ) from None
    if not pairs:
        raise TwoPhaseConfigError("option assign names no partition")
    return pairs
