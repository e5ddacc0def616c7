"""``twophase.supervise``'s bad input, each refused in one error that names it (no Spark)."""

from __future__ import annotations

import pytest

import twophase
from twophase import restarts
from twophase.settings import TwoPhaseConfigError


def test_a_start_that_is_not_callable_or_returns_no_query_is_refused() -> None:
    with pytest.raises(TypeError, match="not callable"):
        twophase.supervise("writeStream.start()")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must return the StreamingQuery.*returned NoneType"):
        twophase.supervise(lambda: None)


def test_a_start_that_raises_before_a_query_started_says_so_with_its_code() -> None:
    def start() -> None:
        raise TwoPhaseConfigError("option path is missing")

    with pytest.raises(twophase.QueryFailedError) as failed:
        twophase.supervise(start)
    error = failed.value
    assert error.code == "TWOPHASE_BAD_OPTION" and not error.recoverable
    assert "start() raised before any query started" in str(error)
    assert isinstance(error.__cause__, TwoPhaseConfigError)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"restart": "fixedDelay(3, 1)"}, "restart="),
        ({"stopTimeout": 0}, "stopTimeout="),
        ({"fatal": [3]}, "not an exception class"),
    ],
)
def test_impossible_parameters_are_refused_by_name(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises((TypeError, TwoPhaseConfigError), match=named):
        twophase.supervise(lambda: None, **kwargs)  # type: ignore[arg-type]


def test_stop_gracefully_refuses_an_impossible_timeout() -> None:
    with pytest.raises(TwoPhaseConfigError, match="timeout"):
        twophase.stopGracefully(object(), timeout=-1)
    assert restarts.none().backoff().onFailure(0.0) is None
