"""End-to-end latency: the rate source into a sink while a reader times each row's arrival."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from bench import kafka as kb


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
