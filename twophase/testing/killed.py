"""A task process killed right after prepare: the contract suite's worker that never returns.

Runs in a process of its own (started by ``multiprocessing``'s spawn, so the sink class is
imported afresh, as an executor would): it writes one task through the framework's task
runner, hands the prepared handle to the driver side and dies by SIGKILL, with no clean-up,
no ``finally`` and no exit handler, as a worker killed by the system would.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from multiprocessing.connection import Connection

import pyarrow as pa

from twophase.protocol import TransactionContext, dumpsHandle


def prepareThenDie(
    path: list[str],
    sink: tuple[str, str],
    options: dict[str, str],
    ctx: TransactionContext,
    rows: pa.RecordBatch,
    handOut: Connection,
) -> None:
    """Prepare ``rows`` in one task of the sink class ``sink`` (its module and qualified name,
    imported on the driver's ``path``: a test module is found where pytest found it), send the
    handle's JSON, then SIGKILL itself."""
    from twophase.spark.task import runTask  # plain Python: the runner imports no pyspark

    sys.path[:] = path
    module, name = sink
    found: object = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    source = found(options)  # type: ignore[operator]
    result = runTask(source.createWriter, ctx, [rows], alreadyDecided=False)
    assert result.handle is not None, "the task prepared no handle"
    handOut.send(dumpsHandle(result.handle))
    handOut.close()
    os.kill(os.getpid(), signal.SIGKILL)
