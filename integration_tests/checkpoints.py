"""A query's checkpoint as the driver leaves it, built without Spark: for the CLI's tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twophase.coordinator import DecisionLog
from twophase.protocol import TaskResult, TransactionContext
from twophase.settings import SinkSettings
from twophase.spark.driver import describeSink

QUERY_ID = "q-cli"


class SinkCheckpoint:
    """One sink's ``sink.json`` and claimed decision log, as a driver that planned a batch has
    them; tasks' contexts and results to prepare and decide with, as the query would."""

    def __init__(self, sink: Any, path: Path) -> None:
        self.path = path
        self.sink = sink
        self.settings = SinkSettings.fromOptions(sink.options, sink.name())
        describeSink(sink, self.settings)
        self.log = DecisionLog(self.settings.logLocation)
        self.log.claim(self.settings.sinkId, QUERY_ID)
        self.sinkJson = Path(self.settings.logLocation) / "sink.json"

    @property
    def sinkId(self) -> str:
        return self.settings.sinkId

    def context(self, batch: int, partition: int) -> TransactionContext:
        return TransactionContext(self.sinkId, QUERY_ID, batch, partition, 0, "run1")

    def result(self, batch: int, partition: int, handle: dict[str, Any]) -> TaskResult:
        return TaskResult(self.sinkId, QUERY_ID, batch, partition, 0, handle, 1)

    def decide(self, batch: int, handles: list[dict[str, Any]]) -> None:
        """Decide ``batch`` with one handle per partition, in order: the driver's commit point."""
        self.log.decide(batch, [self.result(batch, p, h) for p, h in enumerate(handles)])

    def filesHolding(self, secret: str) -> list[Path]:
        return [
            p for p in self.path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()
        ]
