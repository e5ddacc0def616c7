"""The Spark binding: the only package that imports pyspark.

Data sources (``datasource``: the base classes; ``files``, ``postgres``, ``kafka``,
``sequence``: the built-ins), PySpark's stream writer (``stream_writer``), the ``foreachBatch``
adapter, the task runner, what Spark's checkpoint says, the set-up of Python workers, and what
differs between the PySpark versions twophase runs beside (``versions``).
"""
