"""The contract suite as a user meets it: docs' example passes it, a sink that breaks it fails.

The sink and its test file are copied out of docs/writing-a-sink.md into a directory of their
own and run by pytest there, with three broken versions of the same sink beside them: each
must fail the case it breaks, and the documented sink must pass every case.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing-a-sink.md"

BROKEN = '''
"""Three ways to break the contract, each a context of the documented test."""

import os
import shutil

import test_jsonl_sink as documented
from jsonl_sink import JsonLinesSink


class CommitAppendsTwice(JsonLinesSink):
    def commit(self, handle):
        os.makedirs(os.path.dirname(handle["final"]), exist_ok=True)
        with open(handle["pending"]) as staged, open(handle["final"], "a") as final:
            final.write(staged.read())


class AbortRaisesTheSecondTime(JsonLinesSink):
    def abort(self, handle):
        os.remove(handle["pending"])


class PreCommitVisible(JsonLinesSink):
    def preCommit(self, txn):
        handle = super().preCommit(txn)
        os.makedirs(os.path.dirname(handle["final"]), exist_ok=True)
        shutil.copy(handle["pending"], handle["final"])
        return handle


class TestCommitAppendsTwice(documented.TestJsonLinesSink):
    sink = CommitAppendsTwice


class TestAbortRaisesTheSecondTime(documented.TestJsonLinesSink):
    sink = AbortRaisesTheSecondTime


class TestPreCommitVisible(documented.TestJsonLinesSink):
    sink = PreCommitVisible
'''

CASES = {
    "test_commit_twice_makes_the_rows_visible_once",
    "test_abort_twice_raises_nothing_and_leaves_nothing",
    "test_a_lost_commit_reply_then_commit_again_makes_the_rows_visible_once",
    "test_prepared_rows_are_invisible_until_commit",
    "test_recovery_keeps_the_kept_handle_and_aborts_the_rest",
    "test_a_worker_killed_after_prepare_is_committed_or_swept_from_its_handle",
    "test_a_batch_replayed_with_other_records_commits_only_the_decided_attempt",
}


def documentedBlocks() -> tuple[str, str]:
    """The one-class sink and its contract test, as docs/writing-a-sink.md shows them."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    sinks = [b for b in blocks if "class JsonLinesSink(twophase.TwoPhaseCommitSink)" in b]
    tests = [b for b in blocks if "class TestJsonLinesSink(SinkContract)" in b]
    assert len(sinks) == 1 and len(tests) == 1, "the doc lost its sink or its contract test"
    return sinks[0], tests[0]


def test_the_documented_sink_passes_and_each_broken_sink_fails_the_case_it_breaks(
    pytester: pytest.Pytester,
) -> None:
    sink, test = documentedBlocks()
    pytester.makepyfile(jsonl_sink=sink, test_jsonl_sink=test, test_broken=BROKEN)
    run = pytester.inline_run("-p", "no:randomly", "-p", "no:cacheprovider")
    outcomes: dict[str, dict[str, str]] = {}
    for report in run.getreports("pytest_runtest_logreport"):
        if report.when == "call" or report.outcome != "passed":
            cls, case = report.nodeid.split("::")[-2:]
            outcomes.setdefault(cls, {})[case] = report.outcome
    assert "SinkContract" not in outcomes, "the suite's own base class was collected"
    assert outcomes["TestJsonLinesSink"] == dict.fromkeys(CASES, "passed")
    failed = {
        cls: sorted(c for c, o in cases.items() if o == "failed") for cls, cases in outcomes.items()
    }
    assert "test_commit_twice_makes_the_rows_visible_once" in failed["TestCommitAppendsTwice"]
    assert failed["TestAbortRaisesTheSecondTime"] == [
        "test_abort_twice_raises_nothing_and_leaves_nothing"
    ]
    assert "test_prepared_rows_are_invisible_until_commit" in failed["TestPreCommitVisible"]
