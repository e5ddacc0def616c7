"""The same cluster and credentials for kafka-python, the driver's client for raw requests.

The driver ends and lists transactions with kafka-python, whose settings have other names than
librdkafka's. kafka-python logs its whole configuration, passwords included, at DEBUG: the
filter installed by ``protectKafkaPythonLogs`` hides the secret ones.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from twophase.clients.kafka.options import isSafeProperty
from twophase.redaction import REDACTED, getLogger
from twophase.settings import TwoPhaseConfigError

_SSL_FILES = (
    ("ssl.ca.location", "ssl_cafile"),
    ("ssl.certificate.location", "ssl_certfile"),
    ("ssl.key.location", "ssl_keyfile"),
    ("ssl.key.password", "ssl_password"),
    ("ssl.crl.location", "ssl_crlfile"),
)
_SASL = (
    ("sasl.username", "sasl_plain_username"),
    ("sasl.password", "sasl_plain_password"),
    ("sasl.kerberos.service.name", "sasl_kerberos_service_name"),
)

SECRET_ARGUMENTS = frozenset(
    theirs for ours, theirs in _SSL_FILES + _SASL if not isSafeProperty(ours)
) | {"sasl_oauth_token_provider", "ssl_context"}
"""kafka-python arguments whose values must not be shown: those set from librdkafka properties
off the allow-list, and kafka-python's own credential objects."""

_LOGGERS = ("kafka.admin.client", "kafka.client_async", "kafka.conn")


def kafkaPythonConfig(config: Mapping[str, str]) -> dict[str, Any]:
    """kafka-python keyword arguments for the same cluster and credentials as ``config``.

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
        for ours, theirs in _SASL:
            if ours in config:
                kwargs[theirs] = config[ours]
    if protocol.endswith("SSL"):
        for ours, theirs in _SSL_FILES:
            if ours in config:
                kwargs[theirs] = config[ours]
        if config.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
            kwargs["ssl_check_hostname"] = False
    return kwargs


def shownArguments(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """kafka-python arguments as a log line may show them: secret values replaced."""
    return {k: (REDACTED if k in SECRET_ARGUMENTS else v) for k, v in kwargs.items()}


class _HideKafkaPythonSecrets(logging.Filter):
    """Replaces the secret values of a configuration mapping logged by kafka-python."""

    def filter(self, record: logging.LogRecord) -> bool:
        # logging turns a lone mapping argument into ``record.args`` itself.
        if isinstance(record.args, Mapping):
            record.args = shownArguments(record.args)
        elif isinstance(record.args, tuple):
            record.args = tuple(
                shownArguments(a) if isinstance(a, Mapping) else a for a in record.args
            )
        return True


def protectKafkaPythonLogs() -> None:
    """Hide secrets in what kafka-python's client loggers write (idempotent).

    Each logger gets the filter for configuration dumps and twophase's redacting filter for
    everything else (credentials remembered from the options, passwords in text).
    """
    for name in _LOGGERS:
        logger = getLogger(name)
        if not any(isinstance(f, _HideKafkaPythonSecrets) for f in logger.filters):
            logger.filters.insert(0, _HideKafkaPythonSecrets())
