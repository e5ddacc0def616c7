"""Driver-side glue between a sink's options and the coordinator: open, claim, recover.

The Spark binding and the ``foreachBatch`` adapter both call ``beforeBatch`` once per
micro-batch, before any task runs, and ``openCoordinator`` to commit or abort it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

import fsspec

from twophase.coordinator import Coordinator, DecisionLog
from twophase.protocol import TwoPhaseParticipant
from twophase.settings import SinkSettings

log = logging.getLogger(__name__)


def ensureLogging() -> None:
    """Give ``twophase`` loggers a stderr handler inside Spark's Python workers.

    Spark's driver-side Python workers configure no logging, so without this the one INFO line
    per committed batch would vanish. An application that configured logging keeps its own.
    ``TWOPHASE_LOG_LEVEL`` (default INFO) sets the level.
    """
    logger = logging.getLogger("twophase")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(os.environ.get("TWOPHASE_LOG_LEVEL", "INFO").upper())


def openCoordinator(participant: TwoPhaseParticipant[Any], settings: SinkSettings) -> Coordinator:
    """A coordinator over the sink's decision log, with the sink's retry bounds."""
    return Coordinator(
        participant,
        DecisionLog(settings.logLocation),
        settings.sinkId,
        commitRetries=settings.commitRetries,
        commitTimeoutSeconds=settings.commitTimeoutSeconds,
        retentionBatches=settings.logRetentionBatches,
    )


def checkpointQueryId(checkpointLocation: str) -> str | None:
    """The query id Spark recorded in ``<checkpointLocation>/metadata``, if it is there yet."""
    fs, root = fsspec.core.url_to_fs(checkpointLocation)
    path = f"{root.rstrip('/')}/metadata"
    try:
        with fs.open(path, "r") as f:
            first = f.readline()
    except FileNotFoundError:
        return None
    try:
        queryId = json.loads(first).get("id")
    except (ValueError, AttributeError):
        return None
    return str(queryId) if queryId else None


SINK_DESCRIPTION = "sink.json"
_SECRET_KEY = re.compile(r"password|secret|sasl\.jaas|token|credential", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(://[^:/@\s]+):[^@\s]*@")


def publicOptions(options: Mapping[str, str]) -> dict[str, str]:
    """The options with secrets removed: secret-named keys dropped, URL passwords cut out."""
    return {
        key: _URL_PASSWORD.sub(r"\1@", value)
        for key, value in sorted(options.items())
        if not _SECRET_KEY.search(key)
    }


def describeSink(participant: TwoPhaseParticipant[Any], settings: SinkSettings) -> None:
    """Keep ``sink.json`` beside the log: which class and options can finish its transactions.

    ``twophase recover`` rebuilds the sink from it. Secrets are never written; a sink that
    needs one reads it from its usual place (environment, ``.pgpass``...). Written only when
    it changed, so a batch costs one small read.
    """
    cls = type(participant)
    options = getattr(participant, "options", {})
    body = json.dumps(
        {
            "sinkId": settings.sinkId,
            "class": f"{cls.__module__}:{cls.__qualname__}",
            "options": publicOptions(options),
        },
        indent=2,
        sort_keys=True,
    )
    fs, root = fsspec.core.url_to_fs(settings.logLocation)
    path = f"{root.rstrip('/')}/{SINK_DESCRIPTION}"
    try:
        with fs.open(path, "r") as f:
            if f.read() == body:
                return
    except FileNotFoundError:
        fs.makedirs(root, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with fs.open(tmp, "w") as f:
        f.write(body)
    fs.mv(tmp, path)


def plannedBatchId(checkpointLocation: str) -> int | None:
    """The batch Spark is about to run: the newest ``<checkpoint>/offsets/<N>`` entry.

    Spark writes ``offsets/N`` (its write-ahead log) before it plans batch N's write, so
    during ``streamWriter()`` this is N. Used for logs and fault injection only: decisions
    never depend on it.
    """
    fs, root = fsspec.core.url_to_fs(checkpointLocation)
    try:
        names = fs.ls(f"{root.rstrip('/')}/offsets", detail=False)
    except FileNotFoundError:
        return None
    ids = [int(n.rsplit("/", 1)[-1]) for n in names if n.rsplit("/", 1)[-1].isdigit()]
    return max(ids, default=None)


def beforeBatch(
    participant: TwoPhaseParticipant[Any],
    settings: SinkSettings,
    queryId: str | None,
    batchId: int | None = None,
) -> int | None:
    """Claim the log for this query, finish or abort what earlier runs left, return the last
    decided batch id (tasks of a batch at or below it write nothing)."""
    ensureLogging()
    coordinator = openCoordinator(participant, settings)
    if queryId:
        coordinator.claim(queryId, reset=settings.resetLog)
    describeSink(participant, settings)
    report = coordinator.recover(batchId)
    if not report.idle:
        log.info("twophase sink %s: recovery %s", settings.sinkId, report)
    return coordinator.log.lastDecided()
