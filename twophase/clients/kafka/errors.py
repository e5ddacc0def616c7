"""Kafka client errors as text that may be shown: one ``errorText``, config errors by option.

librdkafka and kafka-python describe problems in their own words, and those words can quote
a configuration value. Every message twophase builds from them goes through ``errorText`` or
``librdkafkaError``, which name the ``kafka.*`` option at fault and pass the text through
``twophase.redaction.redact``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from twophase.clients.kafka.options import isSafeProperty
from twophase.redaction import REDACTED, redact
from twophase.settings import TwoPhaseConfigError

_INVALID_ARG = -186
"""librdkafka's ``_INVALID_ARG``: a configuration it refused."""


class KafkaUnreachableError(ConnectionError):
    """No broker of ``kafka.bootstrap.servers`` answered."""


def errorText(exc: BaseException, *, named: bool = False) -> str:
    """What a librdkafka ``KafkaException`` (or any error) says, redacted.

    ``named`` puts the error's name first (``MSG_SIZE_TOO_LARGE: Broker: Message size too
    large``) when it has one.
    """
    error: Any = exc.args[0] if exc.args else None
    describe = getattr(error, "str", None)
    if not callable(describe):
        return redact(str(exc))
    text = str(describe())
    name = getattr(error, "name", None)
    if named and callable(name):
        text = f"{name()}: {text}"
    return redact(text)


def librdkafkaError(exc: BaseException, what: str) -> TwoPhaseConfigError | None:
    """A config error naming the ``kafka.*`` option when librdkafka refused a property.

    ``what`` names the client being created (``producer``, ``consumer``...). The value of a
    property that may be secret is never shown; ``None`` when the error is not about options.
    """
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
        value, name = match.group(1), match.group(2)
        if isSafeProperty(name):
            return TwoPhaseConfigError(
                f"option kafka.{name}={value!r} is not valid for librdkafka ({what}): "
                f"{redact(text)}"
            )
        return TwoPhaseConfigError(
            f"option kafka.{name}={REDACTED} is not valid for librdkafka ({what}): invalid value"
        )
    invalidArgument = getattr(error, "code", lambda: None)() == _INVALID_ARG
    if invalidArgument or "configuration" in text.lower() or "property" in text.lower():
        return TwoPhaseConfigError(
            f"the kafka.* options were refused by librdkafka ({what}): {redact(text)}"
        )
    return None


_Client = TypeVar("_Client")


def newClient(
    make: Callable[[dict[str, Any]], _Client], config: Mapping[str, Any], what: str
) -> _Client:
    """``make(config)`` (a librdkafka Producer, Consumer or AdminClient); a property librdkafka
    refuses raises ``TwoPhaseConfigError`` naming the ``kafka.*`` option (``librdkafkaError``)."""
    from confluent_kafka import KafkaException

    try:
        return make(dict(config))
    except KafkaException as exc:
        problem = librdkafkaError(exc, what)
        if problem is not None:
            raise problem from None
        raise
