"""The Kafka sink over SASL_SSL (SCRAM-SHA-512) as a principal with exactly the ACLs that
docs/security.md lists, and each of them taken away in turn.

The broker's SASL_SSL listener (services/kafka.sh) runs KRaft's StandardAuthorizer with no
access when no ACL is found. Each test makes a SCRAM user of its own and its ACLs as the super
user, through that listener, then runs the driver's check the sink runs before its first batch
(``twophase.sinks.kafka.access.checkAccess``, from the Kafka binding's ``validate``): with every
ACL it passes; without one, the error names that ACL, the principal and the ``kafka-acls.sh``
line that grants it, carries a fatal code, and nothing was written to the topic. A wrong
password, a mechanism the listener does not offer, a CA that does not sign the broker, an
expired broker certificate (the listener's keystore changed for a moment) and a host name the
certificate does not hold are named with the broker (and the CA, and each its own fix) at
once. Then whole queries as such principals, each
through a driver kill: the Kafka sink, the Kafka source into it, and ``twophase.multi`` into
Kafka and PostgreSQL over TLS.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest

from integration_tests.conftest import HOW_TO_START, service_setting
from integration_tests.tls_files import expiredCertificate, otherCa, resolvesHere
from twophase.clients.tlsverify import probe
from twophase.failures.codes import CODES
from twophase.sinks.kafka.access import Acl, checkAccess, sinkAcls
from twophase.sinks.kafka.acls import describeSinkAcls
from twophase.sinks.kafka.errors import KafkaAccessError

SASL = service_setting("TWOPHASE_KAFKA_SASL_BOOTSTRAP") or ""
PLAIN = service_setting("TWOPHASE_KAFKA_BOOTSTRAP") or ""
CA = service_setting("TWOPHASE_TLS_CA_FILE") or ""
ADMIN = service_setting("TWOPHASE_KAFKA_ADMIN_USER") or ""
ADMIN_PASSWORD = service_setting("TWOPHASE_KAFKA_ADMIN_PASSWORD") or ""


VERIFY_ACLS = [Acl("Group", "twophase-kafka-source-", "PREFIXED", "Describe")]
"""What ``verify`` needs beyond the sink's ACLs: it reads the topic as the Kafka source does, in
a group of its own."""


@pytest.fixture(autouse=True)
def securedListener() -> None:
    """A missing secured listener fails the test, as any missing server does."""
    if not (SASL and CA and ADMIN_PASSWORD):
        pytest.fail(f"no secured Kafka listener is configured: {HOW_TO_START}")


def _config(user: str, password: str, **extra: str) -> dict[str, str]:
    return {
        "bootstrap.servers": SASL,
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": CA,
        **extra,
    }


@pytest.fixture(scope="module")
def admin() -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({**_config(ADMIN, ADMIN_PASSWORD), "log_level": 0})


@pytest.fixture(scope="module")
def topic(admin: Any) -> str:
    from confluent_kafka.admin import NewTopic

    name = f"secured-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=30)
    return name


def makeUser(admin: Any, user: str, password: str) -> None:
    """A SCRAM-SHA-512 credential for ``user``, made as the super user."""
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
    )
    admin.alter_user_scram_credentials([upsert])[user].result(timeout=30)


def grant(admin: Any, user: str, acls: list[Acl]) -> None:
    """ALLOW ``acls`` to ``User:<user>`` from any host, made as the super user."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    bindings = [
        AclBinding(
            getattr(
                ResourceType,
                {"TransactionalId": "TRANSACTIONAL_ID", "Cluster": "BROKER"}.get(
                    a.resourceType, a.resourceType.upper()
                ),
            ),
            a.name,
            getattr(ResourcePatternType, a.patternType),
            f"User:{user}",
            "*",
            getattr(AclOperation, a.operation.upper()),
            AclPermissionType.ALLOW,
        )
        for a in acls
    ]
    for future in admin.create_acls(bindings).values():
        future.result(timeout=30)


@pytest.fixture
def principal(admin: Any) -> Iterator[tuple[str, str, str]]:
    """A new user with its password, and a transactional id prefix of its own."""
    user = f"sink-{uuid.uuid4().hex[:8]}"
    password = f"pw-{uuid.uuid4().hex}"
    makeUser(admin, user, password)
    yield user, password, f"tp-{uuid.uuid4().hex[:8]}"


def _settled(check: Any, accept: Any, seconds: float = 15) -> Any:
    """``check()`` again until ``accept(outcome)``: new credentials and ACLs reach the
    broker's authorizer through its metadata log, soon but not at once."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            outcome: Any = check()
        except KafkaAccessError as exc:
            outcome = exc
        if accept(outcome) or time.monotonic() > deadline:
            return outcome
        time.sleep(0.3)


def _endOffset(admin: Any, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**_config(ADMIN, ADMIN_PASSWORD), "group.id": "secured-peek"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def test_every_listed_acl_lets_the_check_pass(admin: Any, topic: str, principal: Any) -> None:
    user, password, prefix = principal
    grant(admin, user, sinkAcls(topic, prefix))
    outcome = _settled(
        lambda: checkAccess(_config(user, password), topic, prefix, 10), lambda o: o is None
    )
    assert outcome is None


@pytest.mark.parametrize(
    "missing", range(len(sinkAcls("t", "p"))), ids=lambda i: sinkAcls("t", "p")[i].describe()
)
def test_each_missing_acl_is_named_with_its_fix(
    admin: Any, topic: str, principal: Any, missing: int
) -> None:
    user, password, prefix = principal
    acls = sinkAcls(topic, prefix)
    lacking = acls.pop(missing)
    grant(admin, user, acls)
    before = _endOffset(admin, topic)
    outcome = _settled(
        lambda: checkAccess(_config(user, password), topic, prefix, 10),
        lambda o: isinstance(o, KafkaAccessError) and lacking.describe() in str(o),
    )
    assert isinstance(outcome, KafkaAccessError), outcome
    text = str(outcome)
    assert f"lacks the ACL ALLOW {lacking.describe()}" in text, text
    assert f"User:{user}" in text
    assert lacking.grant(f"User:{user}", SASL) in text
    assert outcome.errorCode == "TWOPHASE_CREDENTIALS"
    assert not CODES[outcome.errorCode].recoverable
    assert password not in text
    assert _endOffset(admin, topic) == before  # nothing written


@contextmanager
def brokerPresenting(certificate: str, key: str) -> Iterator[None]:
    """The SASL_SSL listener presents ``certificate`` (for the broker's own ``key``) to new
    connections, then its own again: a dynamic listener setting, changed and removed over the
    plain listener, whose clients keep every right. Waits until handshakes show each."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    keystore = Path(certificate).with_suffix(".keystore.pem")
    keystore.write_bytes(Path(key).read_bytes() + Path(certificate).read_bytes())
    keystore.chmod(0o600)
    plain = AdminClient({"bootstrap.servers": PLAIN, "log_level": 0})
    broker = str(next(iter(plain.list_topics(timeout=30).brokers)))
    host, port = SASL.rsplit(":", 1)

    def alter(operation: Any, value: str | None, presents: Any) -> None:
        entry = ConfigEntry(LISTENER_KEYSTORE, value, incremental_operation=operation)
        resource = ConfigResource("BROKER", broker, incremental_configs=[entry])
        for future in plain.incremental_alter_configs([resource]).values():
            future.result(timeout=30)
        deadline = time.monotonic() + 30
        while not presents(probe(host, int(port), CA, checkHostname=False)):
            assert time.monotonic() < deadline, f"the listener did not take {value}"
            time.sleep(0.2)

    alter(AlterConfigOpType.SET, str(keystore), lambda why: why and "expired" in why)
    try:
        yield
    finally:
        alter(AlterConfigOpType.DELETE, None, lambda why: why is None)


LISTENER_KEYSTORE = "listener.name.sasl_ssl.ssl.keystore.location"


CASES = ["wrong password", "mechanism not offered", "wrong CA", "expired", "wrong host name"]


@pytest.mark.parametrize("case", CASES)
def test_a_refused_login_names_the_broker_at_once(
    admin: Any, topic: str, principal: Any, case: str, tmp_path: Path
) -> None:
    user, password, prefix = principal
    grant(admin, user, sinkAcls(topic, prefix))
    elsewhere = resolvesHere()
    if case == "wrong host name" and elsewhere is None:
        pytest.skip("this machine's host name does not resolve to 127.0.0.1")
    config = {
        "wrong password": lambda: _config(user, "not-" + password),
        "mechanism not offered": lambda: _config(user, password, **{"sasl.mechanism": "PLAIN"}),
        "wrong CA": lambda: _config(user, password, **{"ssl.ca.location": otherCa(tmp_path)}),
        "expired": lambda: _config(user, password),
        "wrong host name": lambda: _config(
            user, password, **{"bootstrap.servers": SASL.replace("127.0.0.1", str(elsewhere))}
        ),
    }[case]()
    presenting = nullcontext()
    if case == "expired":
        cert, key = expiredCertificate(
            tmp_path, CA, "localhost", str(Path(CA).parent / "server.key")
        )
        presenting = brokerPresenting(cert, key)
    with presenting:
        started = time.monotonic()
        with pytest.raises(KafkaAccessError) as raised:
            checkAccess(config, topic, prefix, 3)
        assert time.monotonic() - started < 10  # once, not retried
    text = str(raised.value)
    assert config["bootstrap.servers"] in text and raised.value.errorCode == "TWOPHASE_CREDENTIALS"
    assert password not in text
    expected = {
        "wrong password": ["invalid credentials with SASL mechanism SCRAM-SHA-512"],
        "mechanism not offered": ["broker's supported mechanisms: SCRAM-SHA-512"],
        "wrong CA": [
            f"did not verify against the CA in {config['ssl.ca.location']}",
            "Fix: set kafka.ssl.ca.location",
        ],
        "expired": [
            f"the server's certificate has expired, though the CA in {CA} signed it",
            "Fix: have the server's certificate renewed",
        ],
        "wrong host name": [f"is not for the name '{elsewhere}'", "Fix: connect by a name"],
    }[case]
    for words in expected:
        assert words in text, (words, text)


def awaitAccess(options: dict[str, str], topic: str, prefix: str) -> None:
    """Until the sink's start check passes with these options: new ACLs reach the broker's
    authorizer soon but not at once."""
    config = {k[6:]: v for k, v in options.items() if k.startswith("kafka.")}
    outcome = _settled(lambda: checkAccess(config, topic, prefix, 10), lambda o: o is None)
    assert outcome is None, outcome


def saslOptions(user: str) -> dict[str, str]:
    """The Kafka sink's and source's options for ``user`` on the SASL_SSL listener, without
    its password."""
    return {
        "kafka.bootstrap.servers": SASL,
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.username": user,
        "kafka.ssl.ca.location": CA,
    }


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run(
        [sys.executable, "-m", "twophase", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.timeout(600)
def test_the_sink_writes_exactly_once_through_a_driver_kill_as_the_least_privileged_user(
    admin: Any, principal: Any, tmp_path: Path
) -> None:
    """The sink over SASL_SSL with only the listed ACLs: the driver SIGKILLed right after it
    decided a batch, ``twophase recover`` (the password from the environment, never from the
    checkpoint) commits it, ``status``, ``doctor`` and ``verify`` read the same, every row is
    in the topic once, and the SCRAM password is in no file under the checkpoint, no log line
    of the run (at DEBUG) and no output of the commands."""
    from confluent_kafka.admin import NewTopic

    from integration_tests.spark_harness import Harness

    rows, perBatch = 200, 100
    user, password, prefix = principal
    topic = f"secured-run-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=30)
    grant(admin, user, [*sinkAcls(topic, prefix), *VERIFY_ACLS])
    secrets = {"kafka.sasl.password": password}
    options = {**saslOptions(user), "transactionalIdPrefix": prefix, "topic": topic}
    awaitAccess({**options, **secrets}, topic, prefix)
    query = Harness(
        tmp_path / "query",
        "local",
        sink="twophase.spark.kafka:KafkaSink",
        rows=rows,
        rowsPerBatch=perBatch,
        columns={"key": "CAST(id AS STRING)", "value": "payload"},
        options={**options, **secrets},
    )
    debug = {"TWOPHASE_LOG_LEVEL": "DEBUG"}
    crashed = query.run("driver.afterDecision:1", env=debug)
    assert crashed.killed, crashed.describe()

    env = {**os.environ, **debug, "TWOPHASE_KAFKA_OPTIONS": json.dumps(secrets)}
    outputs = []
    status = _cli("status", "--checkpoint", str(query.checkpoint), env=env)
    outputs.append(status.stdout + status.stderr)
    assert "1" in status.stdout, outputs[-1]
    recovered = _cli("recover", "--checkpoint", str(query.checkpoint), env=env)
    outputs.append(recovered.stdout + recovered.stderr)
    assert recovered.returncode == 0, outputs[-1]
    assert "of 1 decided batches [1]" in recovered.stdout, outputs[-1]
    doctor = _cli("doctor", "--checkpoint", str(query.checkpoint), env=env)
    outputs.append(doctor.stdout + doctor.stderr)
    assert doctor.returncode == 0, outputs[-1]
    assert "cannot look: DescribeAcls needs DESCRIBE on the cluster" in doctor.stdout, outputs[-1]
    sinkOptions = [
        a
        for k, v in options.items()
        if k.startswith("kafka.")
        for a in ("--sink-option", f"{k}={v}")
    ]
    verified = _cli(
        "verify", "--source", "sequence", "--end", str(2 * perBatch), "--sink", "kafka",
        "--topic", topic, *sinkOptions,
        env=env,
    )  # fmt: skip
    outputs.append(verified.stdout + verified.stderr)
    assert verified.returncode == 0, outputs[-1]

    leaks = [
        p for p in query.workdir.rglob("*") if p.is_file() and password.encode() in p.read_bytes()
    ]
    assert not leaks and not any(password in o for o in outputs), leaks or outputs
    description = json.loads(next(query.checkpoint.glob("twophase/*/sink.json")).read_text())
    assert description["options"]["kafka.sasl.username"] == user

    # With DESCRIBE on the cluster, doctor's check reads the principal's ACLs itself.
    grant(admin, user, [Acl("Cluster", "kafka-cluster", "LITERAL", "Describe")])
    config = {k[6:]: v for k, v in {**options, **secrets}.items() if k.startswith("kafka.")}
    line, missing = _settled(
        lambda: describeSinkAcls(config, topic, prefix, 10), lambda o: "holds" in o[0]
    )
    assert (line, missing) == (f"User:{user} holds the 4 ACLs the sink needs", False)
    line, missing = describeSinkAcls(config, topic, "other-" + prefix, 10)
    assert missing and f"lacks TransactionalId:PREFIXED:other-{prefix} WRITE" in line, line
    assert "kafka.sasl.password" not in description["options"]


@pytest.mark.timeout(600)
def test_the_source_reads_exactly_once_through_a_driver_kill_as_the_least_privileged_user(
    admin: Any, principal: Any, tmp_path: Path
) -> None:
    """twophase's Kafka source over SASL_SSL, into the Kafka sink over the same, as a principal
    with READ on the input topic and DESCRIBE on the source's groups (docs/security.md) besides
    the sink's ACLs: the input holds committed transactions with aborted ones between them, the
    driver is SIGKILLed right after it decided a batch, the next start commits it and drains
    the rest, and the output holds every committed input record once (``verify`` as the same
    principal); the password is in no file under the checkpoint."""
    from confluent_kafka.admin import NewTopic

    from integration_tests.chaos.pipelines.kafka import fillInput
    from integration_tests.spark_harness import KAFKA_SOURCE, Harness
    from twophase import verify

    rows, perBatch = 300, 100
    user, password, prefix = principal
    inTopic, outTopic = (f"secured-{side}-{uuid.uuid4().hex[:8]}" for side in ("in", "out"))
    for name in (inTopic, outTopic):
        admin.create_topics([NewTopic(name, 2, 1)])[name].result(timeout=30)
    fillInput(PLAIN, inTopic, rows)  # through the plain listener, as any producer
    sourceAcls = [
        Acl("Topic", inTopic, "LITERAL", "Read"),
        Acl("Group", "twophase-kafka-source-", "PREFIXED", "Describe"),
    ]
    grant(admin, user, [*sourceAcls, *sinkAcls(outTopic, prefix)])
    connection = saslOptions(user)
    secrets = {"kafka.sasl.password": password}
    sink = {**connection, "transactionalIdPrefix": prefix, "topic": outTopic}
    awaitAccess({**sink, **secrets}, outTopic, prefix)
    query = Harness(
        tmp_path / "query",
        "local",
        sink="twophase.spark.kafka:KafkaSink",
        source=KAFKA_SOURCE,
        rows=rows,
        rowsPerBatch=perBatch,
        sourceOptions={
            **connection,
            **secrets,
            "subscribe": inTopic,
            "startingOffsets": "earliest",
            "minRecordsPerPartition": "0",
        },
        columns={"key": "key", "value": "value"},
        options={**sink, **secrets},
    )
    crashed = query.run("driver.afterDecision:1")
    assert crashed.killed, crashed.describe()
    drained = query.run()
    assert drained.returncode == 0, drained.describe()

    source = {**connection, **secrets, "subscribe": inTopic}
    report = verify.verify("kafka", source, "kafka", {**connection, **secrets, "topic": outTopic})
    assert report.ok and report.expectedRows == rows, report
    leaks = [
        p for p in query.workdir.rglob("*") if p.is_file() and password.encode() in p.read_bytes()
    ]
    assert not leaks, leaks


@pytest.mark.timeout(600)
def test_multi_with_kafka_over_sasl_and_postgres_over_tls_exactly_once_through_a_kill(
    admin: Any, principal: Any, tmp_path: Path
) -> None:
    """``twophase.multi`` into a Kafka topic over SASL_SSL and a PostgreSQL table over TLS,
    each as its least-privileged principal or role: the driver is SIGKILLed after deciding
    batch 1, the restart commits both halves and writes the rest, every row once in each; no
    secret is under the checkpoint."""
    from confluent_kafka.admin import NewTopic

    from integration_tests.spark_harness import Harness
    from integration_tests.test_postgres_secured import leastRole
    from twophase import verify

    rows, perBatch = 40, 10
    user, password, prefix = principal
    topic = f"secured-multi-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=30)
    grant(admin, user, [*sinkAcls(topic, prefix), *VERIFY_ACLS])
    kafka = {**saslOptions(user), "kafka.sasl.password": password}
    pgUrl = service_setting("TWOPHASE_PG_TLS_URL")
    assert pgUrl, "TWOPHASE_PG_TLS_URL is unset: run services/services.sh up"
    with leastRole(pgUrl) as pg:
        pg.sql("CREATE TABLE {s}.events (id bigint, payload text)")
        pg.sql("GRANT INSERT ON {s}.events TO {r}")
        options = {"targets": "pg=postgres,events=kafka", "pg.commitMode": "prepared"}
        options |= {
            f"pg.{k}": v for k, v in {**pg.options(), "dbtable": f"{pg.schema}.events"}.items()
        }
        options |= {f"events.{k}": v for k, v in kafka.items()}
        options |= {"events.topic": topic, "events.transactionalIdPrefix": prefix}
        query = Harness(
            tmp_path / "query",
            "local",
            sink="twophase.spark.multi:MultiSink",
            rows=rows,
            rowsPerBatch=perBatch,
            columns={
                "pg": "struct(id, payload)",
                "events": "struct(CAST(id AS STRING) AS key, payload AS value)",
            },
            options=options,
        )
        query.crashRun("driver.afterDecision:1")
        query.restartUntilExhausted()
        ids = pg.admin.execute(f"SELECT id FROM {pg.schema}.events ORDER BY id").fetchall()
        assert [r[0] for r in ids] == list(range(rows))
        report = verify.verify(
            "sequence", {"start": "0", "end": str(rows)}, "kafka", {**kafka, "topic": topic}
        )
        assert report.ok and report.expectedRows == rows, report
        for secret in (pg.password, password):
            leaks = [
                p
                for p in query.workdir.rglob("*")
                if p.is_file() and secret.encode() in p.read_bytes()
            ]
            assert not leaks, leaks
