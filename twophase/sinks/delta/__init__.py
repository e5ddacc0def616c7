"""The Delta sink: Parquet files staged by the tasks, one Delta log commit per batch.

Tasks write the batch's rows as the files sink does, staged outside the table
(:class:`twophase.sinks.files.FilesWriter`); once the batch is decided, the driver moves them
into the table's directory, where no reader sees a file the log does not name, and adds them
all in one commit carrying the batch as the sink's application transaction, so the table
itself tells a replay what it holds (:class:`DeltaCommitter`). Plain Python through delta-rs
(the ``deltalake`` package, an extra); the registry (``twophase.sinks.registry``) declares
it as ``twophase.delta``.

Modules by role: ``settings`` (options), ``table`` (every delta-rs call), ``writer`` and
``committer``.
"""

from twophase.sinks.delta.committer import DeltaCommitter
from twophase.sinks.delta.settings import SAFE_OPTIONS, DeltaSettings
from twophase.sinks.delta.table import DeltaTableError, ensureTable, validateTarget
from twophase.sinks.delta.writer import DeltaWriter

__all__ = [
    "SAFE_OPTIONS",
    "DeltaCommitter",
    "DeltaSettings",
    "DeltaTableError",
    "DeltaWriter",
    "ensureTable",
    "validateTarget",
]
