"""Everything a chaos pipeline needs around the runner: servers, tables, topics, verification."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from integration_tests.chaos.report import ChaosResult
from integration_tests.chaos.runner import ChaosRun
from integration_tests.chaos.schedule import Schedule
from integration_tests.chaos.servers import Services, servicesFromEnvironment
from integration_tests.chaos.spec import PipelineSpec
from integration_tests.test_kafka_helpers import createTopic
from twophase import verify

__all__ = ["prepare", "runPipeline", "servicesFromEnvironment", "verifyOutput"]

INPUT_TRANSACTION_ROWS = 250
"""Records per transaction when the Kafka -> Kafka input topic is filled."""
KAFKA_TIMEOUT_MS = 15_000
"""The ``multi`` pipeline's Kafka target's (and the ``kafka`` pipeline's)
``kafka.transaction.timeout.ms``: short, so an outage outlives it."""
OUTAGE_PIPELINE = "multi"
"""The pipeline whose schedule has outages: its Kafka target's transactions time out while the
query is down after a decision, and PostgreSQL's prepared ones of the same batch do not."""
OUTAGE_SECONDS = 2.5 * KAFKA_TIMEOUT_MS / 1000
"""How long an outage keeps the query down: past the timeout and the broker's abort sweep."""
SERVICE_KINDS = {
    "postgres": ("postgres",),
    "kafka": ("broker",),
    "kafka-kafka": ("broker",),
    "multi": ("postgres", "broker"),
    "s3": ("s3",),
    "mariadb": ("mariadb",),
}
"""The servers a pipeline depends on, by pipeline (files has none)."""


def _need(value: str, what: str) -> str:
    if not value:
        raise SystemExit(f"{what} is not configured: start the servers with `make services`")
    return value


def fillInput(bootstrap: str, topic: str, rows: int) -> None:
    """``rows`` committed records (key ``<id>``, value ``row-<id>``) and, between them, aborted
    transactions a read_committed source must skip."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"chaos-fill-{uuid.uuid4().hex[:8]}"}
    )
    producer.init_transactions(60)
    for start in range(0, rows, INPUT_TRANSACTION_ROWS):
        if (start // INPUT_TRANSACTION_ROWS) % 4 == 1:
            producer.begin_transaction()
            for i in range(10):
                producer.produce(topic, b"aborted", key=b"aborted-%d" % i)
            producer.abort_transaction(60)
        producer.begin_transaction()
        for i in range(start, min(rows, start + INPUT_TRANSACTION_ROWS)):
            producer.produce(topic, b"row-%d" % i, key=b"%d" % i)
        producer.commit_transaction(60)


def prepare(
    pipeline: str, workdir: Path, services: Services, rows: int, perBatch: int
) -> PipelineSpec:
    """The spec of a fresh run of ``pipeline``: its own table or topics, ``rows`` of input."""
    spec = PipelineSpec(pipeline, str(workdir), rows=rows, rowsPerBatch=perBatch)
    if pipeline in ("postgres", "multi"):
        spec.pgUrl = _need(services.pgUrl, "PostgreSQL")
        spec.table = f"chaos_{uuid.uuid4().hex[:8]}"
    if pipeline == "mariadb":
        spec.sqlUrl = _need(services.mariadbUrl, "MariaDB")
        spec.table = f"chaos_{uuid.uuid4().hex[:8]}"
    if pipeline == "kafka":
        spec.sinkOptions["kafka.transaction.timeout.ms"] = str(KAFKA_TIMEOUT_MS)
    if pipeline == "multi":
        spec.sinkOptions["events.kafka.transaction.timeout.ms"] = str(KAFKA_TIMEOUT_MS)
    if pipeline in ("kafka", "kafka-kafka", "multi"):
        spec.bootstrap = _need(services.bootstrap, "Kafka")
        spec.outputTopic = createTopic(spec.bootstrap, partitions=2, prefix="chaos-out")
    if pipeline == "s3":
        if services.s3 is None:
            raise SystemExit("S3 is not configured: start the servers with `make services`")
        spec.s3Path = services.s3.url(f"chaos/{uuid.uuid4().hex[:10]}/output")
        spec.sinkOptions.update(services.s3.options())
    if pipeline == "kafka-kafka":
        spec.inputTopic = createTopic(spec.bootstrap, partitions=2, prefix="chaos-in")
        fillInput(spec.bootstrap, spec.inputTopic, rows)
    return spec


def verifyOutput(spec: PipelineSpec) -> Any:
    """Compare what the pipeline's sink holds with what its source offered (for ``multi``:
    each target, and the two joined on the id, with ``twophase verify``'s multi check)."""
    if spec.pipeline == "multi":
        return verify.verify(
            "sequence",
            {"start": "0", "end": str(spec.rows)},
            "multi",
            multiOptions(spec),
        )
    if spec.pipeline == "kafka-kafka":
        expected = verify.expectedFromKafka(
            {"kafka.bootstrap.servers": spec.bootstrap, "subscribe": spec.inputTopic}
        )
        columns = ["key", "value"]
    else:
        expected = verify.expectedFromSequence(0, spec.rows)
        columns = ["id", "payload"]
    if spec.pipeline == "files":
        actual = verify.actualFromFiles(spec.output, "parquet")
    elif spec.pipeline == "s3":
        actual = verify.actualFromFiles(spec.s3Path, "parquet", options=spec.sinkOptions)
    elif spec.pipeline == "postgres":
        actual = verify.actualFromPostgres(spec.pgUrl, spec.table)
    elif spec.pipeline == "mariadb":
        actual = verify.actualFromSql(spec.sqlUrl, spec.table)
    else:
        actual = verify.actualFromKafka(
            {"kafka.bootstrap.servers": spec.bootstrap, "subscribe": spec.outputTopic}
        )
        if spec.pipeline == "kafka":
            expected = verify.asKafkaRecords(expected)
            columns = ["key", "value"]
    return verify.compare(expected, actual, columns)


def multiOptions(spec: PipelineSpec) -> dict[str, str]:
    """The ``multi`` pipeline's sink options, as ``twophase verify --sink multi`` takes them."""
    return {
        "targets": "orders=postgres,events=kafka",
        "orders.url": spec.pgUrl,
        "orders.table": spec.table,
        "events.kafka.bootstrap.servers": spec.bootstrap,
        "events.topic": spec.outputTopic,
    }


def runPipeline(
    pipeline: str,
    workdir: Path,
    services: Services,
    *,
    seed: int,
    kills: int,
    rowsPerBatch: int,
    coverPoints: bool,
    log: Any = print,
) -> ChaosResult:
    """Draw the schedule, size the input to it, run it, verify."""
    schedule = Schedule.draw(
        seed,
        pipeline,
        kills,
        coverPoints=coverPoints,
        servers=SERVICE_KINDS.get(pipeline, ()),
        outageSeconds=OUTAGE_SECONDS if pipeline == OUTAGE_PIPELINE else 0.0,
    )
    workdir = workdir.resolve()  # executors run elsewhere: every path they see is absolute
    workdir.mkdir(parents=True, exist_ok=True)
    rows = schedule.batchesNeeded() * rowsPerBatch
    spec = prepare(pipeline, workdir, services, rows, rowsPerBatch)
    log(
        f"[chaos] {pipeline}: seed {seed}, {rows} rows in batches of {rowsPerBatch}, schedule: "
        + "; ".join(e.describe() for e in schedule.events)
    )
    os.environ.setdefault("TWOPHASE_LOG_LEVEL", "INFO")
    return ChaosRun(spec, schedule, services, verifyOutput, log).run()
