"""twophase: end-to-end exactly-once sinks for Spark Structured Streaming.

Subclass ``TwoPhaseCommitSink`` (one class) or ``TwoPhaseDataSource`` (a ``TransactionWriter``
and a ``Committer``) for any system with a prepare/commit protocol, register it with
``spark.dataSource.register`` and write with ``df.writeStream.format(MySink.name())``; or wrap
it with ``twophase.foreachBatch``. ``twophase.register(spark)`` registers the built-in sources
and sinks (``twophase.files``, ``twophase.postgres``, ``twophase.sql``, ``twophase.kafka``,
``twophase.sequence``), on a classic session or a Spark Connect one (docs/spark-connect.md).
``twophase.attachMetrics(spark, checkpointLocation)`` reports each batch's figures
(docs/operations.md). ``twophase.supervise(start)`` restarts a query after a failure a restart
can help (strategies in ``twophase.restarts``) and stops it cleanly on SIGTERM;
``twophase.stopGracefully(query)`` stops a query between batches (docs/restarts.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import twophase.imports  # noqa: F401  (first: fsspec without the jars; see its doc)
from twophase import restarts
from twophase.failures.errors import QueryFailedError
from twophase.protocol import (
    Committer,
    Handle,
    Prepared,
    RecoveryScope,
    SinkContractError,
    SinkFailure,
    SinkSystemError,
    TaskResult,
    TransactionContext,
    TransactionLostError,
    TransactionWriter,
    TransientCommitError,
    TwoPhaseParticipant,
)
from twophase.settings import SinkSettings, TwoPhaseConfigError
from twophase.version import __version__

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from twophase.spark.datasource import TwoPhaseCommitSink, TwoPhaseDataSource
    from twophase.spark.foreach_batch import foreachBatch
    from twophase.spark.metrics import attachMetrics
    from twophase.spark.stopping import stopGracefully
    from twophase.spark.supervise import SupervisedQuery, supervise

_SPARK_NAMES = {
    "TwoPhaseCommitSink": "twophase.spark.datasource",
    "TwoPhaseDataSource": "twophase.spark.datasource",
    "foreachBatch": "twophase.spark.foreach_batch",
    "attachMetrics": "twophase.spark.metrics",
    "supervise": "twophase.spark.supervise",
    "SupervisedQuery": "twophase.spark.supervise",
    "stopGracefully": "twophase.spark.stopping",
}
"""Names of the Spark binding, imported on first use so that ``twophase.sinks.*``,
``twophase.clients.*`` and ``twophase.verify`` import without pyspark."""


def __getattr__(name: str) -> Any:
    module = _SPARK_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'twophase' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Committer",
    "Handle",
    "Prepared",
    "QueryFailedError",
    "RecoveryScope",
    "SinkContractError",
    "SinkFailure",
    "SinkSettings",
    "SinkSystemError",
    "SupervisedQuery",
    "TaskResult",
    "TransactionContext",
    "TransactionLostError",
    "TransactionWriter",
    "TransientCommitError",
    "TwoPhaseCommitSink",
    "TwoPhaseConfigError",
    "TwoPhaseDataSource",
    "TwoPhaseParticipant",
    "__version__",
    "attachMetrics",
    "builtinDataSources",
    "foreachBatch",
    "register",
    "restarts",
    "stopGracefully",
    "supervise",
]


def builtinDataSources() -> list[type]:
    """The built-in sources and sinks, as PySpark data source classes."""
    from twophase.spark.builtins import builtinDataSources as classes

    return classes()


def register(spark: SparkSession, *, checkServer: bool = True, checkExecutors: bool = True) -> None:
    """Register the built-in twophase sources and sinks that this PySpark runs with ``spark``.

    PySpark 4.2 and later run all of them; 4.0 and 4.1 the sinks only (one log line says what
    was skipped and why); 3.5 has no Python data sources, so this raises
    ``twophase.spark.versions.SparkVersionError``: write with ``twophase.foreachBatch`` there.

    On a Spark Connect session the classes go to the server by reference, so its Python
    workers must import the same twophase: unless ``checkServer`` is false, one small job
    (``twophase.probe``) checks that at once and raises
    ``twophase.spark.connect.ConnectServerError``, saying what to install where, if not.

    Unless ``checkExecutors`` is false, it checks once per application that the Python
    workers import this twophase, and raises ``twophase.spark.executors.ExecutorsError``,
    saying what to install or set where, if not: on a cluster (a master that is not
    ``local``) with the same probe; on a local master by running the interpreter PySpark
    starts its workers with (``PYSPARK_PYTHON``, else ``python3`` on ``PATH``, often another
    Python than a venv's) once, a fraction of a second, and the error then names
    ``PYSPARK_PYTHON`` and the interpreter to set it to (this one, ``sys.executable``).
    """
    from twophase.spark import connect, executors
    from twophase.spark.builtins import registerBuiltins

    registerBuiltins(spark)

    if checkServer and connect.isConnectSession(spark):
        connect.checkServer(spark)
    elif checkExecutors and executors.isClassic(spark):
        executors.checkExecutors(spark)
