"""Importing packages that read installed-package metadata, without the jars on the path.

Some packages read the installed distributions' metadata when they are imported: fsspec its
entry points (``importlib.metadata.entry_points``), psycopg's binary build its own version
(``importlib.metadata.version``). Either lists every zip file on ``sys.path`` the first time in a
process. Spark puts the jars of ``spark.jars`` and ``spark.jars.packages`` on its Python
workers' path; listing large ones (hadoop-client-runtime, the AWS SDK bundle) costs about a
second to several seconds in each new Python worker, which a query pays in its first
micro-batches after every start. Jars hold no Python distributions these packages look for,
so their import runs with the ``.jar`` entries hidden, and the path is restored at once.
``twophase/__init__.py`` imports this module before any other, so fsspec is imported here
before any twophase module imports it; the PostgreSQL modules call ``importWithoutJars``
for psycopg before their own imports of it.
"""

from __future__ import annotations

import importlib
import sys
import threading

_lock = threading.Lock()


def isJavaArchive(entry: str) -> bool:
    return entry.lower().endswith(".jar")


def importWithoutJars(name: str) -> None:
    """Import module ``name`` once per process, with the ``.jar`` entries of ``sys.path``
    hidden while it imports."""
    if name in sys.modules:
        return
    with _lock:
        if name in sys.modules:
            return
        saved = list(sys.path)
        sys.path[:] = [entry for entry in saved if not isJavaArchive(entry)]
        try:
            importlib.import_module(name)
        finally:
            sys.path[:] = saved + [entry for entry in sys.path if entry not in saved]


importWithoutJars("fsspec")
