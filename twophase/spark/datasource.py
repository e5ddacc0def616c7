"""The data sources users meet: ``TwoPhaseDataSource`` and the one-class ``TwoPhaseCommitSink``.

``spark.dataSource.register(MySink)`` and ``df.writeStream.format(MySink.name())`` is all it
takes. A data source builds two objects from its options: a ``TransactionWriter`` for the
tasks and a ``Committer`` for the driver (and for ``twophase recover``). How PySpark calls the
writer that runs them is ``twophase.spark.stream_writer``'s business (docs/protocol.md §5).
"""

from __future__ import annotations

import uuid
from abc import abstractmethod
from typing import Any, ClassVar, Generic

from pyspark.sql.types import StructType

from twophase.protocol import Committer, TransactionWriter, TwoPhaseParticipant, Txn
from twophase.redaction import rememberSecrets
from twophase.settings import SinkSettings
from twophase.spark.coded import codedErrors
from twophase.spark.stream_writer import TwoPhaseStreamWriter
from twophase.spark.versions import DataSource
from twophase.spark.worker import freezeWorkerHeap


class TwoPhaseDataSource(DataSource):
    """A Spark sink whose tasks write through a ``TransactionWriter`` and whose driver commits
    through a ``Committer``, both built from ``self.options``.

    Implement ``name()``, ``createWriter()`` and ``createCommitter()``; override ``validate()``
    to check options and the input schema on the driver before the first task runs. List in
    ``safeOptions`` the options (any case) that the committer needs in ``twophase recover`` and
    that never hold a secret: only those, and the shared ones (``checkpointLocation``,
    ``sinkId``...), are written to the checkpoint.
    """

    safeOptions: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    def createWriter(self) -> TransactionWriter[Any]:
        """Executor, once per task attempt: the writer of this sink, from ``self.options``."""

    @abstractmethod
    def createCommitter(self) -> Committer:
        """Driver or any process: the committer of this sink, from ``self.options``."""

    def validate(self, schema: StructType) -> None:  # noqa: B027 - optional hook
        """Driver, once per micro-batch before tasks: raise a clear error on bad options/schema."""

    @classmethod
    def publicOptionValue(cls, key: str, value: str) -> str | None:
        """The form of safe option ``key`` that the checkpoint keeps; ``None`` leaves it out.

        For options whose value can embed a credential (a connection URL): return the value
        without it. Whatever this returns still passes through ``twophase.redaction.redact``.
        """
        return value

    @codedErrors()
    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        """Driver: build the writer; it plans the batch (validation, recovery) when Spark pickles
        it for the tasks, never when it is built to commit or abort (``stream_writer``)."""
        freezeWorkerHeap()
        rememberSecrets(self.options, self.safeOptions)
        settings = SinkSettings.fromOptions(self.options, self.name())
        return TwoPhaseStreamWriter(self, settings, schema, uuid.uuid4().hex[:8])


class TwoPhaseCommitSink(TwoPhaseDataSource, TwoPhaseParticipant[Txn], Generic[Txn]):
    """Base class of an exactly-once sink in one class: implement the lifecycle, get a data source.

    Implement ``beginTransaction``, ``write``, ``preCommit``, ``commit``, ``abort`` and
    ``recoverAndAbort`` (see ``twophase.protocol``); override ``name()`` to choose the format
    name and ``validate()`` to check options and the input schema. ``self.options`` holds the
    writer options (keys as Spark passes them: lower-cased; read them with
    ``twophase.settings.optionOf``). The sink is its own writer and committer.
    """

    def createWriter(self) -> TransactionWriter[Any]:
        return self

    def createCommitter(self) -> Committer:
        return self
