"""Restart strategies for ``twophase.supervise``: when a failed query starts again, and when not.

As Flink's restart strategies: ``fixedDelay`` (a number of restarts, a pause before each),
``failureRate`` (at most so many failures in an interval), ``exponentialDelay`` (a pause that
grows with each failure and starts again from the smallest after a quiet period; the default)
and ``none``. A strategy is a value; ``supervise`` asks it for a ``Backoff``, which sees each
failure in turn and answers the pause before the restart, or ``None`` to give up. Which
failures are worth a restart at all is the classification's (``twophase.failures``), not the
strategy's: a fatal error ends the query whatever the strategy.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from twophase.settings import TwoPhaseConfigError


class Backoff:
    """One supervised query's count of its failures under a strategy."""

    def onFailure(self, now: float) -> float | None:
        """A failure at ``now`` (monotonic seconds): the pause before the restart, or ``None``
        when the strategy gives up."""
        raise NotImplementedError


class RestartStrategy:
    """A strategy: ``backoff()`` starts counting for one supervised query."""

    def backoff(self) -> Backoff:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


def _seconds(value: object, name: str, strategy: str, *, zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise TwoPhaseConfigError(
            f"twophase.restarts.{strategy}({name}={value!r}): give seconds, a number of 0 or more"
        )
    if not zero and value == 0:
        raise TwoPhaseConfigError(
            f"twophase.restarts.{strategy}({name}=0): must be more than 0 seconds"
        )
    return float(value)


def _count(value: object, name: str, strategy: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TwoPhaseConfigError(
            f"twophase.restarts.{strategy}({name}={value!r}): give a whole number of 0 or more"
        )
    return value


def _since(seconds: float) -> str:
    return f"{seconds:g} s"


@dataclass(frozen=True)
class FixedDelay(RestartStrategy):
    """``attempts`` restarts in all, each after ``delay`` seconds."""

    attempts: int
    delay: float

    def backoff(self) -> Backoff:
        return _Counting(self.attempts, lambda: self.delay)

    def describe(self) -> str:
        return f"fixedDelay({self.attempts} attempts, {_since(self.delay)} apart)"


@dataclass(frozen=True)
class FailureRate(RestartStrategy):
    """Restart after ``delay`` seconds unless more than ``failures`` failures fell within the
    last ``interval`` seconds."""

    failures: int
    interval: float
    delay: float

    def backoff(self) -> Backoff:
        return _Rate(self)

    def describe(self) -> str:
        return (
            f"failureRate(at most {self.failures} failures in {_since(self.interval)}, "
            f"{_since(self.delay)} apart)"
        )


@dataclass(frozen=True)
class ExponentialDelay(RestartStrategy):
    """Pauses of ``initial`` seconds, times ``multiplier`` at each failure, at most ``maximum``,
    each moved by up to ``jitter`` of itself either way; after ``resetAfter`` seconds without a
    failure the next pause is ``initial`` again. Restarts without end."""

    initial: float
    maximum: float
    multiplier: float
    resetAfter: float
    jitter: float
    random: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def backoff(self) -> Backoff:
        return _Exponential(self)

    def describe(self) -> str:
        return (
            f"exponentialDelay({_since(self.initial)} to {_since(self.maximum)}, "
            f"x{self.multiplier:g}, reset after {_since(self.resetAfter)} without a failure)"
        )


@dataclass(frozen=True)
class NoRestart(RestartStrategy):
    """Never restart: the first failure ends the query."""

    def backoff(self) -> Backoff:
        return _Counting(0, lambda: 0.0)

    def describe(self) -> str:
        return "none()"


class _Counting(Backoff):
    def __init__(self, attempts: int, delay: Callable[[], float]) -> None:
        self.left = attempts
        self.delay = delay

    def onFailure(self, now: float) -> float | None:
        if self.left <= 0:
            return None
        self.left -= 1
        return self.delay()


class _Rate(Backoff):
    def __init__(self, strategy: FailureRate) -> None:
        self.strategy = strategy
        self.times: deque[float] = deque()

    def onFailure(self, now: float) -> float | None:
        self.times.append(now)
        while self.times and self.times[0] < now - self.strategy.interval:
            self.times.popleft()
        if len(self.times) > self.strategy.failures:
            return None
        return self.strategy.delay


class _Exponential(Backoff):
    def __init__(self, strategy: ExponentialDelay) -> None:
        self.strategy = strategy
        self.next = strategy.initial
        self.last: float | None = None

    def onFailure(self, now: float) -> float | None:
        s = self.strategy
        if self.last is not None and now - self.last >= s.resetAfter:
            self.next = s.initial
        self.last = now
        pause = self.next
        self.next = min(s.maximum, self.next * s.multiplier)
        spread = pause * s.jitter
        return max(0.0, min(s.maximum, pause + spread * (2 * s.random() - 1)))


def fixedDelay(attempts: int, delay: float) -> FixedDelay:
    """Restart ``attempts`` times in all, each ``delay`` seconds after the failure."""
    return FixedDelay(
        _count(attempts, "attempts", "fixedDelay"), _seconds(delay, "delay", "fixedDelay")
    )


def failureRate(failures: int, interval: float, delay: float) -> FailureRate:
    """Restart ``delay`` seconds after each failure while at most ``failures`` failures fall
    within any ``interval`` seconds; give up on the one more."""
    return FailureRate(
        _count(failures, "failures", "failureRate"),
        _seconds(interval, "interval", "failureRate", zero=False),
        _seconds(delay, "delay", "failureRate"),
    )


def exponentialDelay(
    initial: float = 1.0,
    maximum: float = 300.0,
    multiplier: float = 2.0,
    resetAfter: float = 3600.0,
    jitter: float = 0.1,
) -> ExponentialDelay:
    """Restart without end: after ``initial`` seconds, then ``multiplier`` times longer each
    time up to ``maximum``, back to ``initial`` after ``resetAfter`` seconds without a failure;
    each pause moved by up to ``jitter`` (a fraction) of itself, so that many queries failing
    together do not all come back in the same second."""
    name = "exponentialDelay"
    first = _seconds(initial, "initial", name, zero=False)
    top = _seconds(maximum, "maximum", name, zero=False)
    if top < first:
        raise TwoPhaseConfigError(
            f"twophase.restarts.{name}(initial={initial!r}, maximum={maximum!r}): the maximum "
            "pause must be at least the initial one"
        )
    if isinstance(multiplier, bool) or not isinstance(multiplier, int | float) or multiplier < 1:
        raise TwoPhaseConfigError(
            f"twophase.restarts.{name}(multiplier={multiplier!r}): give a number of 1 or more"
        )
    if isinstance(jitter, bool) or not isinstance(jitter, int | float) or not 0 <= jitter < 1:
        raise TwoPhaseConfigError(
            f"twophase.restarts.{name}(jitter={jitter!r}): give a fraction from 0 up to 1"
        )
    return ExponentialDelay(
        first, top, float(multiplier), _seconds(resetAfter, "resetAfter", name), float(jitter)
    )


def none() -> NoRestart:
    """Never restart."""
    return NoRestart()


__all__ = [
    "Backoff",
    "ExponentialDelay",
    "FailureRate",
    "FixedDelay",
    "NoRestart",
    "RestartStrategy",
    "exponentialDelay",
    "failureRate",
    "fixedDelay",
    "none",
]
