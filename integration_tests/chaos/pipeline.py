"""One start of a chaos pipeline: a child process that runs one streaming query until drained.

``python -m integration_tests.chaos.pipeline <spec.json>`` reads a :class:`PipelineSpec` and
runs the query its pipeline (``pipelines/``) builds, its source into its sink, in
``local-cluster[2,1,1024]`` (two executor JVMs, tasks in separate processes, as on a real
cluster) with ``Trigger.availableNow``, so one start ends when the source is drained. The
query runs under ``twophase.supervise``, as a user's would: a failure that leaves this process
alive (a server down, frozen or cut off, an executor lost) is restarted in the same session,
each restart a JSON line in the file ``TWOPHASE_CHAOS_RESTARTS`` names, and SIGTERM stops it
cleanly. It calls ``faults.markQueryProcessGroup()`` before Spark starts: a ``driver.*`` crash
point (``TWOPHASE_CRASH_AT`` with ``TWOPHASE_CRASH_ONCE_DIR``) then kills the driver, its
Python workers and the executors together, like a power cut; the parent kills the same session
for a timed driver crash. Exit 0: drained; 3: the query failed for good (its error on stderr
and in the restarts file); 4: stopped cleanly by SIGTERM. A release before supervision (the
chaos soak's ``upgraded`` starts) runs the query plainly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from integration_tests.chaos.pipelines import PIPELINES
from integration_tests.chaos.spec import PipelineSpec
from integration_tests.spark_processes import QUERY_FAILED, awaitDrained, sessionBuilder
from twophase import faults

STOPPED = 4
"""Exit status of a child whose query SIGTERM stopped cleanly."""
RESTARTS_ENV = "TWOPHASE_CHAOS_RESTARTS"
"""The file a start writes its supervised restarts and its end to, one JSON line each."""
STOP_TIMEOUT = 60.0
"""How long SIGTERM's stop waits for the running batch."""

__all__ = ["PIPELINES", "QUERY_FAILED", "RESTARTS_ENV", "STOPPED", "PipelineSpec", "run"]


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

    def start() -> Any:
        writer = pipeline.sink(pipeline.source(spark, spec), spec)
        writer = writer.options(**spec.sinkOptions).option(
            "checkpointLocation", spec.checkpointLocation
        )
        return writer.trigger(availableNow=True).start()

    if not hasattr(twophase, "supervise"):  # an earlier release's start
        return awaitDrained(spark, start())
    supervised = twophase.supervise(
        start,
        twophase.restarts.exponentialDelay(0.5, 4.0, resetAfter=60.0),
        stopTimeout=STOP_TIMEOUT,
    )
    return awaitSupervised(spark, supervised, os.environ.get(RESTARTS_ENV))


def awaitSupervised(spark: Any, supervised: Any, restartsFile: str | None) -> int:
    """Wait for the supervised query, writing each restart to ``restartsFile`` as it happens;
    the exit status of the start. Stops the session either way."""
    import twophase

    written = 0

    def note(record: dict[str, Any]) -> None:
        if restartsFile:
            with open(restartsFile, "a") as f:
                f.write(json.dumps(record) + "\n")

    def restarts() -> None:
        nonlocal written
        for r in supervised.restarts[written:]:
            note({"at": r.at.timestamp(), "code": r.code, "errorClass": r.errorClass,
                  "firstLine": r.firstLine[:500], "pause": r.pause})  # fmt: skip
            written += 1

    try:
        while not supervised.awaitTermination(0.5):
            restarts()
        restarts()
    except twophase.QueryFailedError as exc:
        restarts()
        note({"end": "failed", "at": time.time(), "code": exc.code,
              "recoverable": exc.recoverable, "gaveUp": exc.gaveUp})  # fmt: skip
        sys.stderr.write(f"QUERY FAILED: {exc}\n")
        sys.stderr.flush()
        spark.stop()
        return QUERY_FAILED
    stopped = supervised.stopped
    note({"end": "stopped" if stopped else "drained", "at": time.time()})
    spark.stop()
    return STOPPED if stopped else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("spec", help="JSON file of a PipelineSpec")
    return run(PipelineSpec.load(Path(parser.parse_args(argv).spec)))


if __name__ == "__main__":
    raise SystemExit(main())
