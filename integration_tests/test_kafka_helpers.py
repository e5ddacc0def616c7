"""Helpers shared by the Kafka integration tests (this module holds no tests).

Topics, a ``read_committed`` reader that reads to the true end of every partition (the last
stable offset, not "a poll returned nothing"), and a second, private broker started through
services/kafka.sh for tests that need other broker settings.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from integration_tests.conftest import SERVICES_DIR, service_setting


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def createTopic(
    bootstrap: str,
    partitions: int = 1,
    prefix: str = "it-kafka",
    config: dict[str, str] | None = None,
) -> str:
    """A new topic; ``config`` sets topic configs (``{"max.message.bytes": "2000"}``)."""
    name = unique(prefix)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})
    admin.create_topics([topic])[name].result(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # metadata reaches every client a little later
        topic = admin.list_topics(name, timeout=10).topics.get(name)
        if topic is not None and topic.error is None and len(topic.partitions) == partitions:
            return name
        time.sleep(0.1)
    raise AssertionError(f"topic {name} did not appear with {partitions} partitions")


@dataclass(frozen=True)
class Record:
    key: Any
    value: Any
    partition: int
    offset: int
    headers: tuple[tuple[str, bytes], ...] = ()


def readTopic(
    bootstrap: str,
    topic: str,
    *,
    isolation: str = "read_committed",
    timeout: float = 60.0,
) -> list[Record]:
    """Every record of ``topic`` a consumer with ``isolation`` gets, up to the end of each
    partition as that isolation level defines it (the last stable offset for read_committed,
    fixed when the read starts)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = sorted(admin.list_topics(topic, timeout=30).topics[topic].partitions)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("it-reader"),
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        ends = {}
        for p in partitions:
            _, high = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=30, cached=False
            )
            ends[p] = high
        waiting = {p for p in partitions if ends[p] > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in waiting])
        records: list[Record] = []
        deadline = time.monotonic() + timeout
        while waiting:
            assert time.monotonic() < deadline, f"reading {topic} timed out; left {waiting}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            offset = message.offset() or 0
            partition = message.partition() or 0
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if offset >= ends[partition]:
                        waiting.discard(partition)
                    continue
                raise AssertionError(f"consumer error on {topic}: {error}")
            if offset >= ends[partition]:
                waiting.discard(partition)
                continue
            raw: Any = message.headers() or []
            records.append(
                Record(
                    message.key(),
                    message.value(),
                    partition,
                    offset,
                    tuple((str(k), v) for k, v in raw),
                )
            )
            if offset == ends[partition] - 1:
                waiting.discard(partition)
        return records
    finally:
        consumer.close()


def values(records: list[Record]) -> list[str]:
    return sorted((r.value or b"").decode() for r in records)


# ---------------------------------------------------------------------------------------------
# A second broker, private to one test.


@dataclass
class PrivateBroker:
    """A broker of services/kafka.sh with its own state directory (and so its own settings)."""

    cache: Path
    env: dict[str, str]
    bootstrap: str = ""

    def run(self, verb: str) -> str:
        result = subprocess.run(
            [str(SERVICES_DIR / "kafka.sh"), verb],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        if result.returncode != 0:
            raise AssertionError(
                f"kafka.sh {verb} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
            )
        return result.stdout.strip()


def privateBroker(tmp: Path, **env: str) -> Iterator[PrivateBroker]:
    """Start a broker with ``env`` (e.g. TWOPHASE_KAFKA_TXN_MAX_TIMEOUT_MS) next to the main one.

    Its TWOPHASE_CACHE is a fresh directory whose ``kafka-<version>`` entry links to the main
    cache's jars, so nothing is downloaded again; its state and ports are its own.
    """
    mainCache = Path(
        service_setting("TWOPHASE_CACHE")
        or os.environ.get("TWOPHASE_CACHE")
        or Path.home() / ".cache" / "twophase"
    )
    jars = sorted(mainCache.glob("kafka-*"))
    if not jars:
        pytest.fail(f"no Kafka jars under {mainCache}: run `make services` first", pytrace=False)
    cache = tmp / "broker-cache"
    cache.mkdir(parents=True, exist_ok=True)
    for entry in jars:
        link = cache / entry.name
        if not link.exists():
            link.symlink_to(entry, target_is_directory=True)
    childEnv = dict(
        os.environ,
        TWOPHASE_CACHE=str(cache),
        TWOPHASE_SERVICES_SET="1",  # its state under cache/run, whichever set the tests use
        PYTHON=sys.executable,
        **env,
    )
    broker = PrivateBroker(cache, childEnv)
    try:
        broker.run("up")
        broker.bootstrap = broker.run("bootstrap")
        yield broker
    finally:
        try:
            broker.run("down")
        finally:
            shutil.rmtree(cache / "run", ignore_errors=True)
