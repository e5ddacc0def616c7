"""The ``kafka.*`` options as librdkafka properties: translated, refused by name, or kept safe.

Spark's Kafka connector passes every ``kafka.<name>`` option to the Java client. twophase
passes them to librdkafka (confluent-kafka): ``kafka.<name>`` becomes property ``<name>``; the
Java-only properties Spark users are used to are translated (``sasl.jaas.config`` for PLAIN
and SCRAM, ``buffer.memory``, PEM key stores) or refused with the librdkafka equivalent named.
Tools that rebuild a sink from ``sink.json`` (which never holds secrets) add the secrets from
the ``TWOPHASE_KAFKA_OPTIONS`` environment variable.

``SAFE_CLIENT_OPTIONS`` is the allow-list of ``kafka.*`` options whose values are never
secret: only those may be written down or shown.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from twophase.redaction import REDACTED, rememberSecrets
from twophase.settings import TwoPhaseConfigError

PREFIX = "kafka."

OPTIONS_ENV = "TWOPHASE_KAFKA_OPTIONS"
"""A JSON object of extra options (secrets, typically) for tools that rebuild a sink from
``sink.json``, which never holds secrets: added where the options lack them."""

_SAFE_PROPERTIES = (
    # where the cluster is, and who this client is
    "bootstrap.servers",
    "metadata.broker.list",
    "client.id",
    "client.rack",
    "client.dns.lookup",
    "broker.address.family",
    "broker.address.ttl",
    "broker.version.fallback",
    "api.version.request",
    "api.version.request.timeout.ms",
    "api.version.fallback.ms",
    "allow.auto.create.topics",
    "debug",
    # how it authenticates, without the secrets: names, mechanisms and paths of files
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.kerberos.service.name",
    "sasl.kerberos.principal",
    "sasl.kerberos.keytab",
    "sasl.kerberos.min.time.before.relogin",
    "ssl.ca.location",
    "ssl.ca.certificate.stores",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.keystore.location",
    "ssl.crl.location",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
    "ssl.cipher.suites",
    "ssl.curves.list",
    "ssl.sigalgs.list",
    # timeouts and connections
    "transaction.timeout.ms",
    "socket.timeout.ms",
    "socket.connection.setup.timeout.ms",
    "socket.keepalive.enable",
    "socket.nagle.disable",
    "socket.send.buffer.bytes",
    "socket.receive.buffer.bytes",
    "connections.max.idle.ms",
    "reconnect.backoff.ms",
    "reconnect.backoff.max.ms",
    "retry.backoff.ms",
    "retry.backoff.max.ms",
    "metadata.max.age.ms",
    "topic.metadata.refresh.interval.ms",
    "request.timeout.ms",
    "message.timeout.ms",
    "delivery.timeout.ms",
    # producer and consumer tuning
    "acks",
    "request.required.acks",
    "linger.ms",
    "queue.buffering.max.ms",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "buffer.memory",
    "batch.size",
    "batch.num.messages",
    "compression.type",
    "compression.codec",
    "compression.level",
    "message.max.bytes",
    "receive.message.max.bytes",
    "max.in.flight",
    "max.in.flight.requests.per.connection",
    "retries",
    "message.send.max.retries",
    "sticky.partitioning.linger.ms",
    "partitioner",
    "isolation.level",
    "fetch.min.bytes",
    "fetch.max.bytes",
    "fetch.wait.max.ms",
    "max.partition.fetch.bytes",
    "queued.min.messages",
    "queued.max.messages.kbytes",
    "check.crcs",
)

SAFE_CLIENT_OPTIONS = frozenset(PREFIX + name for name in _SAFE_PROPERTIES)
"""``kafka.*`` options (lower-case) whose values are never secret: settings, host names, user
names, mechanisms and paths. Everything else (passwords, JAAS lines, OAUTHBEARER settings,
PEM keys and certificates, ...) may be; it is neither written down nor shown."""

# Java client properties that librdkafka does not know, and what to use instead.
_JAVA_ONLY: dict[str, str] = {
    "key.serializer": "keys and values are written as the bytes/strings of the key and value "
    "columns (Spark's Kafka sink refuses this option too)",
    "value.serializer": "keys and values are written as the bytes/strings of the key and value "
    "columns (Spark's Kafka sink refuses this option too)",
    "key.deserializer": "the source returns key and value as binary columns; cast them in Spark",
    "value.deserializer": "the source returns key and value as binary columns; cast them in Spark",
    "interceptor.classes": "Java interceptors cannot run in librdkafka",
    "ssl.truststore.location": "librdkafka reads PEM: convert the trust store and set "
    "kafka.ssl.ca.location to the PEM file",
    "ssl.truststore.password": "librdkafka reads PEM: set kafka.ssl.ca.location instead",
    "ssl.truststore.type": "librdkafka reads PEM: set kafka.ssl.ca.location instead",
    "ssl.keystore.type": "librdkafka reads a PKCS#12 kafka.ssl.keystore.location, or PEM files "
    "in kafka.ssl.certificate.location and kafka.ssl.key.location",
    "sasl.login.callback.handler.class": "use librdkafka's sasl.oauthbearer.* properties",
    "sasl.client.callback.handler.class": "use librdkafka's sasl.oauthbearer.* properties",
    "max.request.size": "use kafka.message.max.bytes",
    "max.block.ms": "not needed: produce never blocks, the task waits in flush()",
}

_JAVA_PEM: dict[str, str] = {
    "ssl.keystore.key": "ssl.key.pem",
    "ssl.keystore.certificate.chain": "ssl.certificate.pem",
    "ssl.truststore.certificates": "ssl.ca.pem",
}
"""Java's PEM key store properties (``ssl.keystore.type=PEM``) and librdkafka's names."""

_JAAS = re.compile(
    r"(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)(?P<options>.*?);?\s*$",
    re.S,
)
_JAAS_OPTION = re.compile(r"(\w+)\s*=\s*(?:\"((?:[^\"\\]|\\.)*)\"|(\S+))")


def isSafeProperty(name: str) -> bool:
    """True when librdkafka property ``name`` (no ``kafka.`` prefix) never holds a secret."""
    return PREFIX + name.lower() in SAFE_CLIENT_OPTIONS


def kafkaOptions(options: Mapping[str, str]) -> dict[str, str]:
    """The ``kafka.*`` options with the prefix removed and names lower-cased.

    Options from the ``TWOPHASE_KAFKA_OPTIONS`` environment variable (a JSON object) are added
    where ``options`` lacks them.
    """
    merged = {str(k).lower(): str(v) for k, v in options.items()}
    for key, value in environmentOptions().items():
        merged.setdefault(key.lower(), str(value))
    return {
        k[len(PREFIX) :]: v
        for k, v in merged.items()
        if k.startswith(PREFIX) and len(k) > len(PREFIX)
    }


def environmentOptions() -> dict[str, Any]:
    """The options of ``TWOPHASE_KAFKA_OPTIONS`` (empty when unset); a bad value is an error."""
    text = os.environ.get(OPTIONS_ENV, "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise TwoPhaseConfigError(
            f"environment variable {OPTIONS_ENV} must be a JSON object of options, like "
            '{"kafka.sasl.password": "..."}'
        )
    return value


def _parseJaas(text: str) -> dict[str, str]:
    """``sasl.mechanism`` credentials from a Java ``sasl.jaas.config`` (PLAIN and SCRAM)."""
    match = _JAAS.match(text.strip())
    if not match:
        raise TwoPhaseConfigError(
            "option kafka.sasl.jaas.config is not a JAAS login module line "
            '(<LoginModule> required username="..." password="...";)'
        )
    module = match["module"].rsplit(".", 1)[-1]
    if module not in ("PlainLoginModule", "ScramLoginModule"):
        raise TwoPhaseConfigError(
            f"option kafka.sasl.jaas.config uses {module}, which librdkafka cannot read; for "
            "OAUTHBEARER set librdkafka's kafka.sasl.oauthbearer.* options, for GSSAPI "
            "kafka.sasl.kerberos.* (see librdkafka's CONFIGURATION.md)"
        )
    values = {
        m.group(1): (m.group(2) if m.group(2) is not None else m.group(3))
        for m in _JAAS_OPTION.finditer(match["options"])
    }
    if "username" not in values or "password" not in values:
        raise TwoPhaseConfigError(
            "option kafka.sasl.jaas.config must set both username and password"
        )
    return {
        "sasl.username": values["username"].replace('\\"', '"'),
        "sasl.password": values["password"].replace('\\"', '"'),
    }


def librdkafkaConfig(options: Mapping[str, str], *, forbidden: Mapping[str, str]) -> dict[str, str]:
    """librdkafka properties from the ``kafka.*`` options; ``forbidden`` maps names to reasons.

    ``kafka.bootstrap.servers`` is required. Java-only names are translated or refused with the
    librdkafka equivalent; everything else passes through for librdkafka to validate. The
    values of properties that may be secret are remembered by ``twophase.redaction``, so no
    later log line or error message of this process shows them.
    """
    raw = kafkaOptions(options)
    if not raw.get("bootstrap.servers", "").strip():
        raise TwoPhaseConfigError(
            'option kafka.bootstrap.servers is required: .option("kafka.bootstrap.servers", '
            '"host1:9092,host2:9092")'
        )
    config: dict[str, str] = {}
    for name, value in raw.items():
        if name in forbidden:
            raise TwoPhaseConfigError(f"option kafka.{name} is not supported: {forbidden[name]}")
        if name in ("ssl.keystore.type", "ssl.truststore.type") and value.strip().upper() == "PEM":
            continue  # the PEM properties themselves are translated below
        if name in _JAVA_ONLY:
            raise TwoPhaseConfigError(
                f"option kafka.{name} is a Java client property that librdkafka does not "
                f"support: {_JAVA_ONLY[name]}"
            )
        if name == "sasl.jaas.config":
            config.update(_parseJaas(value))
        elif name in _JAVA_PEM:
            config[_JAVA_PEM[name]] = value
        elif name == "buffer.memory":
            try:
                config["queue.buffering.max.kbytes"] = str(max(1, int(value) // 1024))
            except ValueError:
                raise TwoPhaseConfigError(
                    f"option kafka.buffer.memory={value!r} is not a number"
                ) from None
        elif name == "security.protocol":
            config[name] = value.strip().lower()
        else:
            config[name] = value
    for properties in (raw, config):  # the options as given, and what they became
        rememberSecrets({PREFIX + k: v for k, v in properties.items()}, SAFE_CLIENT_OPTIONS)
    return config


def shownConfig(config: Mapping[str, Any]) -> dict[str, Any]:
    """A librdkafka configuration as a log line may show it: unsafe values replaced."""
    return {k: (v if isSafeProperty(k) else REDACTED) for k, v in config.items()}
