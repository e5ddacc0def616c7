"""One start of a chaos pipeline: a child process that runs one streaming query until drained.

``python -m integration_tests.chaos.pipeline <spec.json>`` reads a :class:`PipelineSpec` and
runs the query its pipeline (``pipelines/``) builds, its source into its sink, in
``local-cluster[2,1,1024]`` (two executor JVMs, tasks in separate processes, as on a real
cluster) with ``Trigger.availableNow``, so one start ends when the source is drained. It calls
``faults.markQueryProcessGroup()`` before Spark starts: a ``driver.*`` crash point
(``TWOPHASE_CRASH_AT`` with ``TWOPHASE_CRASH_ONCE_DIR``) then kills the driver, its Python
workers and the executors together, like a power cut; the parent kills the same session for a
timed driver crash. Exit 0: drained; 3: the query failed (its error on stderr).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from integration_tests.chaos.pipelines import PIPELINES
from integration_tests.chaos.spec import PipelineSpec
from integration_tests.spark_processes import QUERY_FAILED, awaitDrained, sessionBuilder
from twophase import faults

__all__ = ["PIPELINES", "QUERY_FAILED", "PipelineSpec", "run"]


def run(spec: PipelineSpec) -> int:
    faults.markQueryProcessGroup()  # before Spark: the JVM and every worker inherit it
    import twophase

    pipeline = PIPELINES.get(spec.pipeline)
    if pipeline is None:
        raise SystemExit(f"unknown pipeline {spec.pipeline!r}; one of {', '.join(PIPELINES)}")
    builder = (
        sessionBuilder(spec.master, f"twophase-chaos-{spec.pipeline}", spec.partitions)
        .config("spark.sql.session.timeZone", "UTC")
        # A killed executor is replaced; the app must survive every kill of a long soak.
        .config("spark.deploy.maxExecutorRetries", "-1")
        .config("spark.task.maxFailures", "8")
    )
    for key, value in spec.sparkConf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    twophase.register(spark)
    writer = pipeline.sink(pipeline.source(spark, spec), spec)
    writer = writer.options(**spec.sinkOptions).option(
        "checkpointLocation", spec.checkpointLocation
    )
    query = writer.trigger(availableNow=True).start()
    return awaitDrained(spark, query)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("spec", help="JSON file of a PipelineSpec")
    return run(PipelineSpec.load(Path(parser.parse_args(argv).spec)))


if __name__ == "__main__":
    raise SystemExit(main())
