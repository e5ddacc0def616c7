"""Kafka client errors as text that may be shown: one ``errorText``, config errors by option.

librdkafka and kafka-python describe problems in their own words, and those words can quote
a configuration value. Every message twophase builds from them goes through ``errorText`` or
``librdkafkaError``, which name the ``kafka.*`` option at fault and pass the text through
``twophase.redaction.redact``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from twophase.clients.kafka.options import isSafeProperty
from twophase.protocol.errors import SinkFailure, SinkSystemError
from twophase.redaction import REDACTED, redact
from twophase.settings import TwoPhaseConfigError

_INVALID_ARG = -186
"""librdkafka's ``_INVALID_ARG``: a configuration it refused."""


_UNREACHABLE_CODES = ("_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_RESOLVE", "_MSG_TIMED_OUT")
"""librdkafka's error codes (``KafkaError`` names) of brokers that did not answer."""

_CREDENTIALS_CODES = ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED")
"""librdkafka's and the brokers' error codes of refused credentials."""

_UNREACHABLE_TYPES = ("KafkaConnectionError", "NodeNotReadyError", "KafkaTimeoutError")
"""kafka-python's errors (``kafka.errors``) of brokers that did not answer."""


class KafkaSystemError(SinkSystemError):
    """An error of Kafka, with the fixes the command line gives for it, as ``twophase
    recover`` takes options; ``classify`` reads librdkafka's and kafka-python's errors by
    their code and type."""

    system = "Kafka"
    fixes = MappingProxyType(
        {
            SinkFailure.UNREACHABLE: (
                "Fix: start the brokers, or give their address as the query did: --sink-option "
                "kafka.bootstrap.servers=host:port (security options: --sink-option-file or "
                "TWOPHASE_KAFKA_OPTIONS)."
            ),
            SinkFailure.CREDENTIALS: (
                "Fix: give the security options the query used: --sink-option "
                "kafka.sasl.password=... (and kafka.sasl.*), a --sink-option-file only you can "
                "read, or TWOPHASE_KAFKA_OPTIONS."
            ),
        }
    )

    @classmethod
    def classify(cls, exc: BaseException) -> SinkFailure | None:
        """A librdkafka ``KafkaException`` by its ``KafkaError`` code, a kafka-python error by
        its type; ``None`` for any other."""
        error: Any = exc.args[0] if exc.args else None
        code = getattr(error, "code", None)
        if callable(code) and type(exc).__module__.startswith(("confluent_kafka", "cimpl")):
            from confluent_kafka import KafkaError

            number = code()
            if number in [getattr(KafkaError, n, None) for n in _CREDENTIALS_CODES]:
                return SinkFailure.CREDENTIALS
            if number in [getattr(KafkaError, n, None) for n in _UNREACHABLE_CODES]:
                return SinkFailure.UNREACHABLE
            return None
        if type(exc).__module__.startswith("kafka."):
            names = {t.__name__ for t in type(exc).__mro__}
            if "SaslAuthenticationFailedError" in names:
                return SinkFailure.CREDENTIALS
            if names & set(_UNREACHABLE_TYPES):
                return SinkFailure.UNREACHABLE
        return None


class KafkaUnreachableError(KafkaSystemError, ConnectionError):
    """No broker of ``kafka.bootstrap.servers`` answered (``reason`` ``CREDENTIALS``: the
    brokers refused the security options)."""

    reason = SinkFailure.UNREACHABLE


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
