"""Importing fsspec without reading the Java archives Spark puts on the Python path.

fsspec reads every installed distribution's entry points when it is first imported
(``importlib.metadata.entry_points``), and that opens every zip file on ``sys.path``. Spark puts
the jars of ``spark.jars`` and ``spark.jars.packages`` on its Python workers' path; listing
large ones (hadoop-client-runtime, the AWS SDK bundle) costs about a second to several seconds
in each new Python worker, which a query pays in its first micro-batches after every start.
Jars hold no Python distributions that register fsspec filesystems, so that one scan leaves
them out; the path is restored at once. ``twophase/__init__.py`` imports this module before
any other, so the import below runs before any twophase module imports fsspec.
"""

from __future__ import annotations

import sys
import threading

_lock = threading.Lock()


def isJavaArchive(entry: str) -> bool:
    return entry.lower().endswith(".jar")


def importFsspec() -> None:
    """Import fsspec once per process, with the ``.jar`` entries of ``sys.path`` hidden."""
    if "fsspec" in sys.modules:
        return
    with _lock:
        if "fsspec" in sys.modules:
            return
        saved = list(sys.path)
        if not any(isJavaArchive(entry) for entry in saved):
            import fsspec  # noqa: F401

            return
        sys.path[:] = [entry for entry in saved if not isJavaArchive(entry)]
        try:
            import fsspec  # noqa: F401, F811
        finally:
            sys.path[:] = saved + [entry for entry in sys.path if entry not in saved]


importFsspec()
