"""Fault injection: a named point kills the process with SIGKILL, once per marker; the committer
wrapper that fires ``driver.betweenCommits`` between two commits of a batch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from twophase import faults
from twophase.protocol import Committer, Handle, Prepared, RecoveryScope, listsPrepared
from twophase.protocol.calls import servingBatch
from twophase.protocol.outcomes import CommitAnswer, CommitStatus

CHILD = """
import sys
from twophase import faults
for item in sys.argv[1:]:
    point, _, batch = item.partition(":")
    faults.crashPoint(point, int(batch))
print("survived", flush=True)
"""


def reach(points: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a child that reaches ``points`` in order; returns how it ended."""
    childEnv = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_CRASH")}
    childEnv.update(env)
    return subprocess.run(
        [sys.executable, "-c", CHILD, *points],
        env=childEnv,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,  # a driver.* point kills the child's process group only
    )


def test_once_dir_fires_each_armed_item_once(tmp_path: Path) -> None:
    onceDir = tmp_path / "once"
    onceDir.mkdir()
    env = {
        faults.ENV: "task.afterBegin:1,task.afterWrite:2,driver.afterDecision:2",
        faults.ONCE_DIR_ENV: str(onceDir),
    }
    path = ["task.afterBegin:0", "task.afterBegin:1", "task.afterWrite:2"]
    path += ["driver.afterDecision:2"]
    ends = [reach(path, env).returncode for _ in range(4)]
    assert ends == [-signal.SIGKILL] * 3 + [0]
    assert sorted(faults.firedItems(str(onceDir))) == [
        "driver.afterDecision:2",
        "task.afterBegin:1",
        "task.afterWrite:2",
    ]


def test_an_unarmed_or_other_batch_point_does_nothing() -> None:
    env = {faults.ENV: "task.afterWrite:5"}
    done = reach(["task.afterWrite:4", "task.afterBegin:5"], env)
    assert done.returncode == 0 and "survived" in done.stdout


def test_the_once_file_stops_every_point_after_the_first_crash(tmp_path: Path) -> None:
    env = {faults.ENV: "task.afterBegin,task.afterWrite", faults.ONCE_ENV: str(tmp_path / "x")}
    assert reach(["task.afterBegin:0"], env).returncode == -signal.SIGKILL
    assert reach(["task.afterBegin:0", "task.afterWrite:0"], env).returncode == 0
    assert (tmp_path / "x").read_text().strip() == "task.afterBegin:0"


# ------------------------------------------------------------ driver.betweenCommits


class Recording(Committer):
    """A committer in the narrow form that notes its calls; ``answers`` makes a handle's next
    commit answer something else than committed."""

    abortConcurrency = 4

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.answers: dict[str, CommitAnswer] = {}
        self.settings = "the sink's own settings"
        self.lock = threading.Lock()

    def commit(self, handle: Handle) -> CommitAnswer:
        with self.lock:
            self.calls.append(("commit", handle["txn"]))
            return self.answers.pop(handle["txn"], None)

    def abort(self, handle: Handle) -> None:
        self.calls.append(("abort", handle["txn"]))

    def preparedNames(self, handle: Handle) -> Iterable[str]:
        return (handle["txn"],)

    def listPrepared(self, scope: RecoveryScope) -> Iterable[Prepared]:
        return [Prepared(t, {"txn": t}) for t in ("t1", "t9")]

    def abortPrepared(self, item: Prepared) -> bool | None:
        self.calls.append(("abortPrepared", item.name))
        return True

    def completeBatch(self, sinkId: str, batchId: int, handles: Sequence[Handle]) -> None:
        self.calls.append(("completeBatch", f"{sinkId}:{batchId}:{len(handles)}"))

    def fingerprint(self, handle: Handle) -> str | None:
        return f"fp-{handle['txn']}"

    def describe(self, handle: Handle) -> str:
        return f"txn {handle['txn']}"


class Sweeping(Committer):
    """A committer that sweeps by itself (no narrow form)."""

    def commit(self, handle: Handle) -> None:
        pass

    def abort(self, handle: Handle) -> None:
        pass

    def recoverAndAbort(self, scope: RecoveryScope) -> list[Handle] | None:
        return [{"txn": "swept"}]


class Crashed(BaseException):
    """The driver died at the point (SIGKILL in a real query)."""


def commit(committer: Committer, txn: str, batchId: int = 3, how: str = "commit") -> Any:
    """``committer.<how>`` of handle ``txn`` (no batch in it), as the coordinator calls it for
    batch ``batchId``."""
    with servingBatch(batchId):
        if how == "commitReplacement":
            return committer.commitReplacement({"txn": "lost"}, {"txn": txn})
        return getattr(committer, how)({"txn": txn})


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """``driver.betweenCommits:3`` armed once; every kill is noted, then raises ``Crashed``."""
    monkeypatch.setenv(faults.ENV, "driver.betweenCommits:3")
    monkeypatch.setenv(faults.ONCE_ENV, str(tmp_path / "once"))
    noted: list[str] = []

    def kill(point: str) -> None:
        noted.append(point)
        raise Crashed(point)

    monkeypatch.setattr(faults, "kill", kill)
    return noted


@pytest.mark.parametrize("how", ["commit", "recoverAndCommit", "commitReplacement"])
def test_fires_before_another_handle_once_one_committed(
    kills: list[str], tmp_path: Path, how: str
) -> None:
    sink = Recording()
    committer = faults.withCrashBetweenCommits(sink)
    assert commit(committer, "t1", how=how) is None
    with pytest.raises(Crashed):
        commit(committer, "t2", how=how)
    assert kills == ["driver.betweenCommits"]
    assert sink.calls == [("commit", "t1")], "t2 was never committed: the batch is left partly"
    assert (tmp_path / "once").read_text().strip() == "driver.betweenCommits:3"


def test_a_batch_of_one_handle_or_a_retry_of_it_never_fires(kills: list[str]) -> None:
    sink = Recording()
    committer = faults.withCrashBetweenCommits(sink)
    for _ in range(3):
        commit(committer, "t1")
    assert kills == [] and sink.calls == [("commit", "t1")] * 3
    with pytest.raises(Crashed):
        commit(committer, "t2")


def test_a_commit_that_did_not_commit_does_not_count(kills: list[str]) -> None:
    sink = Recording()
    sink.answers["t1"] = CommitStatus.RETRY_LATER
    committer = faults.withCrashBetweenCommits(sink)
    commit(committer, "t1")  # the coordinator retries it later
    commit(committer, "t2")  # the first handle that committed
    assert kills == []
    with pytest.raises(Crashed):
        commit(committer, "t1")


def test_another_batch_or_a_call_outside_a_batch_never_fires(kills: list[str]) -> None:
    sink = Recording()
    committer = faults.withCrashBetweenCommits(sink)
    for txn in ("t1", "t2", "t3"):
        commit(committer, txn, batchId=4)
    for txn in ("t1", "t2", "t3"):
        committer.commit({"txn": txn})
    assert kills == [] and len(sink.calls) == 6


def test_fires_once_per_batch_when_the_point_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV, "driver.betweenCommits")
    reached: list[str] = []
    monkeypatch.setattr(faults, "kill", reached.append)  # a point that pauses, then goes on
    committer = faults.withCrashBetweenCommits(Recording())
    for txn in ("t1", "t2", "t3", "t4"):
        commit(committer, txn)
    for txn in ("u1", "u2"):
        commit(committer, txn, batchId=4)
    assert reached == ["driver.betweenCommits"] * 2, "once in batch 3, once in batch 4"


def test_unarmed_the_committer_is_handed_over_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.ENV, raising=False)
    sink = Recording()
    assert faults.injectFaults(sink) is sink
    monkeypatch.setenv(faults.ENV, "driver.afterDecision:3")
    assert faults.injectFaults(sink) is sink
    monkeypatch.setenv(faults.ENV, "driver.afterDecision,driver.betweenCommits:7")
    committer = faults.injectFaults(sink)
    assert isinstance(committer, faults.CrashingBetweenCommits)
    assert faults.injectFaults(committer) is committer, "never wrapped twice"
    for txn in ("t1", "t2"):
        commit(committer, txn)  # batch 3: not armed
    assert sink.calls == [("commit", "t1"), ("commit", "t2")]


def test_commits_of_an_armed_batch_run_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV, "driver.betweenCommits:3")
    monkeypatch.setattr(faults, "kill", lambda point: None)
    running, most = 0, 0
    lock = threading.Lock()

    class Slow(Recording):
        def commit(self, handle: Handle) -> CommitAnswer:
            nonlocal running, most
            with lock:
                running += 1
                most = max(most, running)
            time.sleep(0.02)
            with lock:
                running -= 1
            return None

    committer = faults.withCrashBetweenCommits(Slow())
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda txn: commit(committer, txn), [f"t{i}" for i in range(8)]))
    assert most == 1


def test_everything_else_goes_to_the_sinks_committer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV, "driver.betweenCommits:3")
    sink = Recording()
    committer = faults.withCrashBetweenCommits(sink)
    assert listsPrepared(committer) and committer.abortConcurrency == 4
    assert [p.name for p in committer.listPrepared(RecoveryScope("s"))] == ["t1", "t9"]
    assert list(committer.preparedNames({"txn": "t1"})) == ["t1"]
    assert committer.recoverAndAbort(RecoveryScope("s", keep=({"txn": "t1"},))) == [{"txn": "t9"}]
    assert committer.abortPrepared(Prepared("t5", {"txn": "t5"})) is True
    committer.abort({"txn": "t6"})
    committer.completeBatch("s", 3, [{"txn": "t1"}])
    assert sink.calls == [
        ("abortPrepared", "t9"),
        ("abortPrepared", "t5"),
        ("abort", "t6"),
        ("completeBatch", "s:3:1"),
    ]
    assert committer.fingerprint({"txn": "t1"}) == "fp-t1"
    assert committer.describe({"txn": "t1"}) == "txn t1"
    assert committer.settings == "the sink's own settings"
    assert type(committer).__name__ == "CrashingBetweenCommits[Recording]"

    sweeping = faults.withCrashBetweenCommits(Sweeping())
    assert not listsPrepared(sweeping)
    assert sweeping.recoverAndAbort(RecoveryScope("s")) == [{"txn": "swept"}]
