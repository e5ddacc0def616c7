"""Spark Connect: telling a Connect session apart, and checking its server can run twophase.

On a Spark Connect session (``pyspark.sql.connect.session.SparkSession``, also what
``spark.api.mode=connect`` gives), ``spark.dataSource.register(cls)`` only pickles the class
*by reference* and sends it to the server; the server's driver-side Python workers and the
executors' Python workers import ``twophase`` themselves when the query starts. A server
without twophase (or with another version of it) therefore accepts the registration and
fails only at ``writeStream.start()`` or, worse, runs another version's protocol.
:func:`checkServer` finds that out at registration: it reads one row from
``twophase.probe``, a batch data source of this module whose planning runs in a driver-side
Python worker and whose one partition runs in an executor's Python worker; each reports the
twophase version and the interpreter it found.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from twophase.redaction import getLogger
from twophase.spark.versions import DataSource, DataSourceReader, InputPartition
from twophase.version import __version__

log = getLogger(__name__)

PROBE_NAME = "twophase.probe"
PROBE_SCHEMA = (
    "driverVersion string, driverPython string, executorVersion string, executorPython string"
)
MISSING_MODULE = "No module named 'twophase"
"""What a Python worker's ``ModuleNotFoundError`` says when twophase is not installed there."""


class ConnectServerError(RuntimeError):
    """The Spark Connect server cannot run this twophase: it lacks it, or has another version.

    The message says what to install where; ``seen`` holds what the check found (``client``,
    ``driverVersion``, ``driverPython``, ``executorVersion``, ``executorPython``; a side the
    check could not reach is absent).
    """

    errorCode = "TWOPHASE_CONNECT_SERVER"

    def __init__(self, message: str, seen: dict[str, str]) -> None:
        super().__init__(message)
        self.seen = seen


def isConnectSession(spark: Any) -> bool:
    """True for a Spark Connect session (without importing the Connect client, which needs
    grpcio: a classic-only install must not fail here)."""
    module = type(spark).__module__ or ""
    return module.startswith("pyspark.sql.connect")


def _here() -> tuple[str, str]:
    """This Python worker's twophase version and interpreter."""
    return __version__, sys.executable


@dataclass(frozen=True)
class ProbePartition(InputPartition):
    """The one partition of the probe, carrying what the driver-side worker found."""

    driverVersion: str
    driverPython: str


class ProbeReader(DataSourceReader):
    """Plans ``count`` partitions on the driver's side (one by default) and reads one row in
    each, on an executor: more partitions reach more of a cluster's executors."""

    def __init__(self, count: int = 1) -> None:
        self.count = count

    def partitions(self) -> Sequence[InputPartition]:
        version, python = _here()
        return [ProbePartition(version, python) for _ in range(self.count)]

    def read(self, partition: InputPartition) -> Iterator[tuple[str, str, str, str]]:
        assert isinstance(partition, ProbePartition)
        version, python = _here()
        yield (partition.driverVersion, partition.driverPython, version, python)


class ProbeSource(DataSource):
    """``twophase.probe``: one row saying which twophase the server's Python workers import."""

    @classmethod
    def name(cls) -> str:
        return PROBE_NAME

    def schema(self) -> str:
        return PROBE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return ProbeReader(int(self.options.get("partitions", "1")))


def _installHint(client: str) -> str:
    return (
        f"install twophase=={client} where the Spark Connect server runs: into the server "
        "driver's Python (the interpreter its spark.pyspark.driver.python / PYSPARK_DRIVER_PYTHON "
        "or spark.pyspark.python / PYSPARK_PYTHON names) and into the executors' Python "
        "(spark.pyspark.python / PYSPARK_PYTHON on every worker host), the same version as this "
        "client's; then restart the server. See docs/spark-connect.md"
    )


def checkServer(spark: Any) -> dict[str, str]:
    """Check at once that the Connect server's Python workers import this client's twophase.

    Registers ``twophase.probe`` and reads its one row (one small job). Returns what it saw;
    raises :class:`ConnectServerError` saying what to install where when a side lacks twophase
    or has another version.
    """
    client = __version__
    seen = {"client": client}
    spark.dataSource.register(ProbeSource)
    try:
        rows = spark.read.format(PROBE_NAME).load().collect()
    except Exception as exc:
        text = str(exc)
        if MISSING_MODULE not in text:
            raise
        # Planning (the driver-side worker) fails before any task starts; a task failure means
        # the driver side imported twophase and an executor did not.
        side = "an executor's Python" if "Task" in text and "stage" in text else "the server"
        raise ConnectServerError(
            f"the Spark Connect server cannot import twophase ({side} lacks it; this client "
            f"has twophase {client} on Python {sys.version.split()[0]}): {_installHint(client)}",
            seen,
        ) from None
    row = rows[0]
    seen.update(row.asDict())
    versions = {seen["driverVersion"], seen["executorVersion"]}
    if versions != {client}:
        raise ConnectServerError(
            f"twophase versions differ: client {client}, server driver {seen['driverVersion']} "
            f"({seen['driverPython']}), executor {seen['executorVersion']} "
            f"({seen['executorPython']}); {_installHint(client)}",
            seen,
        )
    log.info(
        "Spark Connect server imports twophase %s (driver %s, executors %s)",
        client,
        seen["driverPython"],
        seen["executorPython"],
    )
    return seen


__all__ = [
    "MISSING_MODULE",
    "PROBE_NAME",
    "ConnectServerError",
    "ProbeSource",
    "checkServer",
    "isConnectSession",
]
