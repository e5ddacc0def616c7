"""How to reach a schema registry: the ``schema.registry.*`` options, one client per registry and
process, and its errors as errors that name the subject and show no secret.

The client is confluent-kafka's ``SchemaRegistryClient`` (the Confluent REST API, which Apicurio
and Karapace serve too). It caches what it read, so a task looks a schema up once per process.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from twophase.protocol import TransientCommitError
from twophase.redaction import redact
from twophase.settings import TwoPhaseConfigError, optionOf

PREFIX = "schema.registry."
"""Options ``schema.registry.<name>`` are the client's setting ``<name>`` (``url`` included)."""

SAFE_REGISTRY_SETTINGS = (
    "url",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
)
"""Client settings that are a URL or paths, never secrets: the checkpoint may keep these
(``url`` without any password in it). ``basic.auth.user.info``, ``bearer.auth.*``,
``ssl.key.password`` and any other setting are never kept."""

_NUMBERS = frozenset(
    {"timeout", "cache.capacity", "cache.latest.ttl.sec", "max.retries", "retries.wait.ms",
     "retries.max.wait.ms"}
)  # fmt: skip
"""Settings the client takes as numbers (Spark's options are strings)."""

DEFAULT_TIMEOUT = 10
"""Seconds a registry request may take when ``schema.registry.timeout`` is not set: the client's
own default is no limit, so a registry that accepts and never answers would hang the driver."""

_clients: dict[tuple[tuple[str, str], ...], Any] = {}
_lock = threading.Lock()


class SchemaRegistryUnreachable(TransientCommitError):
    """The registry did not answer (down, or the network): worth trying again later."""


def registryConfig(options: Mapping[str, str]) -> dict[str, str] | None:
    """The client settings the options give (``None`` when there is no ``schema.registry.url``)."""
    config = {
        key[len(PREFIX) :]: str(value)
        for key, value in options.items()
        if key.lower().startswith(PREFIX) and len(key) > len(PREFIX)
    }
    config = {key.lower() if key.lower() == "url" else key: value for key, value in config.items()}
    if not (optionOf(options, PREFIX + "url") or "").strip():
        return None
    config["url"] = str(optionOf(options, PREFIX + "url")).strip()
    return config


def registryClient(config: Mapping[str, str]) -> Any:
    """The process's client for ``config`` (created once: its caches serve every task)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    key = tuple(sorted(config.items()))
    with _lock:
        client = _clients.get(key)
        if client is None:
            try:
                settings = {k: _number(k, v) if k in _NUMBERS else v for k, v in config.items()}
                settings.setdefault("timeout", DEFAULT_TIMEOUT)
                client = SchemaRegistryClient(settings)
            except (ValueError, TypeError) as exc:
                raise TwoPhaseConfigError(
                    f"options schema.registry.*: {redact(str(exc))}; the client's settings are "
                    "those of confluent-kafka's SchemaRegistryClient (url, basic.auth.user.info, "
                    "bearer.auth.*, ssl.*)"
                ) from None
            _clients[key] = client
        return client


def _number(name: str, value: str) -> float | int:
    try:
        number = float(value)
    except ValueError:
        raise TwoPhaseConfigError(
            f"option schema.registry.{name}={value!r} is not a number"
        ) from None
    return int(number) if number.is_integer() else number


@dataclass(frozen=True)
class Registered:
    """A schema as the registry has it under a subject: its id, version and text."""

    schemaId: int
    version: int | None
    text: str
    kind: str


def register(client: Any, subject: str, text: str, kind: str) -> Registered:
    """Register ``text`` under ``subject`` (the registry answers the existing id when it has
    the schema already, so this is idempotent), and read its version back."""
    from confluent_kafka.schema_registry import Schema

    schema = Schema(text, kind)
    schemaId = _call(lambda: client.register_schema(subject, schema), subject, "registering")
    found = _call(lambda: client.lookup_schema(subject, schema), subject, "looking up")
    return Registered(schemaId, found.version, text, kind)


def lookup(client: Any, subject: str, text: str, kind: str) -> Registered:
    """The id of ``text`` under ``subject``; a clear error when it is not registered there."""
    from confluent_kafka.schema_registry import Schema

    found = _call(
        lambda: client.lookup_schema(subject, Schema(text, kind)),
        subject,
        "looking up",
        missing=f"the schema is not registered under subject {subject!r} and option "
        "auto.register.schemas is false: register it, or set auto.register.schemas=true",
    )
    return Registered(found.schema_id, found.version, text, kind)


def latest(client: Any, subject: str) -> Registered:
    """The latest version under ``subject``."""
    found = _call(
        lambda: client.get_latest_version(subject),
        subject,
        "reading the latest version of",
        missing=f"subject {subject!r} has no schema in the registry (option use.latest.version "
        "needs one): register one, or set use.latest.version=false",
    )
    schema = found.schema
    return Registered(found.schema_id, found.version, schema.schema_str, schema.schema_type)


def byId(client: Any, schemaId: int, subject: str) -> Registered:
    """The schema with id ``schemaId`` (a record's header names it)."""
    schema = _call(
        lambda: client.get_schema(schemaId),
        subject,
        f"reading schema id {schemaId} of",
        missing=f"the registry has no schema with id {schemaId}",
    )
    return Registered(schemaId, None, schema.schema_str, schema.schema_type)


def _call(action: Any, subject: str, doing: str, missing: str | None = None) -> Any:
    from confluent_kafka.schema_registry.common._httpx_compat import httpx
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        return action()
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404 and missing is not None:
            raise TwoPhaseConfigError(f"schema registry: {missing}") from None
        if exc.http_status_code in (401, 403):
            raise TwoPhaseConfigError(
                f"schema registry: {doing} subject {subject!r} was refused "
                f"({exc.http_status_code}: {redact(exc.error_message)}); check the options "
                "schema.registry.basic.auth.user.info or schema.registry.bearer.auth.*"
            ) from None
        if exc.http_status_code >= 500 or exc.http_status_code < 0:
            raise SchemaRegistryUnreachable(
                f"schema registry: {doing} subject {subject!r}: {redact(str(exc))}"
            ) from None
        raise TwoPhaseConfigError(
            f"schema registry: {doing} subject {subject!r}: {redact(exc.error_message)} "
            f"(HTTP {exc.http_status_code}, error {exc.error_code})"
        ) from None
    except (OSError, httpx.HTTPError) as exc:
        raise SchemaRegistryUnreachable(
            f"schema registry: {doing} subject {subject!r}: the registry did not answer "
            f"({redact(str(exc))}); is option schema.registry.url right, and the registry up?"
        ) from None
