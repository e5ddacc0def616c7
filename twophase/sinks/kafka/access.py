"""The driver's check, before any task writes, that the brokers take the sink's principal and
grant it the ACLs the sink needs; a refusal names the ACL, the principal and the fix.

Kafka answers who may do what on a topic (DescribeTopics with the principal's authorized
operations), not on a transactional id: for that the check starts a transactional producer on
an id of the sink's prefix that no task uses (``<prefix>-access``). FindCoordinator needs
DESCRIBE on it, InitProducerId WRITE (which implies DESCRIBE); neither writes a record
anywhere. The topic needs WRITE (the tasks; it implies DESCRIBE, for metadata) and READ (the
driver's read-back of a transaction in ``probe``), whose consumer group needs DESCRIBE. A
login the brokers refuse (a wrong password, a mechanism they do not offer) is named with the
broker; a certificate that does not verify with the broker and the CA, and why (a wrong CA, an
expired certificate, another host name: a handshake of our own tells them apart). Each is a
``KafkaAccessError``, whose code is fatal: a restart meets the same refusal. A check that
passed is not repeated by this process for the same cluster, principal, topic and prefix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from twophase.clients.kafka import connectionConfig, letGo
from twophase.clients.kafka.errors import newClient
from twophase.clients.kafka.logs import ClientLog
from twophase.clients.tlsverify import certificateProblem, probe
from twophase.redaction import redact
from twophase.resources import Resources
from twophase.sinks.kafka.errors import KafkaAccessError
from twophase.sinks.kafka.probe import PROBE_GROUP_PREFIX

ACCESS_CHECK_SECONDS = 10.0
"""Bound of each request of the check: brokers that are away cost the start no more (the
sink's own checks then say that they are away)."""

ACCESS_ID_SUFFIX = "-access"
"""The transactional id ``<prefix>-access`` the check starts: of the prefix, never a task's."""


@dataclass(frozen=True)
class Acl:
    """One ACL the sink's principal needs: what, on which resource, matched how."""

    resourceType: str
    """``Topic``, ``TransactionalId``, ``Group`` or ``Cluster``."""
    name: str
    patternType: str
    """``LITERAL`` or ``PREFIXED``."""
    operation: str
    """``Write``, ``Read``, ``Describe``, ``DescribeConfigs``..."""

    def describe(self) -> str:
        return f"{self.resourceType}:{self.patternType}:{self.name} {self.operation.upper()}"

    def grant(self, principal: str, bootstrap: str) -> str:
        """The ``kafka-acls.sh`` line that grants it (run as an admin of the cluster)."""
        flag = {
            "Topic": f"--topic {self.name}",
            "TransactionalId": f"--transactional-id {self.name}",
            "Group": f"--group {self.name}",
            "Cluster": "--cluster",
        }[self.resourceType]
        pattern = " --resource-pattern-type prefixed" if self.patternType == "PREFIXED" else ""
        return (
            f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config <admin.properties> "
            f"--add --allow-principal {principal} --operation {self.operation} {flag}{pattern}"
        )


def principalOf(config: Mapping[str, Any]) -> str:
    """The principal the brokers see for ``config``, as ACLs name it."""
    protocol = str(config.get("security.protocol", "plaintext")).lower()
    if protocol.startswith("sasl") and config.get("sasl.username"):
        return f"User:{config['sasl.username']}"
    if protocol == "ssl" and config.get("ssl.certificate.location"):
        return f"User:<the subject of {config['ssl.certificate.location']}>"
    if protocol == "plaintext":
        return "User:ANONYMOUS"
    return "the sink's principal"


def sinkAcls(topic: str | None, prefix: str) -> list[Acl]:
    """The ACLs the Kafka sink needs for ``topic`` (``None``: per-row topics, each needing the
    topic's two) and transactional ids starting with ``prefix``. Kafka's WRITE and READ imply
    DESCRIBE on the same resource, so DESCRIBE needs no ACL of its own."""
    acls = [Acl("TransactionalId", prefix, "PREFIXED", "Write")]
    if topic is not None:
        acls += [Acl("Topic", topic, "LITERAL", op) for op in ("Write", "Read")]
    return acls + [Acl("Group", PROBE_GROUP_PREFIX, "PREFIXED", "Describe")]


def _refused(acl: Acl, config: Mapping[str, Any], what: str) -> KafkaAccessError:
    principal = principalOf(config)
    bootstrap = redact(str(config.get("bootstrap.servers")))
    return KafkaAccessError(
        f"kafka: the brokers at {bootstrap} refused {what}: principal {principal} lacks the "
        f"ACL ALLOW {acl.describe()}. Fix: {acl.grant(principal, bootstrap)}"
    )


def _tlsError(text: str, config: Mapping[str, Any], bootstrap: str) -> KafkaAccessError:
    """The failed TLS handshake librdkafka reports as ``text``, named by a handshake of our
    own with the first bootstrap broker under the same CA: librdkafka's words are the same
    for a wrong CA, an expired certificate and another host name."""
    ca = config.get("ssl.ca.location")
    trust = str(ca or "the system's CA store")
    first = str(config.get("bootstrap.servers") or "").split(",")[0].strip()
    host, _, port = first.rpartition("://")[2].rpartition(":")
    checkName = str(config.get("ssl.endpoint.identification.algorithm", "https")).lower()
    why = None
    if host and port.isdigit() and not config.get("ssl.ca.pem"):
        why = probe(host.strip("[]"), int(port), ca, checkHostname=checkName != "none")
    if why is None:
        return KafkaAccessError(
            f"kafka: the TLS handshake with the broker at {bootstrap} failed: {text}. The "
            f"CA ({trust}) does not verify the broker's certificate, or "
            "the certificate is not for that host name or has expired. Fix: set "
            "kafka.ssl.ca.location to the PEM file of the CA that signs the brokers' "
            "certificates"
        )
    problem = certificateProblem(why, name=host, ca=trust, caOption="kafka.ssl.ca.location")
    return KafkaAccessError(
        f"kafka: the TLS handshake with the broker at {bootstrap} failed: {problem} "
        f"(librdkafka: {text})"
    )


def _loginError(errors: list[Any], config: Mapping[str, Any]) -> KafkaAccessError | None:
    """A ``KafkaAccessError`` for the first refused login among librdkafka's ``errors``."""
    from confluent_kafka import KafkaError

    bootstrap = redact(str(config.get("bootstrap.servers")))
    for error in errors:
        code = error.code()
        text = redact(error.str())
        if code == KafkaError._AUTHENTICATION:
            mechanism = config.get("sasl.mechanism") or config.get("sasl.mechanisms") or "GSSAPI"
            return KafkaAccessError(
                f"kafka: the broker at {bootstrap} refused the login of {principalOf(config)} "
                f"with SASL mechanism {mechanism}: {text}. Fix: give the principal's password "
                "(kafka.sasl.password or kafka.sasl.jaas.config) and a mechanism the broker's "
                "listener offers (kafka.sasl.mechanism)"
            )
        if code == KafkaError._SSL:
            return _tlsError(text, config, bootstrap)
    return None


def checkAccess(
    config: Mapping[str, Any], topic: str | None, prefix: str | None, timeoutSeconds: float
) -> None:
    """Driver, before a batch: the login and every ACL of ``sinkAcls``; a refusal raises
    ``KafkaAccessError``, other failures (brokers away) are left to the sink's own checks."""
    key = (
        str(config.get("bootstrap.servers")),
        str(config.get("sasl.username")),
        str(topic),
        str(prefix),
    )
    passed: set[tuple[str, ...]] = Resources.ofProcess().get("kafka.accessPassed", set)
    if key in passed:
        return
    from confluent_kafka import KafkaError, KafkaException, TopicCollection
    from confluent_kafka.admin import AclOperation, AdminClient

    errors: list[Any] = []
    settings = connectionConfig(config)
    settings.setdefault("logger", ClientLog("access check"))
    settings["error_cb"] = errors.append
    admin = newClient(AdminClient, settings, "admin client")
    futures: list[Any] = []
    try:
        if topic is None:
            admin.list_topics(timeout=timeoutSeconds)
        else:
            future = admin.describe_topics(
                TopicCollection([topic]),
                include_authorized_operations=True,
                request_timeout=timeoutSeconds,
            )[topic]
            futures.append(future)
            description = future.result(timeout=timeoutSeconds)
            granted = set(description.authorized_operations or ())
            # none reported: a broker without an authorizer, which refuses nobody
            for acl in sinkAcls(topic, "")[1:3] if granted else []:
                operation = getattr(AclOperation, acl.operation.upper())
                if operation not in granted and AclOperation.ALL not in granted:
                    raise _refused(acl, config, f"{acl.operation.upper()} on topic {topic}")
    except (KafkaException, TimeoutError) as exc:
        admin.poll(0)  # librdkafka hands its connection errors to error_cb here
        login = _loginError(errors, config)
        if login is not None:
            raise login from None
        error = exc.args[0] if exc.args else None
        code = getattr(error, "code", lambda: None)()
        if code == KafkaError.TOPIC_AUTHORIZATION_FAILED and topic is not None:
            raise _refused(sinkAcls(topic, "")[1], config, f"metadata of topic {topic}") from None
        if code != KafkaError.UNKNOWN_TOPIC_OR_PART:
            return  # unreachable, or not about access: the sink's other checks say it
    finally:
        letGo(admin, futures, timeoutSeconds)
    if prefix is not None:
        _checkTransactionalId(config, prefix, timeoutSeconds)
    _checkProbeGroup(config, timeoutSeconds)
    passed.add(key)


def _checkProbeGroup(config: Mapping[str, Any], timeoutSeconds: float) -> None:
    """DESCRIBE on the probe's groups: finding the coordinator of one (``probe``) needs it, as
    describing one does."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    group = PROBE_GROUP_PREFIX + "access"
    settings = connectionConfig(config)
    settings.setdefault("logger", ClientLog("access check"))
    admin = newClient(AdminClient, settings, "admin client")
    future = admin.describe_consumer_groups([group], request_timeout=timeoutSeconds)[group]
    try:
        future.result(timeout=timeoutSeconds + 5)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if getattr(error, "code", lambda: None)() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            raise _refused(sinkAcls(None, "")[-1], config, f"DESCRIBE on group {group}") from None
    finally:
        letGo(admin, [future], timeoutSeconds)


def _checkTransactionalId(config: Mapping[str, Any], prefix: str, timeoutSeconds: float) -> None:
    """DESCRIBE (FindCoordinator) and WRITE (InitProducerId) on ``<prefix>-access``."""
    from confluent_kafka import KafkaError, KafkaException, Producer

    transactionalId = prefix + ACCESS_ID_SUFFIX
    settings = connectionConfig(config)
    settings.setdefault("logger", ClientLog("access check"))
    settings["transactional.id"] = transactionalId
    producer = newClient(Producer, settings, "producer")
    try:
        producer.init_transactions(timeoutSeconds)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if (
            getattr(error, "code", lambda: None)()
            != KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        ):
            return  # not about access: the tasks' own producers will say what it is
        acl = sinkAcls(None, prefix)[0]  # FindCoordinator's DESCRIBE comes with it
        raise _refused(
            acl,
            config,
            f"{acl.operation.upper()} on transactional id {transactionalId} "
            f"(of the sink's transactionalIdPrefix {prefix})",
        ) from None
