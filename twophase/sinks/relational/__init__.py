"""What the relational sinks share: ``twophase.postgres`` and ``twophase.sql``.

One transaction naming (``naming``: the layout both write, the prefixes recovery lists by) and
one reading of their common options (``options``: ``dbtable``/``table``, ``mode`` and
``keyColumns``, ``badRecords``, the timeouts), so that both take the same options with the
same meaning and the same errors. What differs between databases lives in each sink's
``dialect`` module.
"""
