"""The restart strategies: the pauses they give, when they give up, their bad input."""

from __future__ import annotations

import pytest

from twophase import restarts
from twophase.settings import TwoPhaseConfigError


def pauses(strategy: restarts.RestartStrategy, times: list[float]) -> list[float | None]:
    backoff = strategy.backoff()
    return [backoff.onFailure(t) for t in times]


def test_fixed_delay_restarts_so_many_times() -> None:
    assert pauses(restarts.fixedDelay(2, 5), [0, 100, 200]) == [5.0, 5.0, None]
    assert pauses(restarts.none(), [0]) == [None]


def test_failure_rate_gives_up_on_one_failure_too_many_within_the_interval() -> None:
    strategy = restarts.failureRate(2, 60, 1)
    assert pauses(strategy, [0, 10, 20]) == [1.0, 1.0, None]
    assert pauses(strategy, [0, 10, 80, 90, 200]) == [1.0, 1.0, 1.0, 1.0, 1.0]


def test_exponential_delay_grows_to_its_maximum_and_resets_after_a_quiet_period() -> None:
    strategy = restarts.exponentialDelay(1, 10, multiplier=2, resetAfter=600, jitter=0)
    assert pauses(strategy, [0, 1, 2, 3, 4, 5, 1000]) == [1, 2, 4, 8, 10, 10, 1]


def test_exponential_jitter_stays_within_its_fraction() -> None:
    backoff = restarts.exponentialDelay(10, 10, jitter=0.2).backoff()
    seen = [backoff.onFailure(float(t)) for t in range(200)]
    assert all(p is not None and 8.0 <= p <= 10.0 for p in seen)
    assert len(set(seen)) > 1


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: restarts.fixedDelay(-1, 1), "attempts"),
        (lambda: restarts.fixedDelay(1, "soon"), "delay"),
        (lambda: restarts.failureRate(1, 0, 1), "interval"),
        (lambda: restarts.exponentialDelay(10, 1), "maximum"),
        (lambda: restarts.exponentialDelay(1, 10, multiplier=0.5), "multiplier"),
        (lambda: restarts.exponentialDelay(1, 10, jitter=1.5), "jitter"),
    ],
)
def test_impossible_parameters_are_refused_by_name(make: object, named: str) -> None:
    with pytest.raises(TwoPhaseConfigError, match=named):
        make()  # type: ignore[operator]
