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
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench import kafka as kb
from bench import postgres as pb
from bench._common import (
    REPO,
    MemoryPeaks,
    bootstrapServers,
    commitPercentiles,
    fmtNumber,
    markdownTable,
    percentiles,
    pgUrl,
    ratio,
    sampleMemory,
    sequenceStream,
    writeCsv,
)

FLINK_VERSION = "1.20.3"
FLINK_DIR = REPO / "bench" / "flink"
TARGETS = ("files", "postgres", "kafka")
TARGET_TITLES = {"files": "files", "postgres": "PostgreSQL", "kafka": "Kafka"}
PATHS = ("twophase", "spark", "flink", "raw")
PATH_TITLES = {
    "twophase": "twophase (exactly-once)",
    "spark": "Spark's own",
    "flink": "PyFlink exactly-once",
    "raw": "raw client",
}
SPARK_PATH = {
    "files": "Spark Parquet file sink (exactly-once)",
    "postgres": "Spark JDBC in foreachBatch (at-least-once)",
    "kafka": "Spark Kafka sink (at-least-once)",
}
FLINK_PATH = {
    "files": "Flink FileSink via SQL filesystem, CSV (exactly-once)",
    "postgres": "Flink JdbcSink.buildExactlyOnce, XA (exactly-once)",
    "kafka": "Flink KafkaSink, EXACTLY_ONCE (exactly-once)",
}
RAW_PATH = {
    "files": "pyarrow Parquet write",
    "postgres": "psycopg COPY",
    "kafka": "confluent-kafka transactional producer",
}
TWOPHASE_PATH = {
    "files": "twophase.files, Parquet",
    "postgres": "twophase.postgres",
    "kafka": "twophase.kafka",
}
# twophase / peer >= goal
GOALS = {"spark": 0.9, "flink": 1.0, "raw": 0.7}
COMMIT_GOAL_MS = {"files": 50.0, "postgres": 50.0, "kafka": 100.0}
MIB = 1024 * 1024


@dataclass
class Measure:
    target: str
    path: str
    rows: int = 0
    seconds: float = float("nan")
    memory: MemoryPeaks = field(default_factory=MemoryPeaks)
    note: str = ""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.rows and self.seconds > 0 else float("nan")


@dataclass
class Profile:
    rows: int
    rowsPerBatch: int
    partitions: int
    valueBytes: int
    latencyRate: int
    latencySeconds: int
    sweepRows: int


def cacheDir() -> Path:
    path = Path(os.environ.get("TWOPHASE_CACHE", Path.home() / ".cache" / "twophase"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# ---------------------------------------------------------------------------------------------
# PyFlink: its own venv and jars, cached


def flinkPython(cache: Path) -> Path:
    """The interpreter of a venv with apache-flink, created once in the cache."""
    venv = cache / "flink-venv"
    marker = venv / f".installed-{FLINK_VERSION}"
    if not marker.is_file():
        log(f"creating {venv} with apache-flink=={FLINK_VERSION} (once; a few minutes)")
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, f"apache-flink=={FLINK_VERSION}"], check=True)
        marker.touch()
    return venv / "bin" / "python"


def flinkJars(cache: Path, python: Path) -> list[str]:
    """Connector jars from Maven Central (bench/flink/pom.xml) plus the compiled helper."""
    pom = FLINK_DIR / "pom.xml"
    java = FLINK_DIR / "src" / "io" / "twophase" / "bench" / "BenchJdbc.java"
    digest = hashlib.sha1(pom.read_bytes() + java.read_bytes()).hexdigest()[:10]
    jars = cache / f"flink-jars-{digest}"
    helper = jars / "twophase-bench-jdbc.jar"
    if not helper.is_file():
        log(f"resolving Flink connector jars into {jars} (once)")
        shutil.rmtree(jars, ignore_errors=True)
        mvn = ["mvn", "-q", "-f", str(pom), "dependency:copy-dependencies"]
        args = ["-DincludeScope=runtime", f"-DoutputDirectory={jars}"]
        subprocess.run([*mvn, *args], check=True)
        site = subprocess.run(
            [str(python), "-c", "import pyflink, os; print(os.path.dirname(pyflink.__file__))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        classes = Path(tempfile.mkdtemp(prefix="bench-jdbc-"))
        classpath = f"{jars}/*:{site}/lib/*"
        subprocess.run(["javac", "-d", str(classes), "-cp", classpath, str(java)], check=True)
        subprocess.run(["jar", "cf", str(helper), "-C", str(classes), "."], check=True)
        shutil.rmtree(classes, ignore_errors=True)
    # Flink's own slf4j binding is in its lib/; a second slf4j-api would only add noise.
    return sorted(str(j) for j in jars.glob("*.jar") if not j.name.startswith("slf4j-api"))


def runFlink(
    python: Path, jars: list[str], job: str, rows: int, parallelism: int, checkpointMs: int,
    target: str, warmTarget: str, extra: list[str], logFile: Path,
) -> tuple[float, MemoryPeaks]:  # fmt: skip
    command = [
        str(python), str(REPO / "bench" / "flink_jobs.py"), job, "--rows", str(rows),
        "--parallelism", str(parallelism), "--checkpoint-ms", str(checkpointMs),
        "--jars", ",".join(jars), "--target", target, "--warm-target", warmTarget, *extra,
    ]  # fmt: skip
    with logFile.open("w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
        with sampleMemory(proc.pid) as peaks:
            try:
                out, _ = proc.communicate(timeout=900)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise RuntimeError("timed out after 900 s") from None
    if proc.returncode != 0:
        lines = [
            line.strip()
            for line in logFile.read_text(errors="replace").splitlines()
            if "Exception" in line or "Error" in line
        ]
        raise RuntimeError((lines[-1] if lines else f"exit {proc.returncode}")[:200])
    result = json.loads(out.strip().splitlines()[-1])
    return float(result["seconds"]), peaks


# ---------------------------------------------------------------------------------------------
# files


def fileStream(spark: Any, rows: int, per: int, parts: int, valueBytes: int) -> Any:
    return sequenceStream(
        spark, rows, per, parts, "id", f"rpad(payload, {valueBytes}, '.') AS payload"
    )


def writeFiles(
    spark: Any, fmt: str, path: str, ckpt: str, rows: int, per: int, parts: int, valueBytes: int
) -> float:
    writer = (
        fileStream(spark, rows, per, parts, valueBytes)
        .writeStream.format(fmt)
        .option("path", path)
        .option("checkpointLocation", ckpt)
    )
    if fmt == "twophase.files":
        writer = writer.option("format", "parquet")
    return kb.runQuery(writer)


def committedFileRows(path: str) -> int:
    """Rows in the visible Parquet files (not staging, not hidden), as a reader sees them."""
    files = [
        p
        for p in Path(path).rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts)
    ]
    return sum(pq.ParquetFile(p).metadata.num_rows for p in files)


def writeParquetRaw(path: str, rows: int, valueBytes: int, chunk: int = 250_000) -> float:
    """One pyarrow ParquetWriter (snappy), the same rows in chunks: the library alone."""
    from twophase.sources.sequence import sequenceRows

    Path(path).mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    schema = pa.schema([("id", pa.int64()), ("payload", pa.string())])
    with pq.ParquetWriter(f"{path}/part-0.parquet", schema, compression="snappy") as writer:
        for start in range(0, rows, chunk):
            batch = sequenceRows(start, min(rows, start + chunk))
            padded = pc.utf8_rpad(batch.column("payload"), valueBytes, ".")
            writer.write_batch(pa.record_batch([batch.column("id"), padded], schema=schema))
    return time.perf_counter() - started


def flinkFileRows(path: str) -> int:
    total = 0
    for p in Path(path).rglob("*"):
        if p.is_file() and not p.name.startswith((".", "_")):
            with p.open("rb") as handle:
                total += sum(1 for _ in handle)
    return total


# ---------------------------------------------------------------------------------------------
# end-to-end latency


def rateQuery(
    spark: Any, rate: int, seconds: int, columns: list[str], fmt: str, options: dict[str, str],
    poll: Callable[[threading.Event], None],
) -> None:  # fmt: skip
    """Run ``rate`` source -> ``fmt`` sink for ``seconds`` (trigger 1 s) while ``poll`` runs."""
    stop = threading.Event()
    thread = threading.Thread(target=poll, args=(stop,), name="bench-latency", daemon=True)
    thread.start()
    try:
        writer = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", rate)
            .option("numPartitions", 8)
            .load()
            .selectExpr(*columns)
            .writeStream.format(fmt)
        )
        for key, value in options.items():
            writer = writer.option(key, value)
        query = writer.trigger(processingTime="1 second").start()
        time.sleep(seconds)
        query.stop()
        time.sleep(2.0)  # let the poller see the last committed batch
    finally:
        stop.set()
        thread.join()


def latencyKafka(spark: Any, bootstrap: str, work: Path, rate: int, seconds: int) -> list[float]:
    """Rate source -> twophase.kafka; a read_committed consumer times creation -> visible."""
    from confluent_kafka import Consumer, TopicPartition

    topic = kb.createTopic(bootstrap, 8, "latency")
    latencies: list[float] = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(8)])

    def poll(stop: threading.Event) -> None:
        while not stop.is_set():
            for message in consumer.consume(10000, 0.05):
                if message.error() is None:
                    latencies.append(time.time() - int(message.value() or b"0") / 1e6)

    columns = ["cast(value AS string) AS key", "cast(unix_micros(timestamp) AS string) AS value"]
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "topic": topic,
        "checkpointLocation": str(work / "latency-kafka"),
    }
    try:
        rateQuery(spark, rate, seconds, columns, "twophase.kafka", options, poll)
    finally:
        consumer.close()
        kb.deleteTopics(bootstrap, [topic])
    return latencies


def latencyFiles(spark: Any, work: Path, rate: int, seconds: int) -> list[float]:
    """Rate source -> twophase.files; a poller reads each new visible file once."""
    out = work / "latency-files"
    out.mkdir(parents=True, exist_ok=True)
    latencies: list[float] = []
    seen: set[Path] = set()

    def poll(stop: threading.Event) -> None:
        while not stop.is_set():
            for p in sorted(out.glob("part-*.parquet")):
                if p in seen:
                    continue
                now = time.time()
                seen.add(p)
                micros = pq.read_table(p, columns=["created"]).column("created").to_pylist()
                latencies.extend(now - m / 1e6 for m in micros)
            stop.wait(0.05)

    columns = ["value AS id", "unix_micros(timestamp) AS created"]
    options = {"path": str(out), "checkpointLocation": str(work / "latency-files-ckpt")}
    rateQuery(spark, rate, seconds, columns, "twophase.files", options, poll)
    return latencies


# ---------------------------------------------------------------------------------------------
# output


def throughputRows(measures: dict[tuple[str, str], Measure]) -> tuple[list[str], list[list[str]]]:
    header = [
        "target", "path", "rows", "seconds", "rows/s", "twophase / this", "goal", "met",
        "driver MiB", "JVM MiB", "Py workers MiB", "note",
    ]  # fmt: skip
    rows = []
    for target in TARGETS:
        tp = measures[(target, "twophase")]
        for path in PATHS:
            m = measures[(target, path)]
            name = {
                "twophase": TWOPHASE_PATH, "spark": SPARK_PATH, "flink": FLINK_PATH, "raw": RAW_PATH
            }[path][target]  # fmt: skip
            r = ratio(tp.rate, m.rate) if path != "twophase" else float("nan")
            goal = GOALS.get(path)
            met = "-" if goal is None or r != r else ("yes" if r >= goal else "no")
            rows.append([
                TARGET_TITLES[target], name, fmtNumber(m.rows) if m.rows else "-",
                fmtNumber(m.seconds, 1), fmtNumber(m.rate), fmtNumber(r, 2),
                f">= {goal}" if goal else "", met,
                fmtNumber(m.memory.driver / MIB) if m.memory.samples else "-",
                fmtNumber(m.memory.jvm / MIB) if m.memory.samples else "-",
                fmtNumber(m.memory.workers / MIB) if m.memory.samples else "-",
                m.note,
            ])  # fmt: skip
    return header, rows


def chart(measures: dict[tuple[str, str], Measure], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.8))
    width = 0.2
    for i, p in enumerate(PATHS):
        values = [measures[(t, p)].rate for t in TARGETS]
        xs = [j + (i - 1.5) * width for j in range(len(TARGETS))]
        bars = ax.bar(xs, [0 if v != v else v for v in values], width, label=PATH_TITLES[p])
        for bar, v in zip(bars, values, strict=True):
            label = "n/m" if v != v else f"{v / 1000:,.0f}k"
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, max(bar.get_height(), 1)),
                        ha="center", va="bottom", fontsize=7)  # fmt: skip
    ax.set_xticks(range(len(TARGETS)), [TARGET_TITLES[t] for t in TARGETS])
    ax.set_ylabel("rows/s (log scale)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------


def benchSession(
    master: str,
    partitions: int,
    packages: tuple[str, ...] = (),
    conf: dict[str, str] | None = None,
) -> Any:
    """The one Spark session every bench run uses: Kafka connector, JDBC driver, twophase;
    plus ``packages`` (Maven coordinates) and ``conf`` for the targets a run adds."""
    from pyspark.sql import SparkSession

    import twophase

    builder = (
        SparkSession.builder.master(master)
        .appName("twophase-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.jars", kb.sparkKafkaJar())
        .config(
            "spark.jars.packages",
            ",".join((kb.SPARK_KAFKA_PACKAGES, pb.JDBC_DRIVER, *packages)),
        )
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    twophase.register(spark)
    return spark


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


def report(
    out: Path, prof: Profile, measures: dict[tuple[str, str], Measure],
    commit: dict[str, tuple[float, float, int]], latency: dict[str, list[float]],
    sweep: list[list[str]], sparkVersion: str, elapsed: float, args: argparse.Namespace,
) -> None:  # fmt: skip
    header, rows = throughputRows(measures)
    writeCsv(out / "bench.csv", header, rows)
    batches = -(-prof.rows // prof.rowsPerBatch)
    title = f"{prof.rows:,} rows, batches of {prof.rowsPerBatch:,}, {prof.partitions} partitions"
    chart(measures, out / "bench.png", title)
    commitRows = []
    for target in TARGETS:
        p50, p95, n = commit[target]
        tp = measures[(target, "twophase")]
        batchMs = tp.seconds / batches * 1000
        goal = COMMIT_GOAL_MS[target]
        commitRows.append([
            TARGET_TITLES[target], str(n), fmtNumber(p50), fmtNumber(p95), f"<= {goal:.0f}",
            "yes" if p50 <= goal else "no", fmtNumber(batchMs), fmtNumber(ratio(p50, batchMs), 3),
        ])  # fmt: skip
    latencyRows = []
    for target, values in latency.items():
        p50, p95, top = percentiles(values)
        latencyRows.append([
            f"twophase.{target}", str(prof.latencyRate), fmtNumber(len(values)),
            fmtNumber(p50 * 1000), fmtNumber(p95 * 1000), fmtNumber(top * 1000),
            fmtNumber(ratio(p50, 1.0), 2),
        ])  # fmt: skip
    load = os.getloadavg()
    lines = [
        f"# make bench: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, PySpark {sparkVersion}, apache-flink {FLINK_VERSION}; "
        f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.",
        f"Run: `python -m bench.bench {' '.join(sys.argv[1:])}`.",
        f"Rows: {prof.rows:,} (`id`, `payload` padded to {prof.valueBytes} bytes), batches of "
        f"{prof.rowsPerBatch:,} ({batches} batches), {prof.partitions} partitions / "
        f"parallelism {prof.partitions}, {prof.partitions} topic partitions. Total time "
        f"{elapsed / 60:.1f} min.",
        "",
        "## Throughput (rows visible to a committed reader / seconds)",
        "",
        markdownTable(header, rows),
        "",
        "## Driver commit time per batch (twophase, decision log)",
        "",
        markdownTable(
            [
                "target",
                "batches",
                "p50 ms",
                "p95 ms",
                "goal (p50)",
                "met",
                "batch ms",
                "p50 / batch",
            ],
            commitRows,
        ),  # fmt: skip
        "",
        f"## End-to-end latency at {prof.latencyRate} rows/s (rate source, trigger 1 s, "
        f"{prof.latencySeconds} s)",
        "",
        markdownTable(
            ["sink", "rows/s in", "rows seen", "p50 ms", "p95 ms", "max ms", "p50 / trigger"],
            latencyRows,
        ),  # fmt: skip
    ]
    if sweep:
        lines += [
            "",
            f"## Sweep: twophase, {prof.sweepRows:,} rows",
            "",
            markdownTable(
                [
                    "target",
                    "rows/batch",
                    "partitions",
                    "batches",
                    "rows/s",
                    "commit p50 ms",
                    "commit p95 ms",
                    "batch ms",
                    "p50 / batch",
                ],
                sweep,
            ),  # fmt: skip
        ]
    text = "\n".join(lines) + "\n"
    (out / "bench.md").write_text(text)
    print()
    print(text)
    log(f"wrote {out / 'bench.md'}, {out / 'bench.csv'}, {out / 'bench.png'}")


if __name__ == "__main__":
    raise SystemExit(main())
