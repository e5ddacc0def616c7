"""The built-in replayable sources, Spark-free: ``sequence`` and ``kafka``.

Each holds the system's offsets, planning and reading; ``twophase.spark`` binds them as the
streaming data sources ``twophase.sequence`` and ``twophase.kafka``.
"""
