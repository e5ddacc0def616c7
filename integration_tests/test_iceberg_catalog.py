"""The Iceberg sink with its SQL catalog on the real PostgreSQL, reached through Toxiproxy: a
catalog server that stops answering fails the driver's calls in bounded time, then the decided
batch commits once."""

from __future__ import annotations

import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa

from integration_tests.conftest import callsDuring, failedWithin
from integration_tests.toxiproxy import Toxiproxy, proxiedUrl
from twophase.coordinator import Coordinator, CoordinatorSettings, DecisionLog
from twophase.protocol import TaskResult, TransactionContext, TransientCommitError
from twophase.sinks.files import FilesWriter
from twophase.sinks.iceberg import (
    LOCATION_OPTION,
    IcebergCommitter,
    IcebergSettings,
    catalogOf,
    ensureTable,
    loadCatalog,
)

SINK = "lake"
QUERY = "query-1"
SCHEMA = pa.schema([("id", pa.int64())])


def test_a_partitioned_catalog_database_fails_in_bounded_time_then_commits_once(
    tmp_path: Path, pg_url: str, proxies: Toxiproxy
) -> None:
    """Everything sent to the catalog's PostgreSQL vanishes (a partition: the proxy, like a
    frozen server's kernel, still acknowledges TCP, so only the sink's own bounds end a wait).
    A commit on the committer's pooled session fails within socketTimeout (plus the pool's
    bounded ping), a catalog opened meanwhile within connectTimeout, both retryably and
    without the password; after the partition heals the same decided batch commits once and
    its replay adds nothing."""
    proxy = proxies.proxy("postgres")
    uri = proxiedUrl(pg_url, proxy).replace("postgresql://", "postgresql+psycopg://", 1)
    table = f"it_{uuid.uuid4().hex[:8]}.events"
    options = {
        "table": table,
        "catalog.type": "sql",
        "catalog.uri": uri,
        "catalog.warehouse": f"file://{tmp_path}/warehouse",
        "connectTimeout": "2",
        "socketTimeout": "2",
    }
    settings = IcebergSettings.fromOptions(options)
    catalog = catalogOf(settings)
    options[LOCATION_OPTION] = ensureTable(catalog, table, SCHEMA, None, True).location()
    log = DecisionLog(str(tmp_path / "checkpoint" / SINK))
    committer = IcebergCommitter.fromOptions(options)
    coordinator = Coordinator(
        committer, log, SINK, CoordinatorSettings(commitRetries=1, retryInitialSeconds=0.1)
    )

    coordinator.commitBatch(0, prepare(options, 0))  # the committer's pool now holds a session
    first = prepare(options, 1)
    state = log.decide(1, first, queryId=QUERY)
    handles = [h.handle for h in state.handles]

    outcomes = callsDuring(
        proxy.partition,
        proxy.heal,
        {
            "commit": lambda: committer.completeBatch(SINK, 1, handles),
            "open": lambda: loadCatalog("fresh", settings.catalog, connectTimeout=2),
        },
    )
    commitError = failedWithin(outcomes, "commit", TransientCommitError, 10)
    assert "Timeout=2 s" in str(commitError), commitError  # the ping's, or the new session's
    openError, took = outcomes["open"]
    assert openError is not None and took < 8, f"the catalog opened in {took:.1f} s: {openError}"
    password = urlsplit(pg_url).password
    if password:
        assert password not in f"{commitError} {openError}"

    coordinator.recover(2)  # after the heal: the decided batch 1 is committed now
    coordinator.commitBatch(1, prepare(options, 1, attempt=1))  # a replay adds nothing
    held = catalog.load_table(table)
    ids = sorted(held.scan().to_arrow().column("id").to_pylist())
    assert ids == list(range(20))
    assert len(held.snapshots()) == 2


def prepare(options: dict[str, str], batchId: int, attempt: int = 0) -> list[TaskResult]:
    """Batch N's two tasks, each with five ids of its own, prepared as data files."""
    writer = FilesWriter(IcebergSettings.fromOptions(options).files)
    results = []
    for partition in range(2):
        ids = [batchId * 10 + partition * 5 + i for i in range(5)]
        ctx = TransactionContext(SINK, QUERY, batchId, partition, attempt)
        txn = writer.beginTransaction(ctx)
        writer.write(txn, pa.record_batch([pa.array(ids, pa.int64())], schema=SCHEMA))
        handle = writer.preCommit(txn)
        results.append(TaskResult(SINK, QUERY, batchId, partition, attempt, handle, len(ids)))
    return results
