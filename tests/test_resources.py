"""A process's resources: opened once, closed together (newest first), opened again after."""

from __future__ import annotations

import os
import pickle
import threading

from twophase.resources import Resources
from twophase.sinks.kafka.pool import Pool


def test_a_resource_is_opened_once_and_closed_with_the_rest_newest_first() -> None:
    resources = Resources()
    opened: list[str] = []
    closed: list[str] = []

    def opener(name: str) -> object:
        opened.append(name)
        return name

    assert resources.get("a", lambda: opener("a"), closed.append) == "a"
    assert resources.get("b", lambda: opener("b"), closed.append) == "b"
    assert resources.get("a", lambda: opener("a again"), closed.append) == "a"
    facts = resources.get("facts", set)  # kept, nothing to close
    assert opened == ["a", "b"] and resources.keys() == ["a", "b", "facts"]
    resources.close()
    assert closed == ["b", "a"] and resources.keys() == [] and resources.peek("a") is None
    assert resources.get("facts", set) is not facts  # asked for again: opened again


def test_a_failing_close_does_not_keep_the_others_open() -> None:
    resources = Resources()
    closed: list[str] = []

    def fail(_: object) -> None:
        raise OSError("stuck")

    resources.get("first", lambda: "first", closed.append)
    resources.get("stuck", lambda: "stuck", fail)
    resources.close()
    assert closed == ["first"]


def test_the_last_user_to_release_closes_them() -> None:
    resources = Resources()
    closed: list[str] = []
    resources.get("conn", lambda: "conn", closed.append)
    resources.use("query-1")
    resources.use("query-2")
    assert not resources.release("query-1") and closed == []
    assert not resources.awaitReleased(0)
    assert resources.release("query-2") and closed == ["conn"]
    assert resources.awaitReleased(0)


def test_the_process_has_one_pickled_as_the_receivers_own() -> None:
    mine = Resources.ofProcess()
    assert Resources.ofProcess() is mine
    assert pickle.loads(pickle.dumps(Resources())) is mine


def test_a_forked_child_gets_resources_of_its_own() -> None:
    parent = Resources.ofProcess()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answers whether it was given the parent's object
        os.write(write, b"new" if Resources.ofProcess() is not parent else b"parent's")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 16)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"new"


def test_closing_the_kafka_pool_ends_its_keeper_thread() -> None:
    resources = Resources()
    pool = resources.get("kafka.pool", Pool, Pool.close)
    pool.startKeeper()
    keeper = pool._keeper
    assert keeper is not None and keeper.is_alive() and keeper in threading.enumerate()
    resources.close()  # joins the keeper
    assert not keeper.is_alive()
    pool.startKeeper()  # a closed pool starts no thread again
    assert pool._keeper is keeper


def test_a_slow_open_holds_up_only_its_own_key() -> None:
    resources = Resources()
    started, proceed = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        assert proceed.wait(30)
        return "slow"

    opener = threading.Thread(target=lambda: resources.get("catalog", slow))
    opener.start()
    try:
        assert started.wait(30)
        assert resources.get("engine", lambda: "fast") == "fast"  # while the catalog opens
    finally:
        proceed.set()
        opener.join(30)
    assert not opener.is_alive()
    assert resources.get("catalog", lambda: "opened twice") == "slow"
