"""librdkafka's log lines of admin clients and consumers: in Python logging, once per kind."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from twophase.clients.kafka.logs import ClientLog

UNREACHABLE = """
from twophase.sources.kafka.planner import KafkaPlanner
from twophase.sources.kafka.settings import KafkaSourceSettings

options = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
settings = KafkaSourceSettings.fromOptions({**options, "requestTimeoutSeconds": "3"})
try:
    KafkaPlanner(settings).topicPartitions()
except Exception as exc:
    print(type(exc).__name__)
"""


def test_an_unreachable_cluster_does_not_flood_stderr_with_librdkafka_lines() -> None:
    run = subprocess.run(
        [sys.executable, "-c", UNREACHABLE], capture_output=True, text=True, timeout=120
    )
    assert run.stdout.strip() == "KafkaSourceError", run.stdout + run.stderr
    raw = [line for line in run.stderr.splitlines() if line.startswith("%")]
    assert not raw, f"librdkafka printed {len(raw)} lines itself, e.g. {raw[:2]}"
    assert len(run.stderr.splitlines()) <= 3, run.stderr


def test_the_first_line_of_each_kind_keeps_its_level_and_repeats_go_to_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clientLog = ClientLog("admin client")
    fail = "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused"
    with caplog.at_level(logging.DEBUG, logger="twophase.kafka.librdkafka"):
        for elapsed in (0, 3, 51):
            clientLog.log(
                logging.ERROR,
                "%s [%s] %s",
                "FAIL",
                "rdkafka#1",
                f"{fail} (after {elapsed}ms in state CONNECT)",
            )
        clientLog.log(
            logging.WARNING, "%s [%s] %s", "AUTH", "rdkafka#1", "password=hunter2 refused"
        )
    levels = [(r.levelno, "again" in r.getMessage()) for r in caplog.records]
    assert levels == [
        (logging.ERROR, False),
        (logging.DEBUG, True),
        (logging.DEBUG, True),
        (logging.WARNING, False),
    ]
    assert "hunter2" not in caplog.text
