"""``make bench-metrics``: what the metrics cost a batch: ``twophase.files`` with and without
``twophase.attachMetrics`` (the listener, its log line and the Prometheus endpoint), in one run.

Rounds alternate the two on the same query (``twophase.sequence``, ``--rows`` rows in batches
of ``--rows-per-batch`` over ``--partitions`` partitions, ``trigger(availableNow=True)``), so
whatever drifts on the machine meets both. A batch's time is Spark's ``triggerExecution`` from
its progress; the listener reads each batch's figures on its own thread while the next batch
runs, so what it costs shows there. Every round with metrics must hand on the figures of each
of its batches (checked), and the endpoint is scraped once per round. Prints the median batch
time of each and their ratio (issue 30's budget: the metrics add less than 1 %), and writes
``bench/results/metrics.md``. Local disk only: no service is needed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench._common import REPO
from bench.files import fileStream


def session(master: str, partitions: int) -> Any:
    """A plain session: twophase registered, no UI (the files sink needs no connector)."""
    from pyspark.sql import SparkSession

    import twophase

    spark = (
        SparkSession.builder.master(master)
        .appName("twophase-bench-metrics")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    twophase.register(spark)
    return spark


def batchSeconds(
    spark: Any, work: Path, tag: str, args: argparse.Namespace, metrics: bool
) -> list[float]:
    """One query; each batch's ``triggerExecution`` in seconds. With ``metrics``, the listener
    and an endpoint are attached first and every batch's figures must arrive."""
    from prometheus_client import CollectorRegistry

    import twophase

    ckpt, out = work / f"{tag}-ckpt", work / f"{tag}-out"
    received: list[Any] = []
    listener = None
    if metrics:
        listener = twophase.attachMetrics(
            spark, str(ckpt), callback=received.append, port=0, registry=CollectorRegistry()
        )
    try:
        query = (
            fileStream(spark, args.rows, args.rows_per_batch, args.partitions, args.value_bytes)
            .writeStream.format("twophase.files")
            .option("path", str(out))
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        if listener is not None:
            last = max(p["batchId"] for p in progress)
            if not listener.awaitBatch(last, 60):
                raise SystemExit(f"the listener never reported batch {last}")
            reported = {m.batch.batchId for m in received if m.batch is not None}
            if reported != {p["batchId"] for p in progress}:
                raise SystemExit(f"figures of batches {sorted(reported)} only")
            url = f"http://127.0.0.1:{listener.port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as page:
                if b"twophase_rows_total" not in page.read():
                    raise SystemExit("the endpoint shows no twophase_rows_total")
    finally:
        if listener is not None:
            spark.streams.removeListener(listener)
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(ckpt, ignore_errors=True)
    return [p["durationMs"]["triggerExecution"] / 1000 for p in progress]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.metrics", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small run for development")
    p.add_argument("--rounds", type=int, help="rounds of each (default 5; --quick 2)")
    p.add_argument("--rows", type=int)
    p.add_argument("--rows-per-batch", type=int)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.rows = args.rows or (20_000 if args.quick else 400_000)
    args.rows_per_batch = args.rows_per_batch or (2_000 if args.quick else 10_000)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="twophase-bench-metrics-"))
    spark = session(args.master, args.partitions)
    times: dict[bool, list[float]] = {False: [], True: []}
    try:
        for metrics in (False, True):  # warm-up, not counted
            batchSeconds(spark, work, f"warm-{metrics}", args, metrics)
        for index in range(args.rounds):
            for metrics in (False, True) if index % 2 == 0 else (True, False):
                seconds = batchSeconds(spark, work, f"r{index}-{metrics}", args, metrics)
                times[metrics] += seconds
                label = "with metrics" if metrics else "without"
                print(f"round {index + 1}: {label}: median batch "
                      f"{statistics.median(seconds) * 1000:.1f} ms", flush=True)  # fmt: skip
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    plain, measured = statistics.median(times[False]), statistics.median(times[True])
    ratio = measured / plain
    lines = [
        "# What the metrics cost a batch",
        "",
        f"`twophase.files`, {args.rows:,} rows in batches of {args.rows_per_batch:,}, "
        f"{args.partitions} partitions, {args.rounds} alternating rounds of each, "
        f"{args.master}; batch time = Spark's triggerExecution.",
        "",
        "| | batches | median batch (ms) | mean batch (ms) |",
        "| --- | --- | --- | --- |",
        f"| without metrics | {len(times[False])} | {plain * 1000:.1f} | "
        f"{statistics.mean(times[False]) * 1000:.1f} |",
        f"| with `attachMetrics` (listener, log line, Prometheus) | {len(times[True])} | "
        f"{measured * 1000:.1f} | {statistics.mean(times[True]) * 1000:.1f} |",
        "",
        f"Ratio with / without: **{ratio:.4f}** ({(ratio - 1) * 100:+.2f} %; budget: +1 %). "
        f"Run in {time.perf_counter() - began:.0f} s.",
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
