"""The options every twophase sink shares, parsed once into a frozen settings object.

Sink-specific options (``path``, ``table``, ``topic`` ...) are read by each participant; this
module owns only what the binding and the coordinator need: where the decision log lives, the
sink id that namespaces it, and how hard to retry. Errors name the option and the fix.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from twophase.coordinator.paths import logLocationFor
from twophase.coordinator.settings import REWRITE_MISMATCH_OPTION, CoordinatorSettings

UNFENCED_LOG_STORE_OPTION = "twophase.unfencedLogStore"

SINK_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$")


class TwoPhaseConfigError(ValueError):
    """A sink option is missing or wrong; the message names the option and the fix."""

    errorCode = "TWOPHASE_BAD_OPTION"


@contextmanager
def optionErrors() -> Iterator[None]:
    """A ``ValueError`` of a sink's option parser as the ``TwoPhaseConfigError`` it is, its
    message kept, so that it carries the code of a bad option into Spark."""
    try:
        yield
    except TwoPhaseConfigError:
        raise
    except ValueError as exc:
        raise TwoPhaseConfigError(str(exc)) from exc


def _lookup(options: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive option lookup (PySpark hands data sources lower-cased keys)."""
    if name in options:
        return options[name]
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


def optionOf(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """Read an option by its documented camelCase name, whatever case Spark passed it in."""
    value = _lookup(options, name)
    return default if value is None else value


def boolOption(options: Mapping[str, str], name: str, default: bool) -> bool:
    """Parse a boolean option (``true``/``false``, any case); anything else is an error."""
    raw = optionOf(options, name)
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise TwoPhaseConfigError(f"option {name}={raw!r} is not a boolean; use true or false")


def intOption(
    options: Mapping[str, str], name: str, default: int, *, minimum: int | None = None
) -> int:
    """Parse an integer option, optionally bounded below; errors name the option."""
    raw = optionOf(options, name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise TwoPhaseConfigError(f"option {name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise TwoPhaseConfigError(f"option {name}={value} must be at least {minimum}")
    return value


def floatOption(
    options: Mapping[str, str], name: str, default: float, *, zero: bool = False
) -> float:
    """Parse a positive number option (``zero``: 0 allowed too); errors name the option."""
    raw = optionOf(options, name)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise TwoPhaseConfigError(f"option {name}={raw!r} is not a number") from None
    if value < 0 or (value == 0 and not zero):
        raise TwoPhaseConfigError(
            f"option {name}={value} must be {'0 or more' if zero else 'positive'}"
        )
    return value


def defaultSinkId(checkpointLocation: str, sinkName: str) -> str:
    """A stable, short sink id derived from the checkpoint location and the sink's name.

    Short because it is embedded in transaction ids (PostgreSQL xids, Kafka transactional ids).
    """
    digest = hashlib.sha256(f"{sinkName}\0{checkpointLocation.rstrip('/')}".encode()).hexdigest()
    return f"tp-{digest[:12]}"


@dataclass(frozen=True)
class SinkSettings:
    """The shared options of a twophase sink, validated.

    - ``checkpointLocation`` (required): the query's checkpoint; the decision log lives under
      ``<checkpointLocation>/twophase/<sinkId>/`` unless ``twophase.logLocation`` says otherwise.
    - ``sinkId``: namespaces the log and every transaction id (default: derived from the
      checkpoint location, so it is stable across restarts).
    - ``twophase.resetLog``: take over a log that belongs to another query id.
    - ``twophase.unfencedLogStore``: accept a log store without a create-if-absent, where two
      drivers running at once could both decide a batch (``coordinator.exclusive``).
    - ``commitRetries``, ``commitTimeoutSeconds``: bounds of the driver's commit retries;
      ``logRetentionBatches``: finished batches kept in the log before pruning. Together they
      are the coordinator's settings (defaults: ``CoordinatorSettings``).
    """

    checkpointLocation: str
    sinkId: str
    logLocation: str
    resetLog: bool
    coordinator: CoordinatorSettings
    unfencedLogStore: bool = False

    @classmethod
    def fromOptions(cls, options: Mapping[str, str], sinkName: str) -> SinkSettings:
        refuseUnsupportedModes(options)
        checkpoint = optionOf(options, "checkpointLocation")
        if not checkpoint:
            raise TwoPhaseConfigError(
                f"sink {sinkName} needs a checkpoint location to keep its decision log: add "
                '.option("checkpointLocation", "<dir>") to writeStream (the session-wide '
                "spark.sql.streaming.checkpointLocation is not passed to data sources)"
            )
        sinkId = optionOf(options, "sinkId") or defaultSinkId(checkpoint, sinkName)
        if not SINK_ID_PATTERN.match(sinkId):
            raise TwoPhaseConfigError(
                f"option sinkId={sinkId!r} must be 1-48 characters of letters, digits, "
                "'_', '.', '-', starting with a letter or digit"
            )
        logLocation = optionOf(options, "twophase.logLocation") or logLocationFor(
            checkpoint, sinkId
        )
        return cls(
            checkpointLocation=checkpoint,
            sinkId=sinkId,
            logLocation=logLocation,
            resetLog=boolOption(options, "twophase.resetLog", False),
            coordinator=coordinatorSettings(options),
            unfencedLogStore=boolOption(options, UNFENCED_LOG_STORE_OPTION, False),
        )


def coordinatorSettings(options: Mapping[str, str]) -> CoordinatorSettings:
    """The coordinator's settings from a sink's options; unset ones keep the defaults."""
    default = CoordinatorSettings()
    return CoordinatorSettings(
        commitRetries=intOption(options, "commitRetries", default.commitRetries, minimum=1),
        commitTimeoutSeconds=floatOption(
            options, "commitTimeoutSeconds", default.commitTimeoutSeconds
        ),
        retentionBatches=intOption(
            options, "logRetentionBatches", default.retentionBatches, minimum=1
        ),
        rewriteMismatch=(optionOf(options, REWRITE_MISMATCH_OPTION, default.rewriteMismatch) or "")
        .strip()
        .lower(),
    )


def refuseUnsupportedModes(options: Mapping[str, str]) -> None:
    """Refuse async progress tracking: it lets batch N+1 run before N is committed.

    The protocol needs Spark's micro-batches to be strictly sequential (docs/protocol.md §5), so a
    batch id means one decision. Real-time mode is refused by Spark itself for Python sinks.
    """
    if boolOption(options, "asyncProgressTrackingEnabled", False):
        raise TwoPhaseConfigError(
            "twophase sinks cannot run with asyncProgressTrackingEnabled=true: async progress "
            "tracking lets a batch start before the previous one is committed, which breaks "
            "exactly-once. Remove the option (or set it to false)."
        )
