"""One micro-batch into several systems under one decision: ``twophase.multi``'s participant.

Each task prepares one transaction per target (``MultiWriter``) and reports them in one handle;
the driver decides the batch once and commits every target's part (``MultiCommitter``), so a
reader of committed data sees a batch in every target or in none. Plain Python: the targets'
writers and committers are built by the Spark binding (``twophase.spark.multi``) and handed in.
"""

from twophase.sinks.multi.committer import MultiCommitter
from twophase.sinks.multi.targets import KIND, Target, parseTargets, targetOptions
from twophase.sinks.multi.writer import MultiWriter

__all__ = ["KIND", "MultiCommitter", "MultiWriter", "Target", "parseTargets", "targetOptions"]
