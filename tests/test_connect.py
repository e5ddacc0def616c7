"""``twophase.register`` on Spark Connect sessions: the server check, against fake sessions."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from pyspark.sql import Row

import twophase
from twophase.spark.connect import (
    PROBE_NAME,
    ConnectServerError,
    ProbePartition,
    ProbeReader,
    isConnectSession,
)


class _Registry:
    def __init__(self) -> None:
        self.names: list[str] = []

    def register(self, cls: type) -> None:
        self.names.append(cls.name())  # type: ignore[attr-defined]


class _Reader:
    """``spark.read.format(...).load().collect()`` answering with ``outcome``."""

    def __init__(self, outcome: list[Row] | Exception) -> None:
        self.outcome = outcome
        self.formats: list[str] = []

    def format(self, name: str) -> _Reader:
        self.formats.append(name)
        return self

    def load(self) -> _Reader:
        return self

    def collect(self) -> list[Row]:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


class ClassicSession:
    def __init__(self, outcome: list[Row] | Exception) -> None:
        self.dataSource = _Registry()
        self.read = _Reader(outcome)


class ConnectSession(ClassicSession):
    pass


ConnectSession.__module__ = "pyspark.sql.connect.session"


def _row(driver: str = twophase.__version__, executor: str = twophase.__version__) -> Row:
    return Row(
        driverVersion=driver,
        driverPython="/srv/driver/bin/python",
        executorVersion=executor,
        executorPython="/srv/executor/bin/python",
    )


def test_only_connect_sessions_are_told_apart() -> None:
    assert isConnectSession(ConnectSession([]))
    assert not isConnectSession(ClassicSession([]))


def test_a_classic_session_registers_without_a_server_check() -> None:
    spark = ClassicSession(AssertionError("no job expected"))
    twophase.register(spark)  # type: ignore[arg-type]
    assert spark.read.formats == []
    assert "twophase.files" in spark.dataSource.names


def test_a_matching_connect_server_passes_with_one_probe_read() -> None:
    spark = ConnectSession([_row()])
    twophase.register(spark)  # type: ignore[arg-type]
    assert spark.read.formats == [PROBE_NAME]
    assert {"twophase.files", "twophase.sequence", PROBE_NAME} <= set(spark.dataSource.names)


def test_checkServer_false_skips_the_probe() -> None:
    spark = ConnectSession(AssertionError("no job expected"))
    twophase.register(spark, checkServer=False)  # type: ignore[arg-type]
    assert spark.read.formats == []


def test_a_server_without_twophase_is_told_what_to_install_where() -> None:
    failure = Exception(
        "[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: "
        "ModuleNotFoundError: No module named 'twophase'"
    )
    with pytest.raises(ConnectServerError) as raised:
        twophase.register(ConnectSession(failure))  # type: ignore[arg-type]
    message = str(raised.value)
    assert f"install twophase=={twophase.__version__}" in message
    assert "the server lacks it" in message
    assert "server driver's Python" in message and "executors' Python" in message
    assert raised.value.seen == {"client": twophase.__version__}


def test_an_executor_without_twophase_is_named() -> None:
    failure = Exception(
        "Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times: "
        "ModuleNotFoundError: No module named 'twophase'"
    )
    with pytest.raises(ConnectServerError, match="an executor's Python lacks it"):
        twophase.register(ConnectSession(failure))  # type: ignore[arg-type]


def test_another_version_on_the_server_is_refused_with_the_versions_seen() -> None:
    with pytest.raises(ConnectServerError) as raised:
        twophase.register(ConnectSession([_row(executor="0.0.9")]))  # type: ignore[arg-type]
    message = str(raised.value)
    assert f"client {twophase.__version__}" in message and "executor 0.0.9" in message
    assert "/srv/executor/bin/python" in message
    assert raised.value.seen["executorVersion"] == "0.0.9"


def test_other_server_errors_propagate_unchanged() -> None:
    failure = RuntimeError("UNAVAILABLE: failed to connect")
    with pytest.raises(RuntimeError, match="UNAVAILABLE") as raised:
        twophase.register(ConnectSession(failure))  # type: ignore[arg-type]
    assert raised.value is failure


def test_the_probe_reports_the_version_and_python_of_each_side() -> None:
    reader = ProbeReader()
    (partition,) = reader.partitions()
    assert partition == ProbePartition(twophase.__version__, sys.executable)
    rows: list[Any] = list(reader.read(partition))
    assert rows == [(twophase.__version__, sys.executable, twophase.__version__, sys.executable)]
