"""``freezeWorkerHeap``: freezes only inside PySpark's daemon workers, once per process."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import gc, importlib.machinery, sys
from twophase.spark import worker as worker_gc
before = gc.get_freeze_count()
worker_gc.freezeWorkerHeap()
outside = gc.get_freeze_count()
sys.modules["__main__"].__spec__ = importlib.machinery.ModuleSpec("pyspark.daemon", None)
worker_gc.freezeWorkerHeap()
inside = gc.get_freeze_count()
later = [[i] for i in range(1000)]
worker_gc.freezeWorkerHeap()
again = gc.get_freeze_count()
print(before, outside, inside, again)
"""


def test_the_heap_is_frozen_once_and_only_in_a_pyspark_daemon_worker() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True
    ).stdout.split()
    before, outside, inside, again = map(int, out)
    assert before == outside == 0, "a process that is not a PySpark worker keeps its collector"
    assert inside > 1000, "a PySpark worker's start-up objects go to the permanent generation"
    assert again == inside, "only the first call freezes: later objects stay collectable"
