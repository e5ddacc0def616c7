"""``twophase.attachMetrics`` on a real Spark session: the figures each batch hands on.

A ``twophase.files`` query runs a few batches with the listener attached; the figures it
receives (callback, the ``twophase.metrics`` log line, and the Prometheus endpoint scraped over
HTTP) must match what the query really wrote, batch by batch. The example of
docs/operations.md runs here too. One in-process session serves the module.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry

import twophase
from integration_tests.docs_blocks import DOCS
from integration_tests.spark_processes import sharedSession
from twophase.coordinator.figures import TIMES
from twophase.metrics import SinkMetrics

BATCHES = 3
ROWS_PER_BATCH = 400


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from sharedSession("twophase-metrics")


def runQuery(spark: Any, out: Path, ckpt: Path, *, foreach: bool = False) -> None:
    stream = (
        spark.readStream.format("twophase.sequence")
        .option("rowsPerBatch", ROWS_PER_BATCH)
        .option("totalRows", ROWS_PER_BATCH * BATCHES)
        .option("numPartitions", 2)
        .load()
    )
    options = {"path": str(out), "checkpointLocation": str(ckpt)}
    if foreach:
        writer = stream.writeStream.foreachBatch(twophase.foreachBatch("twophase.files", options))
    else:
        writer = stream.writeStream.format("twophase.files").options(**options)
    query = writer.option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
    query.awaitTermination()


def writtenRows(out: Path) -> dict[int, int]:
    """Rows per batch in the visible output (final names carry the batch id)."""
    rows: dict[int, int] = {}
    for path in out.glob("part-*.parquet"):
        batchId = int(path.name.split("-")[1])
        rows[batchId] = rows.get(batchId, 0) + pq.ParquetFile(path).metadata.num_rows
    return rows


def awaitBatches(received: list[SinkMetrics], count: int, listener: Any) -> None:
    """Spark delivers progress events after the query ends; wait for the last batch's."""
    assert listener.awaitBatch(count - 1, 30), f"figures of {count} batches never came"
    assert listener.flush(30)


def test_the_listener_hands_on_each_batchs_figures_and_prometheus_counts_them(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    received: list[SinkMetrics] = []
    listener = twophase.attachMetrics(
        spark, str(ckpt), callback=received.append, port=0, registry=CollectorRegistry()
    )

    def failing(metrics: SinkMetrics) -> None:
        raise RuntimeError("a user's callback that fails")

    broken = twophase.attachMetrics(spark, str(ckpt), callback=failing)
    other = twophase.attachMetrics(spark, str(tmp_path / "another-query"), callback=received.append)
    try:
        with caplog.at_level(logging.INFO, logger="twophase.metrics"):
            runQuery(spark, out, ckpt)
            awaitBatches(received, BATCHES, listener)
            assert broken.flush(30) and other.flush(30)
    finally:
        for attached in (listener, broken, other):
            spark.streams.removeListener(attached)
            assert attached.close(10), "the listener's thread outlived close()"

    written = writtenRows(out)
    assert written == {b: ROWS_PER_BATCH for b in range(BATCHES)}
    byBatch = {m.batch.batchId: m for m in received if m.batch is not None}
    assert sorted(byBatch) == list(range(BATCHES)), "every batch once, no other query's"
    [sinkId] = {m.sinkId for m in received}
    for batchId, metrics in byBatch.items():
        figures = metrics.batch
        assert figures is not None and figures.outcome == "committed"
        assert figures.rows == written[batchId]
        assert figures.bytes is not None and figures.bytes >= 8 * figures.rows
        assert figures.prepared == figures.committed == figures.tasks
        assert figures.prepareSeconds is not None and figures.prepareSeconds > 0
        assert figures.decisionSeconds is not None and figures.commitSeconds is not None
        assertPhasesInOrder(figures)
        # read after this batch, perhaps while the next one was being decided: nothing of this
        # batch or an earlier one is pending, and nothing at all after the last
        inDoubt = metrics.oldestInDoubt
        if batchId == BATCHES - 1:
            assert metrics.pendingCommittables == 0, metrics
        elif metrics.pendingCommittables:
            assert inDoubt is not None and inDoubt.batchId > batchId, metrics
    assert "failed on sink" in caplog.text and "a user's callback that fails" in caplog.text

    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "twophase.metrics"]
    logged = {line["batch"]["batchId"]: line["batch"]["rows"] for line in lines if line["batch"]}
    assert logged == written

    assert listener.port
    with urllib.request.urlopen(f"http://127.0.0.1:{listener.port}/metrics", timeout=10) as page:
        text = page.read().decode()

    def scraped(name: str, extra: str = "") -> float:
        labels = f'{{{extra}sink="{sinkId}"}}' if not extra else f'{{{extra},sink="{sinkId}"}}'
        found = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
        assert found, f"{name}{labels} not in:\n{text}"
        return float(found.group(1))

    assert scraped("twophase_rows_total") == ROWS_PER_BATCH * BATCHES
    assert scraped("twophase_batches_total", 'outcome="committed"') == BATCHES
    committed = sum(m.batch.committed or 0 for m in byBatch.values() if m.batch)
    assert scraped("twophase_committables_success_total") == committed
    assert scraped("twophase_commit_seconds_count") == BATCHES
    assert scraped("twophase_pending_committables") == 0
    assert scraped("twophase_oldest_uncommitted_batch_age_seconds") == 0


def test_foreach_batch_queries_report_the_same_figures(spark: Any, tmp_path: Path) -> None:
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    received: list[SinkMetrics] = []
    listener = twophase.attachMetrics(spark, str(ckpt), callback=received.append)
    try:
        runQuery(spark, out, ckpt, foreach=True)
        awaitBatches(received, BATCHES, listener)
    finally:
        spark.streams.removeListener(listener)
        listener.close()
    rows = {m.batch.batchId: m.batch.rows for m in received if m.batch is not None}
    assert rows == writtenRows(out) == {b: ROWS_PER_BATCH for b in range(BATCHES)}
    for metrics in received:
        if metrics.batch is not None:
            assertPhasesInOrder(metrics.batch)


def assertPhasesInOrder(figures: Any) -> None:
    """The batch's own commit recorded every instant of its phases (planned in the planner's
    worker, tasks on the executors, the commit), each no earlier than the one before."""
    times = figures.times
    assert times is not None and list(times) == list(TIMES), figures
    instants = [times[name] for name in TIMES]
    assert instants == sorted(instants), times
    finished = figures.finishedAt
    assert finished is not None and instants[-1] <= finished.timestamp() + 0.001  # ms in the log


def test_the_operations_example_prints_each_batch_and_the_scraped_counter(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/operations.md's example, in this process: its ``getOrCreate`` is this session."""
    [code] = re.findall(r"```python\n(.*?)```", (DOCS / "operations.md").read_text(), re.DOTALL)
    assert "port=9464" in code, "the example's port changed: update this test"
    monkeypatch.setattr("sys.argv", ["example", str(tmp_path / "work")])
    exec(compile(code.replace("port=9464", "port=0"), "operations.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [f"batch {b}: committed, 1000 rows" for b in range(3)], lines
    assert re.fullmatch(r'twophase_rows_total\{sink="tp-[0-9a-f]+"\} 3000\.0', lines[3]), lines
