"""A driver of the two-drivers tests: several queries in one Spark application, a checkpoint each.

``python -m integration_tests.driver_child <spec.json>`` starts one ``twophase.sequence`` query
per sink of the spec (``format(...)``, ``Trigger.availableNow``) with its checkpoint at
``<checkpointRoot>/<name>``, waits for all of them and writes ``<result>``: per query ``ok`` or
the error it ended with. Exit status 0 when every query drained, 3 when one failed. A
``s3a://`` checkpoint root puts Spark's own checkpoint on the S3 server through Hadoop's S3A
connector (hadoop-aws of PySpark's own Hadoop version, by its Maven coordinates, cached under
``TWOPHASE_CACHE``); twophase's logs live under it, reached through s3fs with the ``AWS_*``
variables the test gives the child. The test runs two of these on one spec: the first paused
at a protocol step (``twophase.faults``), the second started while it stands still (its
Spark session may be made earlier: ``startWhen`` names a file it waits for before the queries).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from integration_tests.spark_harness import loadSinkClass
from integration_tests.spark_processes import QUERY_FAILED, sessionBuilder


def hadoopVersion() -> str:
    """The Hadoop version PySpark ships (its hadoop-client-api jar)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    for jar in jars.glob("hadoop-client-api-*.jar"):
        return jar.name[len("hadoop-client-api-") : -len(".jar")]
    raise SystemExit(f"no hadoop-client-api jar in {jars}: cannot pick hadoop-aws")


def s3aConf(endpoint: str, key: str, secret: str) -> dict[str, str]:
    """Spark settings for a checkpoint on the S3 server through S3A."""
    cache = Path(os.environ.get("TWOPHASE_CACHE", Path.home() / ".cache" / "twophase"))
    return {
        "spark.jars.packages": f"org.apache.hadoop:hadoop-aws:{hadoopVersion()}",
        "spark.jars.ivy": str(cache / "ivy"),
        "spark.hadoop.fs.s3a.endpoint": endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.access.key": key,
        "spark.hadoop.fs.s3a.secret.key": secret,
    }


def main(specPath: str) -> int:
    from twophase import faults

    faults.markQueryProcessGroup()
    spec: dict[str, Any] = json.loads(Path(specPath).read_text())
    root = str(spec["checkpointRoot"]).rstrip("/")
    builder = sessionBuilder("local[2]", "twophase-it-two-drivers", int(spec["partitions"]))
    # A query's error with its causes (the twophase error inside PySpark's "Writing job failed").
    builder = builder.config("spark.sql.pyspark.jvmStacktrace.enabled", "true")
    if root.startswith("s3a://"):
        for key, value in s3aConf(**spec["s3a"]).items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if spec.get("startWhen"):  # started early, so its JVM is up when the test wants it
        go = Path(spec["startWhen"])
        while not go.exists():
            time.sleep(0.1)
    from twophase.spark.sequence import SequenceSource

    spark.dataSource.register(SequenceSource)
    queries = {}
    for name, sink in spec["sinks"].items():
        sinkClass = loadSinkClass(sink["spec"])
        spark.dataSource.register(sinkClass)
        stream = (
            spark.readStream.format(SequenceSource.name())
            .option("totalRows", spec["rows"])
            .option("rowsPerBatch", spec["rowsPerBatch"])
            .option("numPartitions", spec["partitions"])
            .load()
        )
        if sink.get("columns"):
            stream = stream.selectExpr(*(f"{e} AS {c}" for c, e in sink["columns"].items()))
        queries[name] = (
            stream.writeStream.trigger(availableNow=True)
            .format(sinkClass.name())
            .options(**sink["options"])
            .option("checkpointLocation", f"{root}/{name}")
            .queryName(name)
            .start()
        )
    outcome: dict[str, str] = {}
    for name, query in queries.items():
        try:
            query.awaitTermination()
            outcome[name] = "ok"
        except Exception as exc:  # the query's failure is what the test reads
            outcome[name] = f"{type(exc).__name__}: {exc}"
            print(f"query {name} failed: {outcome[name]}", file=sys.stderr, flush=True)
    Path(spec["result"]).write_text(json.dumps(outcome, indent=1))
    spark.stop()
    return 0 if all(v == "ok" for v in outcome.values()) else QUERY_FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
