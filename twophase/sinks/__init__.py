"""The built-in sinks, one Spark-free package per system: ``files``, ``postgres``, ``kafka``.

Each package holds the system's settings, its ``TransactionWriter`` and its ``Committer``;
``twophase.spark`` binds them as the data sources ``twophase.<system>``.
"""
