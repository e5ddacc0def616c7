"""An admin client dropped with a request unanswered: the process lives on (``letGo``)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

# A check that raises while its admin client's request is unanswered, as a refused login does:
# the exception's traceback holds the client, and the exception sits in a reference cycle, so
# only the garbage collector frees the client, on whichever thread runs Python next: the
# request's answer on librdkafka's background thread.
REFUSED = """
import gc, sys, time
from confluent_kafka import TopicCollection
from twophase.clients.kafka import adminClient, letGo

gc.set_threshold(1)


def check(release: bool) -> None:
    admin = adminClient({"bootstrap.servers": "127.0.0.1:1"})  # nothing listens
    future = admin.describe_topics(TopicCollection(["t"]), request_timeout=1)["t"]
    try:
        raise RuntimeError("refused")
    finally:
        if release:
            letGo(admin, [future], 10)


try:
    check(sys.argv[1] == "letGo")
except RuntimeError as exc:
    cycle: list = [exc]
    cycle.append(cycle)
    del exc, cycle
time.sleep(3)
print("alive")
"""


@pytest.mark.parametrize("release", ["letGo", "dropped"])
def test_a_client_let_go_after_its_answers_does_not_abort_the_process(release: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", REFUSED, release], capture_output=True, text=True, timeout=120
    )
    if release == "letGo":
        assert run.returncode == 0 and run.stdout.strip() == "alive", run.stderr[-2000:]
    else:  # why letGo exists: librdkafka aborts a client destroyed on its own thread
        assert run.returncode == -signal.SIGABRT, (run.returncode, run.stderr[-2000:])
        assert "librdkafka owned thread" in run.stderr


PARKED = """
import time
from confluent_kafka import TopicCollection
from twophase.clients.kafka import adminClient, letGo
from twophase.resources import Resources

admin = adminClient({"bootstrap.servers": "127.0.0.1:1"})
future = admin.describe_topics(TopicCollection(["t"]), request_timeout=1)["t"]
letGo(admin, [future], 0)
del admin
awaiting = Resources.ofProcess().get("kafka.adminsAwaitingAnswers", list)
print(len(awaiting), future.done())
time.sleep(3)
letGo(None, [], 0)
print(len(awaiting), future.done())
"""


def test_a_client_still_unanswered_is_kept_until_a_later_call_finds_it_answered() -> None:
    run = subprocess.run(
        [sys.executable, "-c", PARKED], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[:2] == ["1 False", "0 True"], run.stdout
