"""A pytest contract suite any sink joins: subclass ``SinkContract`` in a test file of your own.

Set ``sink`` to the sink class (a ``TwoPhaseCommitSink``, or a ``TwoPhaseDataSource`` with a
writer and a committer), implement ``newTarget()``, ``readCommitted(options)`` and
``leftovers(options)``, and name the subclass ``Test...``: pytest then runs every case of the
protocol's contract against your real system (docs/writing-a-sink.md). Needs pytest
(``pip install twophase[testing]``); imports no pyspark and starts no Spark.
"""

from twophase.testing.contract import SinkContract

__all__ = ["SinkContract"]
