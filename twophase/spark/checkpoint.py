"""What Spark's own checkpoint says: the query's id and the batch it is about to run."""

from __future__ import annotations

import json

import fsspec


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
