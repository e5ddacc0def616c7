"""What an operator watches: each sink's batch figures and what is in doubt, read from the logs.

Spark-free: :mod:`~twophase.metrics.reading` reads a query's decision logs and Spark's own
checkpoint into ``SinkMetrics``; :mod:`~twophase.metrics.prometheus` exposes them (the optional
extra ``twophase[metrics]``). The Spark listener that feeds both lives in the Spark binding
(``twophase.spark.metrics``, ``twophase.attachMetrics``). docs/operations.md lists the figures.
"""

from twophase.metrics.reading import InDoubt, SinkMetrics, readSinkMetrics

__all__ = ["InDoubt", "SinkMetrics", "readSinkMetrics"]
