"""The Kafka sink's options, parsed and checked once; its transactional ids; what is safe to keep.

``SAFE_OPTIONS`` lists the options written to the checkpoint's ``sink.json``: what the
committer needs to commit, abort and recover from there alone (the cluster, the non-secret
client settings, the transactional id prefix and timeouts), and nothing that may be secret.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from twophase.clients.kafka import (
    SAFE_CLIENT_OPTIONS,
    brokerTransactionMaxTimeoutMs,
    librdkafkaConfig,
)
from twophase.options import SinkOption, keptOptions
from twophase.schemaregistry.client import PREFIX, SAFE_REGISTRY_SETTINGS
from twophase.schemaregistry.formats import RESOLVED, FormatSpec
from twophase.settings import TwoPhaseConfigError, floatOption, optionOf

DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
"""``transaction.timeout.ms`` unless set: how long, at most, a crashed query's open transactions
stall ``read_committed`` readers (plus the broker's abort sweep, 10 s by default)."""

RESOLVED_TIMEOUT_OPTION = "twophase.kafka.transactionTimeoutMs"
"""Where the driver leaves the resolved transaction timeout for the executors."""

DEFAULT_MESSAGE_TIMEOUT_MS = 120000
"""Delivery timeout unless set (Java's ``delivery.timeout.ms``): a task whose records cannot
be delivered fails after 2 minutes instead of waiting for the whole transaction timeout."""

OPTIONS = (
    SinkOption(("kafka.bootstrap.servers",), "string", "required", "the cluster"),
    SinkOption(("topic",), "string", "-", "topic of every row (overrides a `topic` column)"),
    SinkOption(
        ("transactionalIdPrefix",),
        "string",
        "`twophase-<sinkId>`",
        "transactional ids are `<prefix>-<partition>` (see below)",
    ),
    SinkOption(
        ("kafka.transaction.timeout.ms",),
        "integer",
        "60000, or the brokers' `transaction.max.timeout.ms` if lower",
        "how long a prepared transaction may wait for the driver, and how long a crashed query "
        'can stall `read_committed` readers (see "Choosing the timeout")',
    ),
    SinkOption(
        ("kafka.*",),
        "prefix",
        "",
        "any librdkafka producer property (`kafka.linger.ms`, `kafka.compression.type`, "
        "`kafka.security.protocol`, `kafka.sasl.*`, `kafka.ssl.*` ...); the checkpoint keeps "
        "those that are names, mechanisms, paths or tuning (below)",
        kept=tuple(sorted(SAFE_CLIENT_OPTIONS)),
    ),
    SinkOption(
        ("flushTimeoutSeconds",),
        "seconds",
        "delivery timeout + 30",
        "how long a task waits for its records' acknowledgements",
    ),
    SinkOption(
        ("initTimeoutSeconds",),
        "seconds",
        "120",
        "bound of `init_transactions` in a task and in recovery",
    ),
    SinkOption(
        ("requestTimeoutSeconds",),
        "seconds",
        "30",
        "bound of each request the driver makes (reach the cluster, read its settings, end and "
        "list transactions)",
    ),
    SinkOption(
        ("badRecords",),
        "string",
        "`fail`",
        "`fail`: a record Kafka refuses fails its batch; a topic name: such records go to that "
        'dead-letter topic in the task\'s own transaction (see "Setting refused records aside")',
    ),
    SinkOption(
        ("value.format", "key.format"),
        "choice",
        "`bytes`",
        "`bytes` (a string or binary column as its bytes), `string`, `avro`, `jsonschema` or "
        '`protobuf` (the registry\'s wire format; see "Avro, JSON Schema and Protobuf")',
    ),
    SinkOption(
        ("schema.registry.url",),
        "string",
        "-",
        "the schema registry (Confluent's REST API), needed by `avro`, `jsonschema`, `protobuf`",
    ),
    SinkOption(
        ("schema.registry.*",),
        "prefix",
        "",
        "the registry client's other settings (`schema.registry.basic.auth.user.info`, "
        "`schema.registry.bearer.auth.*`, `schema.registry.ssl.*`); the checkpoint keeps only "
        "the `ssl.*.location` paths",
        kept=tuple(PREFIX + s for s in SAFE_REGISTRY_SETTINGS if s != "url"),
    ),
    SinkOption(
        ("value.schema", "key.schema"),
        "string",
        "derived from the columns",
        "the schema's JSON text (Protobuf: the base64 of its FileDescriptorProto); rows it does "
        "not fit fail before anything is written",
    ),
    SinkOption(
        ("value.subject.name.strategy", "key.subject.name.strategy"),
        "choice",
        "`TopicNameStrategy`",
        "`TopicNameStrategy` (`<topic>-value`), `RecordNameStrategy` (the record's full name) "
        "or `TopicRecordNameStrategy` (`<topic>-<record name>`)",
    ),
    SinkOption(
        ("value.record.name", "key.record.name"),
        "string",
        "`topLevelRecord`",
        "the full name of a derived record schema (`com.example.Order`); Protobuf: the "
        "message of a given file that has several",
    ),
    SinkOption(
        ("auto.register.schemas",),
        "boolean",
        "true",
        "register the schema (idempotent, on the driver before the tasks); false: it must be "
        "registered already",
    ),
    SinkOption(
        ("use.latest.version",),
        "boolean",
        "false",
        "write with the subject's latest schema instead of the derived or given one",
    ),
)
"""The Kafka sink's options, declared once (docs/kafka.md's table comes from it)."""

SAFE_OPTIONS = keptOptions(OPTIONS) | {RESOLVED_TIMEOUT_OPTION.lower()}
"""Options (lower-case) that never hold a secret and that the committer may need: the declared
ones and the transaction timeout the driver resolved for the executors."""

_PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
_TOPIC_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

_FORBIDDEN_PRODUCER_OPTIONS = {
    "transactional.id": "the sink sets it per task; choose its prefix with option "
    "transactionalIdPrefix",
    "enable.idempotence": "transactions need the idempotent producer",
    "transaction.timeout.ms.default": "set kafka.transaction.timeout.ms",
}

_PRODUCER_DEFAULTS = {
    # Java's default partitioner (murmur2 of the key), as Spark's Kafka sink uses; librdkafka's
    # own default (CRC32) would send keyed records to other partitions.
    "partitioner": "murmur2_random",
    # Memory per task: at most 64 MiB of records waiting for the broker.
    "queue.buffering.max.kbytes": "65536",
}


@dataclass(frozen=True)
class KafkaSettings:
    """The Kafka sink's options, parsed and checked once (``KafkaSettings.fromOptions``).

    - ``kafka.bootstrap.servers`` (required) and any other ``kafka.<name>``: librdkafka
      producer properties (Java names Spark users know are translated or refused clearly).
    - ``topic``: the topic of every row; overrides a ``topic`` column (as in Spark).
    - ``transactionalIdPrefix``: transactional ids are ``<prefix>-w<worker>-<n>`` (default
      ``twophase-<sinkId>``). The principal needs WRITE and DESCRIBE on ids with this prefix.
    - ``kafka.transaction.timeout.ms``: default ``DEFAULT_TRANSACTION_TIMEOUT_MS`` (one minute),
      or the broker's ``transaction.max.timeout.ms`` when that is lower. It bounds how long a
      crashed query's open transactions hold ``read_committed`` readers back; a decided
      transaction the broker aborts meanwhile is written again by the replay of its batch.
    - ``flushTimeoutSeconds``: how long a task waits for its records' acknowledgements
      (default: ``kafka.message.timeout.ms`` + 30 s).
    - ``initTimeoutSeconds``: bound of ``init_transactions`` (default 120 s).
    - ``requestTimeoutSeconds``: bound of each request to the cluster outside tasks: reaching
      it, reading its settings, ending and listing transactions (default 30 s).
    - ``badRecords``: ``fail`` (default: a row Kafka refuses fails its batch) or a dead-letter
      topic, where such rows go in the task's own transaction (``deadletter``).
    """

    producerConfig: dict[str, str] = field(hash=False, repr=False)  # may hold secrets
    topic: str | None
    transactionalIdPrefix: str | None
    transactionTimeoutMs: int | None
    flushTimeoutSeconds: float
    initTimeoutSeconds: float
    requestTimeoutSeconds: float
    badRecords: str | None = None
    """The dead-letter topic; ``None``: ``fail``."""
    valueFormat: FormatSpec = field(default_factory=lambda: FormatSpec("value"))
    keyFormat: FormatSpec = field(default_factory=lambda: FormatSpec("key"))
    registered: Mapping[str, str] = field(default_factory=dict, hash=False, repr=False)
    """What the driver registered, by side (``formats.RESOLVED``'s JSON), for the tasks."""

    @classmethod
    def fromOptions(cls, options: Mapping[str, str]) -> KafkaSettings:
        config = dict(_PRODUCER_DEFAULTS)
        config.update(librdkafkaConfig(options, forbidden=_FORBIDDEN_PRODUCER_OPTIONS))
        timeout = _intConfig(config, "transaction.timeout.ms")
        config.pop("transaction.timeout.ms", None)
        if timeout is None:
            resolved = optionOf(options, RESOLVED_TIMEOUT_OPTION)
            timeout = int(resolved) if resolved else None
        messageTimeout = (
            _intConfig(config, "delivery.timeout.ms")
            or _intConfig(config, "message.timeout.ms")
            or DEFAULT_MESSAGE_TIMEOUT_MS
        )
        prefix = optionOf(options, "transactionalIdPrefix")
        if prefix is not None and not _PREFIX_PATTERN.match(prefix):
            raise TwoPhaseConfigError(
                f"option transactionalIdPrefix={prefix!r} must be 1-200 letters, digits, '_', "
                "'.', '-', starting with a letter or digit"
            )
        topic = (optionOf(options, "topic") or "").strip() or None
        formats = {side: FormatSpec.fromOptions(options, side) for side in ("value", "key")}
        registered = {
            side: raw
            for side in formats
            if (raw := optionOf(options, RESOLVED.format(side=side))) is not None
        }
        return cls(
            valueFormat=formats["value"],
            keyFormat=formats["key"],
            registered=registered,
            badRecords=_deadLetterTopic(options, topic),
            producerConfig=config,
            topic=topic,
            transactionalIdPrefix=prefix,
            transactionTimeoutMs=timeout,
            flushTimeoutSeconds=floatOption(
                options, "flushTimeoutSeconds", messageTimeout / 1000 + 30
            ),
            initTimeoutSeconds=floatOption(options, "initTimeoutSeconds", 120.0),
            requestTimeoutSeconds=floatOption(options, "requestTimeoutSeconds", 30.0),
        )

    @property
    def bootstrapServers(self) -> str:
        return self.producerConfig["bootstrap.servers"]

    def prefixFor(self, sinkId: str) -> str:
        """The transactional id prefix of the sink ``sinkId``."""
        return self.transactionalIdPrefix or f"twophase-{sinkId}"

    def resolvedTransactionTimeoutMs(self) -> int:
        """``kafka.transaction.timeout.ms``, else one minute or the brokers' maximum if lower."""
        if self.transactionTimeoutMs is not None:
            return self.transactionTimeoutMs
        brokerMax = brokerTransactionMaxTimeoutMs(self.producerConfig, self.requestTimeoutSeconds)
        return min(DEFAULT_TRANSACTION_TIMEOUT_MS, brokerMax)


def _deadLetterTopic(options: Mapping[str, str], topic: str | None) -> str | None:
    """Option ``badRecords``: ``fail`` (``None``) or a topic other than the sink's own."""
    raw = (optionOf(options, "badRecords") or "fail").strip()
    if raw.lower() == "fail":
        return None
    if not _TOPIC_PATTERN.match(raw) or raw in (".", ".."):
        raise TwoPhaseConfigError(
            f"option badRecords={raw!r} must be 'fail' or a topic name (1-249 letters, digits, "
            "'.', '_', '-') where refused rows are set aside"
        )
    if raw == topic:
        raise TwoPhaseConfigError(
            f"option badRecords={raw!r} names the sink's own topic: choose another topic for "
            "the rows Kafka refuses"
        )
    return raw


def _intConfig(config: Mapping[str, str], name: str) -> int | None:
    raw = config.get(name)
    if raw is None:
        return None
    try:
        return int(str(raw).strip())
    except ValueError:
        raise TwoPhaseConfigError(f"option kafka.{name}={raw!r} is not an integer") from None


def transactionalIdFor(prefix: str, partitionId: int, attemptNumber: int) -> str:
    """The ids of earlier versions of the sink, one per partition and attempt (swept still).

    ``<prefix>-<partition>`` for a first attempt, ``<prefix>-<partition>-a<n>`` for others.
    Tasks now use their worker's pooled ids (``twophase.sinks.kafka.pool``); recovery still
    sweeps these, which a checkpoint written by an earlier version may have left open.
    """
    if attemptNumber <= 0:
        return f"{prefix}-{partitionId}"
    return f"{prefix}-{partitionId}-a{attemptNumber}"


def ownedIds(prefix: str) -> re.Pattern[str]:
    """The transactional ids the sink makes with ``prefix``, and no other.

    Pooled ids ``<prefix>-w<12 hex>-<n>`` (any worker, any shape of the query), and the
    per-partition ids of earlier versions (``transactionalIdFor``).
    """
    return re.compile(rf"^{re.escape(prefix)}-(?:\d+(?:-a\d+)?|w[0-9a-f]{{12}}-\d+)$")
