"""``make bench-kafka-sustained``: the highest input rate Kafka -> Kafka holds for minutes with
end-to-end p95 latency of at most 2 s at a 1 s trigger, twophase against Spark's own connector.

For each rate of ``--rates`` the two paths run one after the other in one Spark session, each
for ``--seconds`` (300 by default) on fresh topics of 8 partitions:

- twophase: ``readStream.format("twophase.kafka")`` (``read_committed``) -> ``value`` ->
  ``twophase.foreachBatch("twophase.kafka", ...)`` (exactly once);
- spark: ``readStream.format("kafka")`` -> ``value`` -> ``writeStream.format("kafka")`` (at least
  once), the connector resolved by Maven coordinates as in ``bench.kafka``.

Both ``trigger(processingTime="1 second")``. A producer process (confluent-kafka, idempotent, not
transactional) writes the input at the fixed rate, paced per 10 ms slice, each value
``"<creation ms>:<seq>"`` padded to 100 bytes. A ``read_committed`` consumer of the output topic,
in a process of its own too, takes each row's arrival time minus its creation time (at tens of
thousands of rows a second, either one as a thread of the driver would take its interpreter
from ``twophase.foreachBatch``'s coordinator, which runs there); rows created in the warm-up
(the first ``min(30, seconds / 4)`` s) are left out. A rate holds when the p95 over the rest
is at most 2 s and, at the end of production, the consumer had seen at least 99% of the rows
created up to 10 s before it (the query keeps up rather than falling behind). Production
begins once the query has reported its first progress, after one short twophase query has
started the Python workers (``bench.latency.warmUp``), so no path pays for starting up.

Broker-side cost: the commit markers (control records) the twophase path wrote, per second.
Counted from the output topic's offsets once the query has stopped and the consumer has drained
it: the sum over partitions of (end offset - start offset) minus the records the consumer read.
Each committed (or aborted) transaction writes one marker into every partition it wrote to, so
this is the number of transaction ends summed over the partitions they touched, the figure the
broker pays for in marker writes; the number of transactions themselves is not counted (the
decision log prunes old batches), though markers / batches bounds it from above per batch. The
count includes the batches that deliver the backlog after production ends, and is divided by
``--seconds``. Spark's path is not transactional: no markers. Batches/s: micro-batches ended
while the producer ran, from the query's batch ids.

Where a batch's time goes: the medians, over the batches that started in the measured window
and read rows, of Spark's own progress figures (``durationMs``: the trigger's whole execution,
the source's ``latestOffset``, ``getBatch`` with query planning, ``addBatch`` (the sink; for
twophase the whole ``foreachBatch``: the tasks and the driver's decision and commit), and the
offset and commit logs' writes), and for twophase the decision log's own figures of the same
batches (the tasks' prepare, the decision's write, the transactions' commit), and twophase's
``addBatch`` split by the instants its log keeps (``bench.phases.timeline``): the fixed cost of
a batch around its job, the driver's work before the tasks and after them.

The lowest rate doubles as the light-rate latency check (twophase's p50 and p95 at most Spark's
plus 50 ms). Writes ``bench/results/kafka-sustained.{md,csv}``; asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import kafka as kb
from bench._common import REPO, bootstrapServers, markdownTable, ratio, writeCsv
from bench.latency import warmUp
from bench.phases import addBatchSpan, collect, phases, phaseTable, stepTable, timeline
from bench.session import benchSession, log

PATHS = ("twophase", "spark")
PARTITIONS = 8
VALUE_BYTES = 100
P95_LIMIT = 2.0
KEPT_UP = 0.99
LAG_ALLOWED = 10.0
LIGHT_MARGIN = 0.05
HISTOGRAM_MS = 600_000
FORK = multiprocessing.get_context("fork")


class Producer(FORK.Process):  # type: ignore[name-defined]
    """Writes ``rate`` rows/s into ``topic`` from ``start`` to ``end`` (epoch s), per 10 ms; its
    counts are shared with the parent as it goes."""

    def __init__(self, bootstrap: str, topic: str, rate: int, start: float, end: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.rate = bootstrap, topic, rate
        self.start_, self.end = start, end
        self._counts = FORK.Array("q", 2)  # produced, and produced up to LAG_ALLOWED s before end

    @property
    def produced(self) -> int:
        return int(self._counts[0])

    @property
    def producedBefore(self) -> int:
        """Rows created up to ``LAG_ALLOWED`` s before the end."""
        return int(self._counts[1])

    def run(self) -> None:
        from confluent_kafka import Producer as KafkaProducer

        producer = KafkaProducer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "queue.buffering.max.messages": 2_000_000,
                "queue.buffering.max.kbytes": 1_048_576,
            }
        )
        slice_ = 0.01
        tick = self.start_
        produced = before = 0
        while time.time() < self.start_:
            time.sleep(0.001)
        for index in range(1, round((self.end - self.start_) / slice_) + 1):
            due = self.rate * slice_ * index
            now = time.time()
            ms = int(now * 1000)
            while produced < int(due):
                value = f"{ms}:{produced}".ljust(VALUE_BYTES, ".").encode()
                try:
                    producer.produce(self.topic, value)
                except BufferError:
                    producer.poll(0.01)
                    continue
                produced += 1
                if now <= self.end - LAG_ALLOWED:
                    before += 1
            self._counts[0], self._counts[1] = produced, before
            producer.poll(0)
            tick += slice_
            pause = tick - time.time()
            if pause > 0:
                time.sleep(pause)
        producer.flush(60)


class Reader(FORK.Process):  # type: ignore[name-defined]
    """A ``read_committed`` consumer of ``topic``: a latency histogram (ms) of the rows created
    in ``[measured, end]``, and what it had seen by ``end`` of the rows created before
    ``end - LAG_ALLOWED``. ``read`` and ``lastRead`` are shared as it goes; the rest comes back
    with ``finish()``."""

    def __init__(self, bootstrap: str, topic: str, measured: float, end: float, rows: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.measuredMs, self.endMs = int(measured * 1000), int(end * 1000)
        self.histogram = [0] * (HISTOGRAM_MS + 1)
        self.worst = 0
        self.inWindow = 0
        self.seenByEnd = 0
        self.rows = rows
        self.repeated = 0
        """Rows read more than once (by sequence number)."""
        self._read = FORK.Value("q", 0)
        self._lastRead = FORK.Value("d", time.time())
        self.stop = FORK.Event()
        self._results, self._sending = FORK.Pipe(duplex=False)

    @property
    def read(self) -> int:
        return int(self._read.value)

    @property
    def lastRead(self) -> float:
        return float(self._lastRead.value)

    def finish(self) -> None:
        """Stop the reader and take its figures."""
        self.stop.set()
        self.histogram, self.worst, self.inWindow, self.seenByEnd, self.repeated = (
            self._results.recv()
        )
        self.join()

    def run(self) -> None:
        self.seen = bytearray(self.rows)
        try:
            self._consume()
        finally:
            figures = (self.histogram, self.worst, self.inWindow, self.seenByEnd, self.repeated)
            self._sending.send(figures)

    def _consume(self) -> None:
        consumer = kb.committedReader(
            self.bootstrap, self.topic, range(PARTITIONS), fetch_wait_max_ms=10
        )
        lagMs = int(LAG_ALLOWED * 1000)
        try:
            while not self.stop.is_set():
                messages = consumer.consume(10000, 0.02)
                if not messages:
                    continue
                nowMs = int(time.time() * 1000)
                self._lastRead.value = time.time()
                self._read.value += sum(1 for m in messages if m.error() is None)
                for message in messages:
                    if message.error() is not None:
                        continue
                    stamp, rest = (message.value() or b"0:0").split(b":", 1)
                    created = int(stamp)
                    seq = int(rest.rstrip(b"."))
                    if seq < len(self.seen):
                        self.repeated += self.seen[seq]
                        self.seen[seq] = 1
                    if nowMs <= self.endMs and created <= self.endMs - lagMs:
                        self.seenByEnd += 1
                    if self.measuredMs <= created <= self.endMs:
                        latency = max(0, nowMs - created)
                        self.histogram[min(latency, HISTOGRAM_MS)] += 1
                        self.worst = max(self.worst, latency)
                        self.inWindow += 1
        finally:
            consumer.close()

    def percentile(self, fraction: float) -> float:
        """The ``fraction`` quantile (nearest rank) in seconds; NaN without rows."""
        if self.inWindow == 0:
            return float("nan")
        rank = max(1, math.ceil(fraction * self.inWindow))
        total = 0
        for ms, count in enumerate(self.histogram):
            total += count
            if total >= rank:
                return ms / 1000
        return HISTOGRAM_MS / 1000


@dataclass
class Run:
    """One path at one rate."""

    rate: int
    path: str
    seconds: float
    produced: int = 0
    delivered: int = 0
    p50: float = float("nan")
    p95: float = float("nan")
    worst: float = float("nan")
    keptUp: float = float("nan")
    """Share of the rows created up to 10 s before the end that the reader had seen by then."""
    markers: int = 0
    repeated: int = 0
    batches: int = 0
    error: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    """Median milliseconds a batch spends in each phase (``PHASES``, then twophase's ``LOGGED``)."""
    steps: dict[str, float] = field(default_factory=dict)
    """Twophase's ``addBatch`` split (``bench.phases.STEPS``, median ms)."""

    @property
    def holds(self) -> bool:
        return not self.error and self.p95 <= P95_LIMIT and self.keptUp >= KEPT_UP


def endOffsets(bootstrap: str, topic: str) -> int:
    """Sum over the partitions of ``topic`` of (high watermark - low watermark)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    try:
        total = 0
        for p in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            total += high - low
        return total
    finally:
        consumer.close()


def startQuery(spark: Any, path: str, bootstrap: str, source: str, sink: str, work: Path) -> Any:
    import twophase

    ckpt = str(work / f"ckpt-{sink}")
    reader = spark.readStream.format("twophase.kafka" if path == "twophase" else "kafka")
    frame = (
        reader.option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("value")
    )
    if path == "twophase":
        options = {
            "kafka.bootstrap.servers": bootstrap,
            "topic": sink,
            "checkpointLocation": ckpt,
            "twophase.logLocation": logLocation(work, sink),
            "logRetentionBatches": "100000",  # every measured batch's figures stay readable
        }
        writer = frame.writeStream.foreachBatch(twophase.foreachBatch("twophase.kafka", options))
    else:
        writer = (
            frame.writeStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", sink)
            .option("checkpointLocation", ckpt)
        )
    return writer.trigger(processingTime="1 second").start()


def logLocation(work: Path, sink: str) -> str:
    return str(work / f"log-{sink}")


def batchId(query: Any) -> int:
    """The id of the query's last micro-batch, -1 before the first."""
    last = query.lastProgress
    return int(last["batchId"]) if last else -1


def measure(spark: Any, bootstrap: str, path: str, rate: int, seconds: float, work: Path) -> Run:
    """Run ``path`` at ``rate`` for ``seconds`` on fresh topics; what its reader saw."""
    run = Run(rate, path, seconds)
    source = kb.createTopic(bootstrap, PARTITIONS, f"sustained-in-{path}")
    sink = kb.createTopic(bootstrap, PARTITIONS, f"sustained-out-{path}")
    query = startQuery(spark, path, bootstrap, source, sink, work)
    began = time.time()
    while not query.recentProgress and query.isActive and time.time() < began + 120:
        time.sleep(0.2)  # the query has started (its start-up is not measured)
    firstBatch = batchId(query)
    start = time.time() + 2.0
    end = start + seconds
    producer = Producer(bootstrap, source, rate, start, end)
    reader = Reader(bootstrap, sink, start + min(30.0, seconds / 4), end, int(rate * seconds) + 1)
    progress: dict[int, dict[str, Any]] = {}
    lastCollected = time.time()
    try:
        reader.start()
        producer.start()
        while time.time() < end and query.isActive:
            time.sleep(0.2)
            if time.time() - lastCollected > 20:
                collect(query, progress)
                lastCollected = time.time()
        collect(query, progress)
        run.batches = batchId(query) - firstBatch
        if query.exception() is not None:
            run.error = str(query.exception()).splitlines()[0][:160]
        # Let the query deliver what is left (it is no longer measured), then drain the reader.
        producer.join()
        drainUntil = time.time() + 30.0
        while time.time() < drainUntil and reader.read < producer.produced and query.isActive:
            time.sleep(0.5)
        query.stop()
        while time.time() - reader.lastRead < 3.0:
            time.sleep(0.5)
    finally:
        query.stop()
        reader.finish()
    run.produced = producer.produced
    run.delivered = reader.inWindow
    run.repeated = reader.repeated
    run.p50, run.p95 = reader.percentile(0.5), reader.percentile(0.95)
    run.worst = reader.worst / 1000 if reader.inWindow else float("nan")
    run.keptUp = ratio(reader.seenByEnd, producer.producedBefore)
    run.markers = endOffsets(bootstrap, sink) - reader.read
    measured = start + min(30.0, seconds / 4)
    logged = logLocation(work, sink) if path == "twophase" else None
    run.phases = phases(progress, measured, end, logged)
    if logged is not None:
        window = {b: r for b, r in progress.items() if measured <= addBatchSpan(r)[0] <= end}
        run.steps = timeline(window, logged, skip=0) if window else {}
    kb.deleteTopics(bootstrap, [source, sink])
    return run


def fmt(value: float) -> str:
    return "-" if value != value else f"{value:.2f}"


def report(runs: list[Run], out: Path, title: str) -> str:
    header = ["rate (rows/s)", "path", "produced (rows/s)", "delivered (rows/s, rows twice)",
              "p50 / p95 / max (s)", "kept up", "holds", "batches/s", "markers/s"]  # fmt: skip
    rows = []
    for run in runs:
        measured = run.seconds - min(30.0, run.seconds / 4)
        rows.append([
            f"{run.rate:,}", run.path, f"{run.produced / run.seconds:,.0f}",
            f"{run.delivered / measured:,.0f}"
            + (f" ({run.repeated:,} twice)" if run.repeated else ""),
            f"{fmt(run.p50)} / {fmt(run.p95)} / {fmt(run.worst)}",
            f"{run.keptUp:.1%}" if run.keptUp == run.keptUp else "-",
            f"failed: {run.error}" if run.error else ("yes" if run.holds else "no"),
            f"{run.batches / run.seconds:.2f}", f"{run.markers / run.seconds:.1f}",
        ])  # fmt: skip
    table = markdownTable(header, rows)
    best = {p: max((r.rate for r in runs if r.path == p and r.holds), default=0) for p in PATHS}
    held = fmt(ratio(best["twophase"], best["spark"]))
    summary = [
        f"Highest rate held: twophase {best['twophase']:,} rows/s, Spark's own "
        f"{best['spark']:,} rows/s; twophase / Spark's {held} (goal >= 1.0)."
    ]
    if runs:
        light = min(r.rate for r in runs)
        pair = {r.path: r for r in runs if r.rate == light}
        if len(pair) == 2:
            two, own = pair["twophase"], pair["spark"]
            met = two.p50 <= own.p50 + LIGHT_MARGIN and two.p95 <= own.p95 + LIGHT_MARGIN
            summary.append(
                f"Light rate ({light:,} rows/s): twophase p50 / p95 {fmt(two.p50)} / "
                f"{fmt(two.p95)} s, Spark's own {fmt(own.p50)} / {fmt(own.p95)} s; within "
                f"Spark's + 50 ms: {'yes' if met else 'no'}."
            )
    breakdown = phaseTable([(f"{r.rate:,}", r.path, r.phases) for r in runs])
    summary.append(
        "Where a batch's time goes (medians over the measured batches that read rows; Spark's "
        "progress durationMs, and twophase's decision log):\n\n" + breakdown
    )
    split = [(f"{r.rate:,}", r.path, r.steps) for r in runs if r.steps]
    if split:
        summary.append(
            "Twophase's addBatch split by the instants its log keeps (to plan: the foreachBatch "
            "function's start; tasks: the job; after: the committed mark, sweep and prune, and "
            "Spark getting the batch back):\n\n" + stepTable(split)
        )
    text = f"{table}\n\n" + "\n\n".join(summary)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kafka-sustained.md").write_text(f"# Kafka -> Kafka, sustained\n\n{title}\n\n{text}\n")
    writeCsv(out / "kafka-sustained.csv", header, rows)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="2000,20000,50000", help="rows per second, a list")
    parser.add_argument("--seconds", type=float, default=300.0, help="per rate and path")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    rates = [int(r) for r in args.rates.split(",")]
    bootstrap = bootstrapServers()
    spark = benchSession(args.master, PARTITIONS)
    work = Path(tempfile.mkdtemp(prefix="twophase-kafka-sustained-"))
    title = (
        f"Spark {spark.version}, {args.master}; input and output topics of {PARTITIONS} "
        f"partitions, {VALUE_BYTES}-byte values, 1 s trigger, {args.seconds:g} s per rate and "
        f"path, the first {min(30.0, args.seconds / 4):g} s left out. Latency: a row's creation "
        "to a read_committed consumer of the output seeing it. Holds: p95 <= 2 s and >= 99% of "
        "the rows created up to 10 s before the end seen by then. Markers: control records in "
        "the output topic (end offsets minus records read)."
    )
    runs: list[Run] = []
    try:
        warmUp(spark, work)
        for rate in rates:
            for path in PATHS:
                log(f"{rate:,} rows/s, {path}: {args.seconds:g} s")
                run = measure(spark, bootstrap, path, rate, args.seconds, work)
                log(f"  p50 {fmt(run.p50)} p95 {fmt(run.p95)} max {fmt(run.worst)}; kept up "
                    f"{run.keptUp:.1%}; {run.markers} markers {run.error}")  # fmt: skip
                runs.append(run)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{title}\n\n{report(runs, args.out, title)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
