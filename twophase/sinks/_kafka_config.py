"""Kafka client settings of the twophase Kafka sink and source: the ``kafka.*`` options.

Spark's Kafka connector passes every ``kafka.<name>`` option to the Java client. Ours pass them
to librdkafka (confluent-kafka) on the executors, and, on the driver, to kafka-python, which
ends transactions and lists them. This module owns the translation:

- ``kafka.<name>`` becomes librdkafka property ``<name>``; the few Java-only properties Spark
  users are used to are translated (``sasl.jaas.config`` for PLAIN/SCRAM, ``buffer.memory``)
  or refused with the librdkafka equivalent named (JKS trust stores, serializers);
- the same settings become kafka-python keyword arguments for the driver-side client;
- secrets never reach a log line (``redacted``), and kafka-python's own debug dump of its
  configuration is redacted too.

Plain Python: no Spark here.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from twophase.settings import TwoPhaseConfigError

log = logging.getLogger(__name__)

PREFIX = "kafka."

OPTIONS_ENV = "TWOPHASE_KAFKA_OPTIONS"
"""A JSON object of extra options (secrets, typically) for tools that rebuild a sink from
``sink.json``, which never holds secrets: added where the options lack them."""

_SECRET = re.compile(r"password|secret|jaas|token|credential|sasl\.oauthbearer\.config", re.I)

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

_JAAS = re.compile(
    r"(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)(?P<options>.*?);?\s*$",
    re.S,
)
_JAAS_OPTION = re.compile(r"(\w+)\s*=\s*(?:\"((?:[^\"\\]|\\.)*)\"|(\S+))")


def isSecret(name: str) -> bool:
    """True for client properties whose values must never be logged or stored."""
    return bool(_SECRET.search(name))


def redacted(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a client configuration that is safe to log: secret values replaced."""
    return {k: ("[redacted]" if isSecret(k) else v) for k, v in config.items()}


def kafkaOptions(options: Mapping[str, str]) -> dict[str, str]:
    """The ``kafka.*`` options with the prefix removed and names lower-cased.

    Options from the ``TWOPHASE_KAFKA_OPTIONS`` environment variable (a JSON object) are added
    where ``options`` lacks them.
    """
    merged = {str(k).lower(): str(v) for k, v in options.items()}
    for key, value in _environmentOptions().items():
        merged.setdefault(key.lower(), str(value))
    return {
        k[len(PREFIX) :]: v
        for k, v in merged.items()
        if k.startswith(PREFIX) and len(k) > len(PREFIX)
    }


def _environmentOptions() -> dict[str, Any]:
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
    librdkafka equivalent; everything else passes through for librdkafka to validate.
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
        if name in _JAVA_ONLY:
            raise TwoPhaseConfigError(
                f"option kafka.{name} is a Java client property that librdkafka does not "
                f"support: {_JAVA_ONLY[name]}"
            )
        if name == "sasl.jaas.config":
            config.update(_parseJaas(value))
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
    return config


def librdkafkaError(exc: BaseException, what: str) -> TwoPhaseConfigError | None:
    """A config error naming the ``kafka.*`` option when librdkafka refused a property."""
    error: Any = exc.args[0] if exc.args else None
    text = str(error.str() if hasattr(error, "str") else exc)
    match = re.search(r'No such configuration property: "([^"]+)"', text)
    if match:
        return TwoPhaseConfigError(
            f"option kafka.{match.group(1)} is not a librdkafka property ({what}); see "
            "librdkafka's CONFIGURATION.md for the names it accepts"
        )
    match = re.search(r'Invalid value "([^"]*)" for configuration property "([^"]+)"', text)
    if match:
        shown = "[redacted]" if isSecret(match.group(2)) else repr(match.group(1))
        return TwoPhaseConfigError(
            f"option kafka.{match.group(2)}={shown} is not valid for librdkafka ({what}): "
            f"{text if not isSecret(match.group(2)) else 'invalid value'}"
        )
    invalidArgument = getattr(error, "code", lambda: None)() == -186  # _INVALID_ARG
    if invalidArgument or "configuration" in text.lower() or "property" in text.lower():
        return TwoPhaseConfigError(
            f"the kafka.* options were refused by librdkafka ({what}): {text}"
        )
    return None


def kafkaPythonConfig(config: Mapping[str, str]) -> dict[str, Any]:
    """kafka-python keyword arguments for the same cluster and credentials as ``config``.

    The driver ends and lists transactions with kafka-python, whose settings have other names.
    Supported: PLAINTEXT, SSL (PEM files), SASL PLAIN / SCRAM-SHA-256 / SCRAM-SHA-512 / GSSAPI.
    """
    kwargs: dict[str, Any] = {
        "bootstrap_servers": [s.strip() for s in config["bootstrap.servers"].split(",") if s],
        "client_id": config.get("client.id", "twophase-kafka-driver"),
    }
    protocol = config.get("security.protocol", "plaintext").upper()
    kwargs["security_protocol"] = protocol
    if protocol.startswith("SASL"):
        mechanism = config.get("sasl.mechanism") or config.get("sasl.mechanisms") or "GSSAPI"
        mechanism = mechanism.strip().upper()
        if mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI"):
            raise TwoPhaseConfigError(
                f"option kafka.sasl.mechanism={mechanism} is not supported by the driver-side "
                "transaction client (kafka-python): use PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or "
                "GSSAPI"
            )
        kwargs["sasl_mechanism"] = mechanism
        if "sasl.username" in config:
            kwargs["sasl_plain_username"] = config["sasl.username"]
        if "sasl.password" in config:
            kwargs["sasl_plain_password"] = config["sasl.password"]
        if "sasl.kerberos.service.name" in config:
            kwargs["sasl_kerberos_service_name"] = config["sasl.kerberos.service.name"]
    if protocol.endswith("SSL"):
        for ours, theirs in (
            ("ssl.ca.location", "ssl_cafile"),
            ("ssl.certificate.location", "ssl_certfile"),
            ("ssl.key.location", "ssl_keyfile"),
            ("ssl.key.password", "ssl_password"),
            ("ssl.crl.location", "ssl_crlfile"),
        ):
            if ours in config:
                kwargs[theirs] = config[ours]
        if config.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
            kwargs["ssl_check_hostname"] = False
    return kwargs


class _RedactKafkaPythonConfig(logging.Filter):
    """kafka-python logs its whole configuration, passwords included, at DEBUG: redact it."""

    def filter(self, record: logging.LogRecord) -> bool:
        # logging turns a lone mapping argument into ``record.args`` itself.
        if isinstance(record.args, Mapping):
            record.args = redacted(record.args)
        elif isinstance(record.args, tuple):
            record.args = tuple(redacted(a) if isinstance(a, Mapping) else a for a in record.args)
        return True


def protectKafkaPythonLogs() -> None:
    """Install the redacting filter on kafka-python's admin client logger (idempotent)."""
    logger = logging.getLogger("kafka.admin.client")
    if not any(isinstance(f, _RedactKafkaPythonConfig) for f in logger.filters):
        logger.addFilter(_RedactKafkaPythonConfig())
