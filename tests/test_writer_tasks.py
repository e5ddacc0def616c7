"""The write-task options of ``twophase.foreachBatch`` and the advice of the stream writer.

No Spark job here: how ``writerTasks`` and ``local[...]`` masters are read, how many tasks ran
at once, and when a batch's tasks earn the one warning per run (integration_tests/
test_writer_tasks.py runs the real thing).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from twophase.settings import TwoPhaseConfigError
from twophase.spark import grouping, task_advice


def test_writer_tasks_is_a_count_zero_or_input_or_unset() -> None:
    assert grouping.writerTasksOf({}) is None
    assert grouping.writerTasksOf({"writerTasks": "4"}) == 4
    assert grouping.writerTasksOf({"writertasks": " 3 "}) == 3  # as Spark lower-cases keys
    assert grouping.writerTasksOf({"writerTasks": "0"}) == 0
    assert grouping.writerTasksOf({"writerTasks": "Input"}) == 0
    for bad in ("-1", "two", "1.5", ""):
        with pytest.raises(TwoPhaseConfigError, match="must be a number of tasks"):
            grouping.writerTasksOf({"writerTasks": bad})
    assert grouping.withoutWriterTasks({"WriterTasks": "2", "path": "/p"}) == {"path": "/p"}
    with pytest.raises(TwoPhaseConfigError, match=r"\.coalesce\(n\) before writeStream"):
        grouping.refuseWriterTasks({"writertasks": "2"}, "twophase.kafka")
    grouping.refuseWriterTasks({"path": "/p"}, "twophase.files")


def test_task_slots_of_local_masters() -> None:
    assert grouping.localSlots("local") == 1
    assert grouping.localSlots("local[3]") == 3
    assert grouping.localSlots("local[2,4]") == 2
    assert grouping.localSlots("local[*]") >= 1  # type: ignore[operator]
    assert grouping.localSlots("local-cluster[2,3,1024]") == 6
    assert grouping.localSlots("spark://master:7077") is None
    assert grouping.localSlots("yarn") is None


def test_most_at_once_counts_overlapping_tasks_and_not_touching_ones() -> None:
    assert task_advice.mostAtOnce([]) == 0
    assert task_advice.mostAtOnce([(0, 1), (1, 2), (2, 3)]) == 1
    twoSlots = [(i // 2, i // 2 + 0.9) for i in range(20)]  # two tasks at a time, ten waves
    assert task_advice.mostAtOnce(twoSlots) == 2
    assert task_advice.mostAtOnce([(0, 10), (1, 2), (3, 4), (1.5, 3.5)]) == 3


def test_advice_comes_for_many_waves_only() -> None:
    assert task_advice.adviceFor("twophase.kafka", 0, 8, 2) is None  # few tasks
    assert task_advice.adviceFor("twophase.kafka", 0, 40, 10) is None  # four waves
    text = task_advice.adviceFor("twophase.kafka", 3, 200, 2)
    assert text is not None
    assert "batch 3 was written by 200 tasks, at most 2 at a time" in text
    assert ".coalesce(2) before writeStream" in text
    assert 'twophase.foreachBatch("twophase.kafka", options)' in text


def test_advice_is_logged_once_per_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spans = [(i // 2, i // 2 + 0.5) for i in range(200)]
    log = str(tmp_path / "log")
    with caplog.at_level(logging.WARNING, logger="twophase"):
        assert task_advice.adviseOncePerRun(log, "twophase.files", 0, spans, "run-a")
        assert not task_advice.adviseOncePerRun(log, "twophase.files", 1, spans, "run-a")
        assert task_advice.adviseOncePerRun(log, "twophase.files", 2, spans, "run-b")
        assert not task_advice.adviseOncePerRun(log, "twophase.files", 3, spans[:8], "run-c")
    warned = [r.getMessage() for r in caplog.records if "tasks, at most" in r.getMessage()]
    assert len(warned) == 2 and "batch 0" in warned[0] and "batch 2" in warned[1]
    notice = json.loads((tmp_path / "log" / task_advice.NOTICE_FILE).read_text())
    assert notice == {"runId": "run-b", "batchId": 2}
