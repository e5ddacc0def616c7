"""``make bench-kafka-stall``: how long a crashed query holds ``read_committed`` readers back.

A task of the ``twophase.kafka`` sink prepares a transaction (its records are in the log, the
transaction open) and its process is SIGKILLed with no restart: until the broker aborts the
transaction at its ``transaction.timeout.ms`` (found by the broker's periodic sweep,
``transaction.abort.timed.out.transaction.cleanup.interval.ms``, 10 s by default), the
partition's last stable offset stays behind its high watermark and every ``read_committed``
consumer of it stands still. For each timeout given, the command measures that stall from the
kill to the moment the last stable offset reaches the high watermark, and prints it beside the
timeout. The broker's ``transaction.max.timeout.ms`` must allow the largest timeout asked.

Needs the broker: ``make services`` (TWOPHASE_KAFKA_BOOTSTRAP from the environment or
.services.env).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from typing import Any

from bench._common import bootstrapServers

TASK = textwrap.dedent(
    """
    import json, os, signal, sys
    import pyarrow as pa
    from twophase.protocol import TransactionContext
    from twophase.sinks.kafka import KafkaWriter
    w = KafkaWriter.fromOptions(json.loads(sys.argv[1]))
    txn = w.beginTransaction(TransactionContext("bench-stall", "q", 0, 0, 0))
    w.write(txn, pa.RecordBatch.from_pydict({"value": [f"r{i}" for i in range(1000)]}))
    w.preCommit(txn)
    print("prepared", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def offsets(admin: Any, topic: str) -> tuple[int, int]:
    """(last stable offset, high watermark) of partition 0."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    found = []
    for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        futures = admin.list_offsets(
            {TopicPartition(topic, 0): OffsetSpec.latest()}, isolation_level=level
        )
        found.append(next(iter(futures.values())).result(10).offset)
    return found[0], found[1]


def stallSeconds(bootstrap: str, timeoutMs: int) -> float:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"bench-stall-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "topic": topic,
        "kafka.transaction.timeout.ms": str(timeoutMs),
        "transactionalIdPrefix": f"bench-stall-{uuid.uuid4().hex[:6]}",
    }
    child = subprocess.run(
        [sys.executable, "-c", TASK, json.dumps(options)], capture_output=True, text=True
    )
    killed = time.monotonic()
    if child.returncode != -signal.SIGKILL or "prepared" not in child.stdout:
        raise SystemExit(f"the task did not prepare and die: {child.stdout}{child.stderr}")
    stable, high = offsets(admin, topic)
    if stable >= high:
        raise SystemExit("the transaction was not open after the kill")
    while True:
        stable, high = offsets(admin, topic)
        if stable >= high:
            return time.monotonic() - killed
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--timeouts-ms", default="10000,60000", help="comma-separated transaction timeouts"
    )
    args = parser.parse_args(argv)
    bootstrap = bootstrapServers()
    print(
        "| transaction.timeout.ms | read_committed readers stalled after the kill "
        "| stall / timeout |"
    )
    print("|---|---|---|")
    for timeoutMs in (int(t) for t in args.timeouts_ms.split(",")):
        stall = stallSeconds(bootstrap, timeoutMs)
        print(f"| {timeoutMs:,} | {stall:.1f} s | {stall / (timeoutMs / 1000):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
