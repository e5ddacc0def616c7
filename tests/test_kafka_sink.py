"""The Kafka sink without a broker: options, secrets, ids, columns, handles, what preCommit reads.

What needs a broker (the real transactions, EndTxn from another client, fencing, reading back,
each outcome of ``commit``) is in integration_tests/test_kafka_*.py, the outcomes of a commit
the broker refuses in integration_tests/test_kafka_commit_outcomes.py.
"""

from __future__ import annotations

import logging
import pickle
import re
from typing import Any

import pyarrow as pa
import pytest

from twophase.clients.kafka import (
    kafkaPythonConfig,
    librdkafkaConfig,
    protectKafkaPythonLogs,
    shownConfig,
)
from twophase.protocol import (
    TransactionContext,
)
from twophase.redaction import REDACTED
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.kafka import (
    RESOLVED_TIMEOUT_OPTION,
    ColumnLayout,
    KafkaCommitter,
    KafkaSettings,
    KafkaWriteError,
    KafkaWriter,
    checkColumns,
    ownedIds,
    sending,
    transactionalIdFor,
)
from twophase.sinks.kafka import producer as producing
from twophase.sinks.kafka.encoding import RecordEncoding

BOOTSTRAP = {"kafka.bootstrap.servers": "127.0.0.1:9"}


def committer(**options: str) -> KafkaCommitter:
    return KafkaCommitter.fromOptions({**BOOTSTRAP, "topic": "t", **options})


def handle(**overrides: Any) -> dict[str, Any]:
    h: dict[str, Any] = {
        "kind": "kafka",
        "batchId": 7,
        "partitionId": 3,
        "attempt": 0,
        "transactionalId": "twophase-s-3",
        "producerId": 42,
        "producerEpoch": 5,
        "records": 10,
        "startedAtMs": 0,
        "transactionTimeoutMs": 0,
        "probe": {"topic": "t", "partition": 1, "offset": 99},
    }
    h.update(overrides)
    return h


# -- options ------------------------------------------------------------------------------


def test_bootstrap_servers_are_required() -> None:
    with pytest.raises(TwoPhaseConfigError, match="kafka.bootstrap.servers is required"):
        KafkaSettings.fromOptions({"topic": "t"})


def test_kafka_options_go_to_librdkafka_with_java_compatible_defaults() -> None:
    settings = KafkaSettings.fromOptions(
        {**BOOTSTRAP, "kafka.linger.ms": "20", "kafka.compression.type": "lz4", "topic": "t"}
    )
    assert settings.producerConfig["linger.ms"] == "20"
    assert settings.producerConfig["compression.type"] == "lz4"
    # Spark's Kafka sink partitions keyed records with Java's murmur2; librdkafka's default
    # would not, so the same key would land elsewhere.
    assert settings.producerConfig["partitioner"] == "murmur2_random"
    assert settings.flushTimeoutSeconds == 150  # the 2 minutes delivery timeout + 30 s
    assert settings.topic == "t"
    assert settings.transactionTimeoutMs is None
    assert settings.prefixFor("sink-1") == "twophase-sink-1"


def test_the_delivery_timeout_fits_inside_the_transaction_timeout() -> None:
    withTimeouts = producing.withTimeouts
    assert withTimeouts({}, 900000)["message.timeout.ms"] == 120000
    assert withTimeouts({}, 3000)["message.timeout.ms"] == 3000  # librdkafka requires <=
    assert withTimeouts({"message.timeout.ms": "5000"}, 900000)["message.timeout.ms"] == "5000"


def test_an_explicit_transaction_timeout_wins_over_the_resolved_one() -> None:
    resolved = {**BOOTSTRAP, RESOLVED_TIMEOUT_OPTION: "600000"}
    assert KafkaSettings.fromOptions(resolved).transactionTimeoutMs == 600000
    both = {**resolved, "kafka.transaction.timeout.ms": "60000"}
    settings = KafkaSettings.fromOptions(both)
    assert settings.transactionTimeoutMs == 60000
    assert "transaction.timeout.ms" not in settings.producerConfig


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("kafka.transactional.id", "transactionalIdPrefix"),
        ("kafka.enable.idempotence", "idempotent"),
        ("kafka.key.serializer", "Java client property"),
        ("kafka.ssl.truststore.location", "kafka.ssl.ca.location"),
        ("kafka.max.request.size", "kafka.message.max.bytes"),
    ],
)
def test_options_librdkafka_cannot_honour_are_refused_by_name(option: str, message: str) -> None:
    with pytest.raises(TwoPhaseConfigError, match=message) as info:
        KafkaSettings.fromOptions({**BOOTSTRAP, option: "x"})
    assert option in str(info.value)


def test_sasl_jaas_config_becomes_librdkafka_credentials_and_is_never_shown() -> None:
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="s3cr\\"et";'
    )
    config = librdkafkaConfig(
        {**BOOTSTRAP, "kafka.sasl.jaas.config": jaas, "kafka.security.protocol": "SASL_SSL"},
        forbidden={},
    )
    assert config["sasl.username"] == "alice"
    assert config["sasl.password"] == 's3cr"et'
    assert config["security.protocol"] == "sasl_ssl"
    assert "s3cr" not in str(shownConfig(config))
    assert shownConfig(config)["sasl.password"] == REDACTED
    assert shownConfig(config)["sasl.username"] == "alice"


def test_oauth_jaas_config_is_refused_with_the_librdkafka_way() -> None:
    jaas = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ;"
    with pytest.raises(TwoPhaseConfigError, match="sasl.oauthbearer"):
        librdkafkaConfig({**BOOTSTRAP, "kafka.sasl.jaas.config": jaas}, forbidden={})


def test_the_driver_client_gets_the_same_cluster_and_credentials() -> None:
    kwargs = kafkaPythonConfig(
        {
            "bootstrap.servers": "a:1,b:2",
            "security.protocol": "sasl_ssl",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": "pw",
            "ssl.ca.location": "/ca.pem",
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    assert kwargs["bootstrap_servers"] == ["a:1", "b:2"]
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["sasl_plain_username"] == "alice"
    assert kwargs["sasl_plain_password"] == "pw"
    assert kwargs["ssl_cafile"] == "/ca.pem"
    assert kwargs["ssl_check_hostname"] is False
    with pytest.raises(TwoPhaseConfigError, match="OAUTHBEARER"):
        kafkaPythonConfig(
            {
                "bootstrap.servers": "a:1",
                "security.protocol": "sasl_plaintext",
                "sasl.mechanism": "OAUTHBEARER",
            }
        )


def test_kafka_pythons_debug_dump_of_its_configuration_is_redacted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    protectKafkaPythonLogs()
    logger = logging.getLogger("kafka.admin.client")
    with caplog.at_level(logging.DEBUG, logger="kafka.admin.client"):
        logger.debug(
            "Starting KafkaAdminClient with configuration: %s",
            {"sasl_plain_password": "hunter2", "ssl_password": "k3y-pw", "bootstrap_servers": "x"},
        )
    assert "hunter2" not in caplog.text and "k3y-pw" not in caplog.text
    assert REDACTED in caplog.text and "'bootstrap_servers': 'x'" in caplog.text


def test_a_bad_transactional_id_prefix_is_refused() -> None:
    with pytest.raises(TwoPhaseConfigError, match="transactionalIdPrefix"):
        KafkaSettings.fromOptions({**BOOTSTRAP, "transactionalIdPrefix": "bad prefix!"})


# -- transactional ids ----------------------------------------------------------------------


def test_pooled_ids_are_per_worker_and_recovery_owns_them_and_the_older_ids() -> None:
    from twophase.sinks.kafka import pool

    first, free = pool.acquire("twophase-s", "k", "run", 0)
    second, _ = pool.acquire("twophase-s", "k", "run", 0)
    assert not free and first.transactionalId != second.transactionalId
    token = pool.workerIdPrefix("twophase-s")
    assert first.transactionalId.startswith(token) and re.fullmatch(
        r"twophase-s-w[0-9a-f]{12}-", token
    )
    pool.discard(first)
    pool.discard(second)
    owned = ownedIds("twophase-s")
    assert owned.match(first.transactionalId) and owned.match(second.transactionalId)
    # Ids of earlier versions (one per partition and attempt) are still swept.
    assert transactionalIdFor("p", 3, 0) == "p-3"
    assert transactionalIdFor("p", 3, 1) == "p-3-a1"
    assert owned.match("twophase-s-3")
    assert owned.match("twophase-s-3-a2")
    assert not owned.match("twophase-s-x-3")  # another sink whose prefix extends ours
    assert not owned.match("twophase-s-3-b")
    assert not owned.match("twophase-s-wabc-3")
    assert not owned.match("twophase-s-x-w0123456789ab-3")


def test_a_prepared_id_is_reused_only_by_a_later_batch_or_another_run() -> None:
    from twophase.sinks.kafka import pool

    entry, _ = pool.acquire("twophase-r", "k", "run", 5)
    pool.prepared(entry, "run", 5)
    other, free = pool.acquire("twophase-r", "k", "run", 5)  # same batch: a new id
    assert other is not entry and not free
    pool.prepared(other, "run", 5)
    assert pool.acquire("twophase-r", "other-config", "run", 6)[0] not in (entry, other)
    again, free = pool.acquire("twophase-r", "k", "run", 6)  # later batch: settle first
    assert again in (entry, other) and not free
    rerun, _ = pool.acquire("twophase-r", "k", "new-run", 0)  # a restarted query
    assert rerun in (entry, other) and rerun is not again


# -- input columns --------------------------------------------------------------------------


def test_the_input_needs_a_value_and_a_topic_as_in_spark() -> None:
    """The driver's check, on the Arrow schema the binding derives from the DataFrame."""
    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    checkColumns(pa.schema([("value", pa.string())]), "t")
    checkColumns(
        pa.schema(
            [
                ("key", pa.binary()),
                ("value", pa.binary()),
                ("topic", pa.string()),
                ("partition", pa.int32()),
                ("headers", headers),
                ("other", pa.float64()),  # ignored, as Spark does
            ]
        ),
        "t",
    )
    with pytest.raises(TwoPhaseConfigError, match="'value' column"):
        checkColumns(pa.schema([("payload", pa.string())]), "t")
    with pytest.raises(TwoPhaseConfigError, match="column 'value' has type double"):
        checkColumns(pa.schema([("value", pa.float64())]), "t")
    with pytest.raises(TwoPhaseConfigError, match="column 'key' has type bigint"):
        checkColumns(pa.schema([("value", pa.string()), ("key", pa.int64())]), "t")
    with pytest.raises(TwoPhaseConfigError, match="column 'headers' has type string"):
        checkColumns(pa.schema([("value", pa.string()), ("headers", pa.string())]), "t")
    with pytest.raises(TwoPhaseConfigError, match="array<struct<key:string,value:int>>"):
        wrong = pa.list_(pa.struct([("key", pa.string()), ("value", pa.int32())]))
        checkColumns(pa.schema([("value", pa.string()), ("headers", wrong)]), "t")
    with pytest.raises(TwoPhaseConfigError, match="no topic"):
        checkColumns(pa.schema([("value", pa.string())]), None)


def test_the_arrow_layout_is_checked_the_same_way_on_executors() -> None:
    schema = pa.schema([("key", pa.string()), ("value", pa.binary()), ("topic", pa.string())])
    layout = ColumnLayout.of(schema, None)
    assert (layout.value, layout.key, layout.topic) == (1, 0, 2)
    assert ColumnLayout.of(schema, "fixed").topic is None  # the topic option overrides
    with pytest.raises(KafkaWriteError, match="no 'value' column"):
        ColumnLayout.of(pa.schema([("v", pa.string())]), "t")
    with pytest.raises(KafkaWriteError, match="must be string or binary"):
        ColumnLayout.of(pa.schema([("value", pa.int64())]), "t")


# -- handles --------------------------------------------------------------------------------


def test_a_handle_without_records_commits_and_aborts_nothing() -> None:
    """The cluster at BOOTSTRAP is unreachable: any request would fail the call."""
    p = committer()
    empty = {"kind": "kafka", "transactionalId": "twophase-s-1", "records": 0}
    assert p.commit(empty) is None
    p.abort(empty)


def test_malformed_handles_are_refused_before_any_request() -> None:
    p = committer()  # an unreachable cluster: a request would fail otherwise
    with pytest.raises(ValueError, match="not a kafka handle"):
        p.commit({"kind": "files"})
    with pytest.raises(ValueError, match="producer id and epoch"):
        p.commit({"kind": "kafka", "transactionalId": "x", "records": 3})


# -- the committer travels between processes ---------------------------------------------------


def test_the_committer_pickles_and_the_process_shares_one_client_per_cluster() -> None:
    p = committer()
    copy = pickle.loads(pickle.dumps(p))
    assert copy.settings == p.settings
    # Spark builds the sink again for every batch in the same driver-side worker: the client
    # (a connection and an IO thread) must not be created again each time.
    assert copy.client() is p.client()
    assert committer(**{"kafka.client.id": "other"}).client() is not p.client()


def test_describe_names_batch_partition_and_transactional_id() -> None:
    text = committer().describe(handle())
    assert text == (
        "kafka batch 7 partition 3 attempt 0: transactional id twophase-s-3 "
        "(producer id 42, epoch 5), 10 record(s)"
    )


def test_begin_without_rows_or_topic_creates_no_producer() -> None:
    p = KafkaWriter.fromOptions({**BOOTSTRAP, RESOLVED_TIMEOUT_OPTION: "60000"})
    txn = p.beginTransaction(TransactionContext("s", "q", 1, 2, 0))
    assert txn.producer is None
    assert p.preCommit(txn) == {
        "kind": "kafka",
        "batchId": 1,
        "partitionId": 2,
        "attempt": 0,
        "transactionalId": "twophase-s",  # no id taken: nothing to commit or sweep
        "records": 0,
    }


def test_secrets_for_tools_come_from_the_environment_and_never_override_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "TWOPHASE_KAFKA_OPTIONS", '{"kafka.sasl.password": "pw", "kafka.linger.ms": "99"}'
    )
    settings = KafkaSettings.fromOptions({**BOOTSTRAP, "kafka.linger.ms": "5"})
    assert settings.producerConfig["sasl.password"] == "pw"
    assert settings.producerConfig["linger.ms"] == "5"
    monkeypatch.setenv("TWOPHASE_KAFKA_OPTIONS", "not json")
    with pytest.raises(TwoPhaseConfigError, match="TWOPHASE_KAFKA_OPTIONS"):
        KafkaSettings.fromOptions(BOOTSTRAP)


class FakeProducer:
    """Enough of a confluent-kafka Producer for preCommit: everything is delivered.

    It stands in for librdkafka, not for our code: what these tests feed preCommit (an epoch
    bumped inside the transaction, a fatal error, deliveries that never came back) is what
    librdkafka reports on its own and a real broker cannot be made to cause on demand.
    """

    def flush(self, timeout: float = -1) -> int:
        return 0

    def poll(self, timeout: float = -1) -> int:
        return 0


def getPid(producerLog: Any, pid: int, epoch: int) -> None:
    """librdkafka's line, as confluent-kafka hands it to the logger."""
    producerLog.log(
        10, "%s [%s] %s", "GETPID", "rdkafka#producer-1",
        f"[thrd:main]: Acquired PID{{Id:{pid},Epoch:{epoch}}}",
    )  # fmt: skip


def preparedTransaction(pid: int = 7, epoch: int = 3) -> Any:
    from twophase.sinks.kafka.pool import Pooled

    txn = producing.beginTransaction(
        TransactionContext("s", "q", 1, 2, 0),
        "twophase-s",
        {"bootstrap.servers": "x"},
        defaultTopic=None,  # no background start: the fake producer stands in
        transactionTimeoutMs=60000,
        flushTimeoutSeconds=1,
        initTimeoutSeconds=1,
    )
    producerLog = producing.ProducerLog("twophase-s-w0-0")
    getPid(producerLog, pid, epoch)
    txn.pooled = Pooled("twophase-s-w0-0", "twophase-s", "k", producerLog=producerLog)
    txn.transactionalId = "twophase-s-w0-0"
    txn.producer = FakeProducer()  # type: ignore[assignment]
    txn.began, txn.beganAs = True, (pid, epoch)
    txn.produced = txn.deliveries.acked = 3
    return txn


def test_the_producer_id_and_epoch_come_from_librdkafkas_log() -> None:
    txn = preparedTransaction(7, 3)
    handle = sending.preCommit(txn)
    assert (handle["producerId"], handle["producerEpoch"], handle["records"]) == (7, 3, 3)
    assert txn.pooled is not None and txn.pooled.state == "prepared"


def test_an_epoch_bumped_during_the_transaction_or_a_fatal_error_is_not_prepared() -> None:
    txn = preparedTransaction(7, 3)
    assert txn.pooled is not None
    getPid(txn.pooled.producerLog, 7, 4)
    with pytest.raises(KafkaWriteError, match="began with producer id 7 epoch 3"):
        sending.preCommit(txn)
    txn = preparedTransaction(7, 3)
    assert txn.pooled is not None
    txn.pooled.producerLog.log(
        0, "%s [%s] %s", "FATAL", "rdkafka#producer-1", "Fatal error: Broker: fenced"
    )
    with pytest.raises(KafkaWriteError, match="fenced"):
        sending.preCommit(txn)


def test_unacknowledged_records_fail_the_task() -> None:
    txn = preparedTransaction()
    txn.deliveries.acked = 2
    with pytest.raises(KafkaWriteError, match="3 records produced but 2 acknowledged"):
        sending.preCommit(txn)
    txn.deliveries.failed = 1
    txn.deliveries.errors.append("t [0]: Broker: Message size too large")
    with pytest.raises(KafkaWriteError, match="were not delivered: t \\[0\\]"):
        sending.preCommit(txn)


# -- secrets --------------------------------------------------------------------------------

FAKE_KEY = "-----BEGIN PRIVATE KEY-----\nFAKEKEYBODY0123\n-----END PRIVATE KEY-----\n"
SECRETS = {
    "kafka.sasl.password": "FAKE-SASL-PASSWORD",
    "kafka.sasl.jaas.config": (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="alice" password="FAKE-JAAS-PASSWORD";'
    ),
    "kafka.sasl.oauthbearer.config": "principal=alice clientSecret=FAKE-OAUTH-SECRET",
    "kafka.sasl.oauthbearer.client.secret": "FAKE-OAUTH-CLIENT-SECRET",
    "kafka.ssl.key.pem": FAKE_KEY,
    "kafka.ssl.keystore.key": FAKE_KEY,
    "kafka.ssl.key.password": "FAKE-KEY-PASSWORD",
    "kafka.ssl.keystore.password": "FAKE-KEYSTORE-PASSWORD",
    "kafka.ssl_keyfile_password": "FAKE-KAFKA-PYTHON-STYLE",
    "kafka.some.future.token": "FAKE-UNKNOWN-TOKEN",
}
NEEDED = {
    "kafka.bootstrap.servers": "broker1:9092,broker2:9092",
    "kafka.security.protocol": "SASL_SSL",
    "kafka.sasl.mechanism": "SCRAM-SHA-512",
    "kafka.sasl.username": "alice",
    "kafka.ssl.ca.location": "/etc/kafka/ca.pem",
    "kafka.ssl.endpoint.identification.algorithm": "none",
    "kafka.transaction.timeout.ms": "600000",
    "topic": "orders",
    "transactionalIdPrefix": "orders-sink",
    "requestTimeoutSeconds": "20",
    "initTimeoutSeconds": "60",
    RESOLVED_TIMEOUT_OPTION: "600000",
    "checkpointLocation": "/data/ckpt",
}


def test_sink_json_keeps_what_the_committer_needs_and_no_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only allow-listed options reach sink.json; recovery rebuilds the committer from them."""
    from twophase.redaction import publicOptions
    from twophase.sinks.kafka import SAFE_OPTIONS
    from twophase.spark.kafka import KafkaSink

    assert KafkaSink.safeOptions == SAFE_OPTIONS
    options = {k.lower(): v for k, v in {**NEEDED, **SECRETS}.items()}  # as Spark passes them
    public = publicOptions(options, KafkaSink.safeOptions)
    for name, value in SECRETS.items():
        assert name.lower() not in public, name
        assert value not in str(public), name
    assert "FAKE" not in str(public)
    assert set(public) == {k.lower() for k in NEEDED}
    for name in KafkaSink.safeOptions:
        assert not re.search(r"password|secret|jaas|token|credential|oauth|pem|\.key$", name)
    # `twophase recover`: the same cluster, credentials from the environment, same timeouts.
    monkeypatch.setenv("TWOPHASE_KAFKA_OPTIONS", '{"kafka.sasl.password": "from-env"}')
    rebuilt = KafkaSettings.fromOptions(public)
    original = KafkaSettings.fromOptions({**NEEDED, "kafka.sasl.password": "from-env"})
    assert rebuilt == original
    assert rebuilt.producerConfig == original.producerConfig
    assert kafkaPythonConfig(rebuilt.producerConfig)["sasl_plain_password"] == "from-env"


def test_error_texts_built_by_the_client_module_show_no_secret() -> None:
    from confluent_kafka import KafkaError, KafkaException, Producer

    from twophase.clients.kafka import errorText, librdkafkaError

    librdkafkaConfig({**BOOTSTRAP, **SECRETS}, forbidden={})  # as every sink and source does
    refused = KafkaException(
        KafkaError(
            -186,
            'Invalid value "principal=alice clientSecret=FAKE-OAUTH-SECRET" for configuration '
            'property "sasl.oauthbearer.config"',
        )
    )
    problem = librdkafkaError(refused, "producer")
    assert problem is not None and "kafka.sasl.oauthbearer.config" in str(problem)
    assert "FAKE" not in str(problem)
    for secret in SECRETS.values():
        quoted = KafkaException(KafkaError(-195, f"Broker transport failure: {secret}"))
        assert "FAKE" not in errorText(quoted)
        assert "FAKE" not in errorText(RuntimeError(f"some library said {secret!r}"))
    # What librdkafka itself says about a bad key names the property, never the key.
    with pytest.raises(KafkaException) as info:
        Producer({"bootstrap.servers": "127.0.0.1:9", "security.protocol": "ssl",
                  "ssl.key.pem": FAKE_KEY})  # fmt: skip
    problem = librdkafkaError(info.value, "producer")
    assert problem is not None and "ssl.key.pem" in str(problem)
    assert "FAKEKEYBODY" not in str(problem)
    config = librdkafkaConfig({**BOOTSTRAP, **SECRETS}, forbidden={})
    assert "FAKE" not in str(shownConfig(config))


def test_java_pem_key_stores_become_librdkafka_pem_properties() -> None:
    config = librdkafkaConfig(
        {
            **BOOTSTRAP,
            "kafka.ssl.keystore.type": "PEM",
            "kafka.ssl.keystore.key": FAKE_KEY,
            "kafka.ssl.keystore.certificate.chain": "CHAIN",
            "kafka.ssl.truststore.type": "pem",
            "kafka.ssl.truststore.certificates": "CA",
        },
        forbidden={},
    )
    assert config["ssl.key.pem"] == FAKE_KEY
    assert config["ssl.certificate.pem"] == "CHAIN"
    assert config["ssl.ca.pem"] == "CA"
    assert not any(k.startswith(("ssl.keystore", "ssl.truststore")) for k in config)
    with pytest.raises(TwoPhaseConfigError, match="kafka.ssl.keystore.type"):
        librdkafkaConfig({**BOOTSTRAP, "kafka.ssl.keystore.type": "JKS"}, forbidden={})


def test_settings_and_transactions_show_no_client_config() -> None:
    """A repr in a traceback or a log line must not carry the client's secrets."""
    from twophase.sources.kafka import KafkaSourceSettings

    sink = KafkaSettings.fromOptions({**BOOTSTRAP, **SECRETS})
    source = KafkaSourceSettings.fromOptions({**BOOTSTRAP, **SECRETS, "subscribe": "t"})
    txn = producing.beginTransaction(
        TransactionContext("s", "q", 1, 2, 0, options={**BOOTSTRAP, **SECRETS}),
        "twophase-s",
        sink.producerConfig,
        defaultTopic=None,
        transactionTimeoutMs=60000,
        flushTimeoutSeconds=1,
        initTimeoutSeconds=1,
    )
    for shown in (repr(sink), repr(source), repr(txn)):
        assert "FAKE" not in shown


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
def test_keys_and_values_reach_the_producer_as_their_utf8_bytes(kind: pa.DataType) -> None:
    texts = ["héllo", None, "", "wörld"]
    column = pa.array([t if t is None or kind in (pa.string(), pa.large_string())
                       else t.encode() for t in texts], kind)  # fmt: skip
    batch = pa.record_batch({"value": column, "key": column})
    layout = ColumnLayout.of(batch.schema, "t")
    encoded = RecordEncoding.plain().encode(batch, layout)
    expected = [None if t is None else t.encode() for t in texts]
    assert encoded.values == expected and encoded.keys == expected


def test_a_fingerprint_is_the_same_for_text_and_its_bytes() -> None:
    from twophase.protocol.fingerprint import Fingerprint

    text, raw = Fingerprint(), Fingerprint()
    text.add(["a", "é"], ["k", None])
    raw.add([b"a", "é".encode()], [b"k", None])
    assert text.toText() == raw.toText()
