"""Telling a user, once per run, that a batch was written by many more tasks than run at once.

PySpark charges every Python task a fixed cost, so a twophase sink behind an aggregation (200
shuffle partitions by default) on a small cluster spends most of each batch starting tasks.
``writeStream.format("twophase.*")`` cannot change how many tasks write (a Python data source
gets Spark's partitions as they are), so the driver's commit measures it instead: each task
reports when it ran, the commit counts the tasks and the most that ran at the same time (the
cluster's task slots, as the batch used them), and when the batch needed many waves of tasks
it logs one warning with the numbers and the fix. Once per run of the query: the run id is
kept in ``notice-tasks.json`` beside the decision log.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import fsspec

from twophase.redaction import getLogger

log = getLogger(__name__)

NOTICE_FILE = "notice-tasks.json"
MIN_TASKS = 16
"""Fewer tasks than this never get the warning, whatever the slots."""
WAVES = 4
"""The warning comes when a batch had more than this many tasks per task slot."""


def mostAtOnce(spans: Sequence[tuple[float, float]]) -> int:
    """The largest number of the (start, end) spans that overlap at one moment."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in events:  # at equal times an end (-1) sorts first: touching is not overlap
        running += step
        most = max(most, running)
    return most


def adviceFor(sinkName: str, batchId: int, tasks: int, atOnce: int) -> str | None:
    """The warning for a batch of ``tasks`` tasks of which ``atOnce`` ran together, or ``None``
    when the batch was written in few enough waves."""
    if tasks < MIN_TASKS or atOnce <= 0 or tasks <= WAVES * atOnce:
        return None
    return (
        f"twophase sink {sinkName}: batch {batchId} was written by {tasks} tasks, at most "
        f"{atOnce} at a time: PySpark's fixed cost per Python task was paid {tasks // atOnce} "
        f"times per task slot. Write with about {atOnce} tasks: add "
        f".coalesce({atOnce}) before writeStream, or use .foreachBatch(twophase.foreachBatch("
        f'"{sinkName}", options)), which writes with one task per slot (docs/performance.md)'
    )


def adviseOncePerRun(
    logLocation: str,
    sinkName: str,
    batchId: int,
    spans: Sequence[tuple[float, float]],
    runId: str,
) -> bool:
    """Log the warning of ``adviceFor`` unless this run of the query was already told;
    returns whether it was logged. Never raises: advice must not fail a commit."""
    advice = adviceFor(sinkName, batchId, len(spans), mostAtOnce(spans))
    if advice is None:
        return False
    try:
        fs, root = fsspec.core.url_to_fs(logLocation)
        path = f"{root.rstrip('/')}/{NOTICE_FILE}"
        try:
            told = json.loads(fs.cat_file(path)).get("runId")
        except (FileNotFoundError, ValueError, AttributeError):
            told = None
        if told == runId:
            return False
        fs.makedirs(root, exist_ok=True)
        fs.pipe_file(path, json.dumps({"runId": runId, "batchId": batchId}).encode())
    except OSError as exc:
        log.debug("could not keep the task-count notice in %s: %s", logLocation, exc)
    log.warning("%s", advice)
    return True
