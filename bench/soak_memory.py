"""``make soak-memory``: memory, open files and threads of every process over many micro-batches.

Per sink (``kafka``, ``postgres``, ``files``, ``multi`` = PostgreSQL + Kafka targets as
``bench.multi`` writes them) one streaming query runs ``--batches`` micro-batches of
``--rows-per-batch`` rows from Spark's JVM ``rate-micro-batch`` source (so every Python worker
of a task is the sink's), back to back (``processingTime`` 0), into ``twophase.<sink>`` via
``format()``. Every ``--every`` batches (polling ``query.lastProgress``) it records, by role,
the RSS, open file descriptors and threads of: this Python driver, the JVM, the driver-side
Python workers (Spark's planner and commit runners) and the executors' Python workers (the
tasks'); in local mode all are descendants of this process, told apart by command line.
Beside the JVM's RSS, its heap as it reports it: committed, the old generation after the last
collection that reached it (the live data a leak would grow) and non-heap, so a JVM whose RSS
rose can be told apart from one that only committed more of its heap.
Workers are reused and may be replaced, so a role is the sum over its processes, with the
largest single process beside it. Prints a table per sink and, per role, the growth from batch
``--baseline`` (100) to the end against the 10% goal.

``--big-batch``: one task (``numPartitions`` 1) writes one batch of ``--big-rows`` rows (``id``
bigint, ``payload`` padded to ``--row-bytes``) into files and PostgreSQL while the executor
Python workers' RSS is sampled at 20 Hz; prints the writer's peak RSS against the batch's
Arrow size (``pa.Table.nbytes`` of the same rows).

Writes ``bench/results/soak-memory.json``. Needs PostgreSQL and Kafka (``make services``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from bench import kafka as kb
from bench import postgres as pb
from bench._common import REPO, bootstrapServers, classify, markdownTable, pgUrl, sampling
from bench.files import committedFileRows
from bench.multi import ORDERS
from bench.session import benchSession, log

SINKS = ("kafka", "postgres", "files", "multi")
ROLES = ("driver", "jvm", "driverWorkers", "workers")
ROLE_TITLES = {
    "driver": "Python driver",
    "jvm": "JVM",
    "driverWorkers": "driver-side Python workers",
    "workers": "executor Python workers",
}
DRIVER_SIDE = ("pyspark.sql.worker.", "pyspark.sql.streaming.")
"""Command-line parts of the Python workers Spark runs for the driver (planning, commits)."""
MIB = 1024 * 1024


def role(cmdline: Sequence[str], isRoot: bool) -> str | None:
    """The role of a process in this tree; None for what is neither Spark nor PySpark."""
    kind = classify(cmdline, isRoot)
    if kind != "workers":
        return kind
    if not any("pyspark" in part for part in cmdline):
        return None
    return "driverWorkers" if any(m in part for part in cmdline for m in DRIVER_SIDE) else "workers"


def processes() -> Iterator[tuple[str, Any]]:
    """(role, psutil.Process) for this process and every Spark/PySpark descendant."""
    import psutil

    top = psutil.Process(os.getpid())
    for proc in [top, *top.children(recursive=True)]:
        try:
            kind = role(proc.cmdline(), proc.pid == top.pid)
        except psutil.Error:
            continue
        if kind is not None:
            yield kind, proc


def sampleRoles() -> dict[str, dict[str, float]]:
    """Per role: summed RSS (MiB), fds and threads, the largest single RSS and the process count."""
    import psutil

    out = {r: {"rss": 0.0, "fds": 0, "threads": 0, "rssMax": 0.0, "procs": 0} for r in ROLES}
    for kind, proc in processes():
        try:
            with proc.oneshot():
                rss, fds, threads = proc.memory_info().rss / MIB, proc.num_fds(), proc.num_threads()
        except psutil.Error:
            continue
        cell = out[kind]
        cell["rss"] += rss
        cell["fds"] += fds
        cell["threads"] += threads
        cell["rssMax"] = max(cell["rssMax"], rss)
        cell["procs"] += 1
    return out


def rateFrame(spark: Any, rows: int, partitions: int, valueBytes: int) -> Any:
    """``id``, ``payload`` (``row-<id>`` padded) from the JVM source, ``rows`` per batch."""
    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows)
        .option("numPartitions", partitions)
        .option("startTimestamp", 0)
        .load()
        .selectExpr("value AS id", f"rpad(concat('row-', value), {valueBytes}, '.') AS payload")
    )


def sinkWriter(frame: Any, sink: str, where: dict[str, str]) -> Any:
    """``frame`` into ``twophase.<sink>`` in the shape ``make bench`` writes that sink."""
    from pyspark.sql import functions as F

    kafka = frame.selectExpr("cast(id as string) AS key", "payload AS value")
    if sink == "kafka":
        return (
            kafka.writeStream.format("twophase.kafka")
            .option("kafka.bootstrap.servers", where["bootstrap"])
            .option("topic", where["topic"])
        )
    if sink == "postgres":
        return (
            frame.selectExpr(*pb.COLUMNS)
            .writeStream.format("twophase.postgres")
            .option("url", where["url"])
            .option("table", where["table"])
            .option("createTable", "true")
        )
    if sink == "files":
        return (
            frame.writeStream.format("twophase.files")
            .option("path", where["path"])
            .option("format", "parquet")
        )
    orders = frame.selectExpr(*ORDERS)
    return (
        orders.select(
            F.struct("order_id", "status", "amount").alias("orders"),
            F.struct(
                F.col("order_id").cast("string").alias("key"),
                F.to_json(F.struct("*")).alias("value"),
            ).alias("events"),
        )
        .writeStream.format("twophase.multi")
        .option("targets", "orders=postgres,events=kafka")
        .option("orders.url", where["url"])
        .option("orders.table", where["table"])
        .option("orders.createTable", "true")
        .option("events.kafka.bootstrap.servers", where["bootstrap"])
        .option("events.topic", where["topic"])
    )


def soak(spark: Any, sink: str, where: dict[str, str], args: Any) -> list[dict[str, Any]]:
    """One query of ``args.batches`` batches; a sample by role every ``args.every`` batches."""
    frame = rateFrame(spark, args.rows_per_batch, args.partitions, args.value_bytes)
    query = (
        sinkWriter(frame, sink, where)
        .option("checkpointLocation", where["ckpt"])
        .trigger(processingTime="0 seconds")
        .start()
    )
    rows: list[dict[str, Any]] = []
    mark, started = args.every, time.perf_counter()
    try:
        while mark <= args.batches:
            if query.exception() is not None:
                raise SystemExit(f"{sink}: query failed: {query.exception()}")
            progress = query.lastProgress
            done = int(progress["batchId"]) + 1 if progress else 0
            if done < mark:
                time.sleep(0.05)
                continue
            rows.append(
                {
                    "batch": done,
                    "seconds": time.perf_counter() - started,
                    **sampleRoles(),
                    "heap": jvmHeap(spark),
                }
            )
            log(f"  {sink}: batch {done}, {fmtRole(rows[-1]['workers'])} in executor workers")
            while mark <= done:
                mark += args.every
    finally:
        query.stop()
    return rows


def jvmHeap(spark: Any) -> dict[str, float]:
    """The JVM's heap as it reports it, MiB: committed, used now, the old generation after the
    last collection that reached it (live data: what a leak makes grow), and non-heap used."""
    mib = 1024 * 1024
    management = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    heap = management.getMemoryMXBean().getHeapMemoryUsage()
    nonHeap = management.getMemoryMXBean().getNonHeapMemoryUsage()
    old = float("nan")
    for pool in management.getMemoryPoolMXBeans():
        after = pool.getCollectionUsage()
        if "Old Gen" in pool.getName() and after is not None:
            old = after.getUsed() / mib
    return {
        "committed": heap.getCommitted() / mib,
        "used": heap.getUsed() / mib,
        "oldAfterGc": old,
        "nonHeap": nonHeap.getUsed() / mib,
    }


def fmtHeap(cell: dict[str, float]) -> str:
    return f"{cell['committed']:.0f}/{cell['oldAfterGc']:.0f}/{cell['nonHeap']:.0f}"


def fmtRole(cell: dict[str, float]) -> str:
    return f"{cell['rss']:.1f}/{int(cell['fds'])}/{int(cell['threads'])}"


def growth(first: float, last: float) -> float:
    return (last - first) / first * 100 if first else float("nan")


def verdicts(rows: list[dict[str, Any]], baseline: int, limit: float) -> list[dict[str, Any]]:
    """Per role: growth in % of RSS, fds and threads from the first sample at ``baseline``."""
    base = next((r for r in rows if r["batch"] >= baseline), rows[0])
    last = rows[-1]
    out = []
    for r in ROLES:
        grow = {k: growth(base[r][k], last[r][k]) for k in ("rss", "fds", "threads", "rssMax")}
        flat = all(not (g > limit) for k, g in grow.items() if k != "rssMax")
        out.append({"role": r, "from": base["batch"], "to": last["batch"], **grow, "flat": flat})
    return out


def printSoak(sink: str, rows: list[dict[str, Any]], checks: list[dict[str, Any]]) -> None:
    header = ["batch", "s"]
    for r in ROLES:
        header += [f"{ROLE_TITLES[r]} MiB/fds/thr"]
        if r in ("driverWorkers", "workers"):
            header += ["max MiB", "procs"]
        if r == "jvm":
            header += ["JVM heap committed / old gen after GC / non-heap MiB"]
    table = []
    for row in rows:
        cells = [str(row["batch"]), f"{row['seconds']:.0f}"]
        for r in ROLES:
            cells.append(fmtRole(row[r]))
            if r in ("driverWorkers", "workers"):
                cells += [f"{row[r]['rssMax']:.1f}", str(int(row[r]["procs"]))]
            if r == "jvm":
                cells.append(fmtHeap(row["heap"]) if "heap" in row else "-")
        table.append(cells)
    print(f"\n### {sink}\n")
    print(markdownTable(header, table))
    print()
    for c in checks:
        mark = "under" if c["flat"] else "OVER"
        print(
            f"{ROLE_TITLES[c['role']]}: batch {c['from']} -> {c['to']}: RSS {c['rss']:+.1f}%, "
            f"fds {c['fds']:+.1f}%, threads {c['threads']:+.1f}% "
            f"(largest process {c['rssMax']:+.1f}%): {mark} 10%"
        )
    base = next((r for r in rows if r["batch"] >= checks[0]["from"]), rows[0]) if checks else None
    if base is not None and "heap" in base:
        first, last = base["heap"], rows[-1]["heap"]
        print(
            f"JVM heap: batch {base['batch']} -> {rows[-1]['batch']}: committed "
            f"{first['committed']:.0f} -> {last['committed']:.0f} MiB, old gen after GC "
            f"{first['oldAfterGc']:.0f} -> {last['oldAfterGc']:.0f} MiB, non-heap "
            f"{first['nonHeap']:.0f} -> {last['nonHeap']:.0f} MiB"
        )
    print(flush=True)


def workerRss() -> dict[int, float]:
    """RSS (MiB) of each executor Python worker, by pid."""
    import psutil

    rss = {}
    for kind, proc in processes():
        with suppress(psutil.Error):
            if kind == "workers":
                rss[proc.pid] = proc.memory_info().rss / MIB
    return rss


@contextmanager
def workerPeaks(interval: float = 0.05) -> Iterator[dict[int, float]]:
    """Peak RSS (MiB) of each executor Python worker, by pid, sampled every ``interval`` s."""
    peaks: dict[int, float] = {}

    def sample() -> None:
        for pid, rss in workerRss().items():
            peaks[pid] = max(peaks.get(pid, 0.0), rss)

    with sampling(sample, interval, "soak-worker-peaks"):
        yield peaks


def arrowBytes(rows: int, rowBytes: int) -> int:
    """``pa.Table.nbytes`` of the big batch's rows, built as Spark builds them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = pa.array(range(rows), pa.int64())
    payload = pc.utf8_rpad(
        pc.binary_join_element_wise("row-", pc.cast(ids, pa.string()), ""), rowBytes, "."
    )
    return int(pa.table({"id": ids, "payload": payload}).nbytes)


def bigBatch(
    spark: Any, work: Path, url: str, tables: list[str], args: Any
) -> list[dict[str, Any]]:
    """One batch of ``args.big_rows`` rows in one task into files and PostgreSQL; worker peaks."""
    out = []
    for sink in ("files", "postgres"):
        for rows in (1000, args.big_rows):  # a small batch first: the worker exists and is warm
            tag = f"big-{sink}-{rows}"
            where = {"path": str(work / tag), "url": url, "table": f"soak_{tag.replace('-', '_')}"}
            tables.append(where["table"])
            frame = rateFrame(spark, rows, 1, args.row_bytes)
            writer = sinkWriter(frame, sink, where) if sink == "files" else (
                frame.writeStream.format("twophase.postgres").option("url", url)
                .option("table", where["table"]).option("createTable", "true")
            )  # fmt: skip
            before = workerRss()
            with workerPeaks() as peaks:
                started = time.perf_counter()
                query = (
                    writer.option("checkpointLocation", str(work / f"{tag}-c"))
                    .trigger(once=True)
                    .start()
                )
                query.awaitTermination()
                seconds = time.perf_counter() - started
            if query.exception() is not None:
                raise SystemExit(f"{tag}: query failed: {query.exception()}")
            seen = sum(int(p["numInputRows"]) for p in query.recentProgress)
            if rows == args.big_rows:
                pid = max(peaks, key=lambda k: peaks[k])  # the writer: the largest worker
                out.append({"sink": sink, "rows": seen, "seconds": seconds, "pid": pid,
                            "before": before.get(pid), "peak": peaks[pid]})  # fmt: skip
                log(f"  big batch {sink}: {seen:,} rows in {seconds:.1f} s")
    return out


def printBig(big: list[dict[str, Any]], arrow: int, args: Any) -> None:
    print(f"\n### One batch of {args.big_rows:,} rows ({args.row_bytes}-byte payloads), one task\n")
    header = ["sink", "rows", "s", "writer RSS before MiB", "peak MiB", "peak - before MiB",
              "Arrow MiB", "peak / Arrow", "(peak - before) / Arrow"]  # fmt: skip
    table = []
    for b in big:
        before = b["before"]
        grew = b["peak"] - before if before is not None else float("nan")
        table.append([b["sink"], f"{b['rows']:,}", f"{b['seconds']:.1f}",
                      "new process" if before is None else f"{before:.1f}", f"{b['peak']:.1f}",
                      f"{grew:.1f}", f"{arrow / MIB:.1f}", f"{b['peak'] * MIB / arrow:.2f}",
                      f"{grew * MIB / arrow:.3f}"])  # fmt: skip
    print(markdownTable(header, table), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.soak_memory", description=__doc__)
    p.add_argument("--sinks", default=",".join(SINKS), help="comma-separated; '' for none")
    p.add_argument("--batches", type=int, default=1000)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--baseline", type=int, default=100, help="growth is measured from here")
    p.add_argument("--rows-per-batch", type=int, default=1000)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--value-bytes", type=int, default=200)
    p.add_argument("--big-batch", action="store_true", help="also the one-batch peak")
    p.add_argument("--big-rows", type=int, default=1_000_000)
    p.add_argument("--row-bytes", type=int, default=200)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = p.parse_args(argv)
    sinks = [s for s in args.sinks.split(",") if s]
    if unknown := set(sinks) - set(SINKS):
        raise SystemExit(f"unknown sinks {sorted(unknown)}; choose from {SINKS}")
    url, bootstrap = pgUrl(), bootstrapServers()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "WARNING")
    outDir = Path(args.out)
    outDir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"began": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                              "args": vars(args), "sinks": {}}  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="twophase-soak-"))
    spark = benchSession(args.master, args.partitions)
    tables: list[str] = []
    topics: list[str] = []
    try:
        for sink in sinks:
            tag = f"soak_{sink}"
            where = {"url": url, "bootstrap": bootstrap, "table": tag, "path": str(work / tag),
                     "ckpt": str(work / f"{tag}-c")}  # fmt: skip
            if sink in ("kafka", "multi"):
                where["topic"] = kb.createTopic(bootstrap, args.partitions, tag)
                topics.append(where["topic"])
            if sink in ("postgres", "multi"):
                pb.dropTables(url, [tag])
                tables.append(tag)
            log(f"{sink}: {args.batches:,} batches of {args.rows_per_batch:,} rows, "
                f"{args.partitions} partitions, a sample every {args.every}")  # fmt: skip
            rows = soak(spark, sink, where, args)
            checks = verdicts(rows, args.baseline, 10.0)
            visible = visibleRows(sink, where)
            report["sinks"][sink] = {"rows": rows, "verdicts": checks, "visibleRows": visible}
            printSoak(sink, rows, checks)
            print(f"{sink}: {visible:,} rows visible after {rows[-1]['batch']} batches "
                  f"(query stopped after its last sample)\n", flush=True)  # fmt: skip
            writeReport(outDir, report)
        if args.big_batch:
            arrow = arrowBytes(args.big_rows, args.row_bytes)
            big = bigBatch(spark, work, url, tables, args)
            report["bigBatch"] = {"arrowBytes": arrow, "runs": big}
            printBig(big, arrow, args)
            writeReport(outDir, report)
        return 0
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
        if topics:
            kb.deleteTopics(bootstrap, topics)
        pb.dropTables(url, tables)


def visibleRows(sink: str, where: dict[str, str]) -> int:
    """Rows a reader of committed data sees in the sink's first target."""
    if sink == "kafka":
        return kb.countRecords(where["bootstrap"], where["topic"])
    if sink == "files":
        return committedFileRows(where["path"])
    return pb.countRows(where["url"], where["table"])


def writeReport(outDir: Path, report: dict[str, Any]) -> None:
    path = outDir / "soak-memory.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    log(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
