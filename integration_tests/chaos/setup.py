"""Everything a chaos pipeline needs around the runner: servers, tables, topics, verification."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from integration_tests.chaos.pipeline import PipelineSpec
from integration_tests.chaos.runner import (
    KAFKA_TIMEOUT_MS,
    ChaosResult,
    ChaosRun,
    Schedule,
    Services,
)
from integration_tests.conftest import S3Service, service_setting
from integration_tests.test_kafka_helpers import createTopic
from twophase import verify

INPUT_TRANSACTION_ROWS = 250
"""Records per transaction when the Kafka -> Kafka input topic is filled."""


def servicesFromEnvironment() -> Services:
    """The servers of ``make services`` (environment first, then .services.env)."""
    names = ("ENDPOINT", "ACCESS_KEY", "SECRET_KEY", "BUCKET")
    s3 = [service_setting(f"TWOPHASE_S3_{n}") or "" for n in names]
    return Services(
        pgUrl=service_setting("TWOPHASE_PG_URL") or "",
        bootstrap=service_setting("TWOPHASE_KAFKA_BOOTSTRAP") or "",
        s3=S3Service(*s3) if all(s3) else None,
        mariadbUrl=service_setting("TWOPHASE_MARIADB_URL") or "",
    )


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
    schedule = Schedule.draw(seed, pipeline, kills, coverPoints=coverPoints)
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
