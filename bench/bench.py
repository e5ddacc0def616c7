"""``make bench``: every sink side by side, in one run, on the same rows.

For each target (files, PostgreSQL, Kafka) the same rows (``id`` 0..N-1, ``payload``
``row-<id>``) are written four ways:

- twophase: ``twophase.files`` (Parquet), ``twophase.postgres``, ``twophase.kafka`` (exactly-once);
- Spark's own path: the Parquet file sink (exactly-once), JDBC in ``foreachBatch``
  (at-least-once), the Kafka sink (at-least-once);
- PyFlink exactly-once (``bench/flink_jobs.py`` in its own venv): FileSink (CSV), the JDBC XA
  sink, KafkaSink with ``EXACTLY_ONCE``; checkpoint interval = twophase's measured batch time;
- the raw client alone: pyarrow Parquet write, psycopg ``COPY``, a confluent-kafka producer.

Spark runs use one streaming query shape (``twophase.sequence``, ``--rows-per-batch``,
``--partitions``, ``trigger(availableNow=True)``), each path warmed up first on a small run.
Files and Kafka rows carry ``payload`` padded to ``--value-bytes``; PostgreSQL rows are
``bench.postgres``'s ``(id, payload, value, ts)``. Then: driver commit time per batch of each
twophase sink (decision log, as ``twophase status --checkpoint`` reports it), end-to-end
latency at a fixed input rate (Spark's ``rate`` source into ``twophase.kafka`` and
``twophase.files``; a read_committed consumer / a directory poller records the time from a
row's creation timestamp to the moment it is first visible), peak memory (RSS sampled over the
process tree) and, with ``--sweep``, throughput and commit time against rows per batch and
partitions.

Writes ``bench/results/bench.md``, ``bench.csv`` and ``bench.png``; prints the Markdown.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import kafka as kb
from bench import postgres as pb
from bench._common import (
    REPO,
    bootstrapServers,
    commitPercentiles,
    fmtNumber,
    pgUrl,
    sampleMemory,
)
from bench.files import committedFileRows, flinkFileRows, writeFiles, writeParquetRaw
from bench.flink import flinkJars, flinkPython, runFlink
from bench.latency import latencyFiles, latencyKafka
from bench.measures import (
    PATHS,
    TARGET_TITLES,
    TARGETS,
    Measure,
    Profile,
)
from bench.session import benchSession, cacheDir, log
from bench.tables import report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small run for development")
    p.add_argument("--rows", type=int)
    p.add_argument("--rows-per-batch", type=int)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--sweep", action="store_true", help="also vary rows/batch and partitions")
    p.add_argument("--no-flink", action="store_true", help="skip the PyFlink jobs")
    p.add_argument("--master", default="local[*]")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args(argv)
    quick = args.quick
    prof = Profile(
        rows=args.rows or (100_000 if quick else 1_000_000),
        rowsPerBatch=args.rows_per_batch or (25_000 if quick else 125_000),
        partitions=args.partitions,
        valueBytes=args.value_bytes,
        latencyRate=1000 if quick else 2000,
        latencySeconds=10 if quick else 20,
        sweepRows=100_000 if quick else 200_000,
    )
    began = time.perf_counter()
    url, bootstrap = pgUrl(), bootstrapServers()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="twophase-bench-"))
    cache = cacheDir()
    measures = {(t, p): Measure(t, p) for t in TARGETS for p in PATHS}

    flinkReason = "skipped (--no-flink)" if args.no_flink else ""
    python: Path | None = None
    jars: list[str] = []
    if not args.no_flink:
        try:
            python = flinkPython(cache)
            jars = flinkJars(cache, python)
        except (subprocess.CalledProcessError, OSError) as exc:
            flinkReason = f"PyFlink set-up failed: {exc}"[:200]

    spark = benchSession(args.master, prof.partitions)
    tables = {k: f"bench_all_{k}" for k in ("twophase", "spark", "flink", "raw", "wa", "wb", "wf")}
    topics = {
        k: kb.createTopic(bootstrap, prof.partitions, k)
        for k in ("twophase", "spark", "flink", "raw", "wa", "wb", "wf")
    }
    kshape = kb.Shape(prof.rows, prof.rowsPerBatch, prof.partitions, prof.valueBytes)
    shape = (prof.rows, prof.rowsPerBatch, prof.partitions)
    commit: dict[str, tuple[float, float, int]] = {}
    try:
        for name in tables.values():
            pb.resetTable(url, name)
        warm = max(prof.partitions * 1000, 10_000)
        log(f"warming up every Spark path ({warm:,} rows each)")
        for fmt in ("twophase.files", "parquet"):
            writeFiles(spark, fmt, str(work / f"warm-{fmt}"), str(work / f"warm-{fmt}-c"),
                       warm, warm, prof.partitions, prof.valueBytes)  # fmt: skip
        pb.runTwophase(spark, url, tables["wa"], str(work / "wpa"), warm, warm, prof.partitions)
        pb.runJdbc(spark, url, tables["wb"], str(work / "wpb"), warm, warm, prof.partitions)
        kb.writeKafka(
            spark, "twophase.kafka", bootstrap, topics["wa"], str(work / "wka"), kshape, warm
        )
        kb.writeKafka(spark, "kafka", bootstrap, topics["wb"], str(work / "wkb"), kshape, warm)

        log(f"measuring {prof.rows:,} rows, batches of {prof.rowsPerBatch:,}, "
            f"{prof.partitions} partitions, {prof.valueBytes}-byte payloads")  # fmt: skip
        sparkRuns: dict[tuple[str, str], Callable[[], float]] = {
            ("files", "twophase"): lambda: writeFiles(
                spark, "twophase.files", str(work / "f-tp"), str(work / "c-f-tp"), *shape,
                prof.valueBytes),
            ("files", "spark"): lambda: writeFiles(
                spark, "parquet", str(work / "f-sp"), str(work / "c-f-sp"), *shape,
                prof.valueBytes),
            ("files", "raw"): lambda: writeParquetRaw(
                str(work / "f-raw"), prof.rows, prof.valueBytes),
            ("postgres", "twophase"): lambda: pb.runTwophase(
                spark, url, tables["twophase"], str(work / "c-p-tp"), *shape),
            ("postgres", "spark"): lambda: pb.runJdbc(
                spark, url, tables["spark"], str(work / "c-p-sp"), *shape),
            ("postgres", "raw"): lambda: pb.runCopy(url, tables["raw"], prof.rows),
            ("kafka", "twophase"): lambda: kb.writeKafka(
                spark, "twophase.kafka", bootstrap, topics["twophase"], str(work / "c-k-tp"),
                kshape),
            ("kafka", "spark"): lambda: kb.writeKafka(
                spark, "kafka", bootstrap, topics["spark"], str(work / "c-k-sp"), kshape),
            ("kafka", "raw"): lambda: kb.writeRaw(bootstrap, topics["raw"], kshape),
        }  # fmt: skip
        visible: dict[tuple[str, str], Callable[[], int]] = {
            ("files", "twophase"): lambda: committedFileRows(str(work / "f-tp")),
            ("files", "spark"): lambda: committedFileRows(str(work / "f-sp")),
            ("files", "raw"): lambda: committedFileRows(str(work / "f-raw")),
            ("postgres", "twophase"): lambda: pb.countRows(url, tables["twophase"]),
            ("postgres", "spark"): lambda: pb.countRows(url, tables["spark"]),
            ("postgres", "raw"): lambda: pb.countRows(url, tables["raw"]),
            ("postgres", "flink"): lambda: pb.countRows(url, tables["flink"]),
            ("kafka", "twophase"): lambda: kb.countRecords(bootstrap, topics["twophase"]),
            ("kafka", "spark"): lambda: kb.countRecords(bootstrap, topics["spark"]),
            ("kafka", "raw"): lambda: kb.countRecords(bootstrap, topics["raw"]),
            ("kafka", "flink"): lambda: kb.countRecords(bootstrap, topics["flink"]),
            ("files", "flink"): lambda: flinkFileRows(str(work / "f-fl")),
        }
        jdbcUrl, jdbcProps = pb.jdbcTarget(url)
        flinkExtra = {
            "files": ["--value-bytes", str(prof.valueBytes)],
            "kafka": ["--value-bytes", str(prof.valueBytes), "--bootstrap", bootstrap],
            "postgres": ["--jdbc-url", jdbcUrl, "--jdbc-user", jdbcProps["user"],
                         "--jdbc-password", jdbcProps.get("password", "")],
        }  # fmt: skip
        flinkTargets = {
            "files": (str(work / "f-fl"), str(work / "f-fl-warm")),
            "kafka": (topics["flink"], topics["wf"]),
            "postgres": (tables["flink"], tables["wf"]),
        }
        batches = -(-prof.rows // prof.rowsPerBatch)
        for target in TARGETS:
            for path in ("spark", "twophase", "raw"):
                m = measures[(target, path)]
                rawOnly = path == "raw"
                with sampleMemory(children=not rawOnly) as peaks:
                    m.seconds = sparkRuns[(target, path)]()
                m.memory, m.rows = peaks, visible[(target, path)]()
                if rawOnly:
                    m.note = "driver process alone, outside Spark"
                log(f"  {target} {path}: {m.seconds:.1f} s, {m.rows:,} rows visible")
            commit[target] = commitPercentiles(str(work / f"c-{target[0]}-tp"))
            m = measures[(target, "flink")]
            if python is None:
                m.note = f"not measured: {flinkReason}"
                continue
            # A checkpoint as often as twophase commits a batch of the same rows.
            tp = measures[(target, "twophase")]
            checkpointMs = max(200, int(tp.seconds / batches * 1000))
            dest, warmDest = flinkTargets[target]
            try:
                m.seconds, m.memory = runFlink(
                    python, jars, "jdbc" if target == "postgres" else target, prof.rows,
                    prof.partitions, checkpointMs, dest, warmDest, flinkExtra[target],
                    out / f"flink-{target}.log",
                )  # fmt: skip
                m.rows = visible[(target, "flink")]()
                m.note = f"checkpoint every {checkpointMs} ms; parallelism {prof.partitions}"
                if m.rows != prof.rows:
                    m.note += f"; {m.rows:,} rows visible, expected {prof.rows:,}"
                log(f"  {target} flink: {m.seconds:.1f} s, {m.rows:,} rows visible")
            except (RuntimeError, ValueError, OSError) as exc:
                m.seconds, m.rows = float("nan"), 0
                m.note = f"not measured: {exc}"
                log(f"  {target} flink: {m.note}")
        for target in TARGETS:
            for path in PATHS:
                m = measures[(target, path)]
                if m.rows and m.rows != prof.rows and not (target == "kafka" and path == "spark"):
                    m.note = (m.note + f"; WRONG COUNT {m.rows:,}").strip("; ")

        log(f"latency: rate source at {prof.latencyRate} rows/s for {prof.latencySeconds} s, "
            "trigger 1 s")  # fmt: skip
        latency = {
            "kafka": latencyKafka(spark, bootstrap, work, prof.latencyRate, prof.latencySeconds),
            "files": latencyFiles(spark, work, prof.latencyRate, prof.latencySeconds),
        }
        sweep: list[list[str]] = []
        if args.sweep:
            sweep = runSweep(spark, bootstrap, work, prof)
        report(out, prof, measures, commit, latency, sweep, spark.version,
               time.perf_counter() - began, args)  # fmt: skip
        return 0
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
        kb.deleteTopics(bootstrap, list(topics.values()))
        pb.dropTables(url, list(tables.values()))


def runSweep(spark: Any, bootstrap: str, work: Path, prof: Profile) -> list[list[str]]:
    """twophase files and kafka: rows/s and commit p50/p95 vs rows per batch and partitions."""
    rows = prof.sweepRows
    points = [(rows // 16, 8), (rows // 4, 8), (rows, 8), (rows // 4, 2), (rows // 4, 4)]
    table = []
    for target in ("files", "kafka"):
        for per, parts in points:
            tag = f"s-{target}-{per}-{parts}"
            if target == "files":
                ckpt = str(work / f"{tag}-c")
                seconds = writeFiles(
                    spark, "twophase.files", str(work / tag), ckpt, rows, per, parts,
                    prof.valueBytes)  # fmt: skip
            else:
                topic = kb.createTopic(bootstrap, 8, "sweep")
                shape = kb.Shape(rows, per, parts, prof.valueBytes)
                seconds = kb.writeKafka(
                    spark, "twophase.kafka", bootstrap, topic, str(work / f"{tag}-c"), shape
                )
                kb.deleteTopics(bootstrap, [topic])
            p50, p95, n = commitPercentiles(str(work / f"{tag}-c"))
            batchMs = seconds / max(n, 1) * 1000
            table.append([
                TARGET_TITLES[target], fmtNumber(per), str(parts), str(n),
                fmtNumber(rows / seconds),
                fmtNumber(p50), fmtNumber(p95), fmtNumber(batchMs), fmtNumber(p50 / batchMs, 3),
            ])  # fmt: skip
            log(f"  sweep {target} batch {per:,} x {parts} partitions: {seconds:.1f} s")
    return table


if __name__ == "__main__":
    raise SystemExit(main())
