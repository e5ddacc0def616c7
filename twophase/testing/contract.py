"""The contract every sink keeps, as a pytest class: subclass it with a context for your system.

Each case drives the sink the way production does: the writer through the framework's own task
runner (``twophase.spark.task.runTask``, which checks the handle), the committer directly, with
handles that went through JSON as they do through the decision log, and a new sink instance
built from the options wherever another process would build one. A context says only how to make
an empty target, read what is committed and list what is prepared but not finished.
"""

from __future__ import annotations

import functools
import multiprocessing
import signal
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import pyarrow as pa
import pytest
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from twophase.protocol import (
    Committer,
    Handle,
    RecoveryScope,
    TransactionContext,
    TransientCommitError,
    checkedAborted,
    dumpsHandle,
    loadsHandle,
)
from twophase.settings import optionOf
from twophase.testing.killed import prepareThenDie

DEFAULT_SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])
"""The rows the suite writes unless a context sets ``schema``."""

QUERY_ID = "contract-query"

_T = TypeVar("_T")


class SinkContract:
    """The protocol's contract, one test per case; subclass as ``Test<YourSink>`` to join it.

    Set ``sink`` to the sink class (a ``TwoPhaseCommitSink``, or a ``TwoPhaseDataSource`` with
    ``createWriter`` and ``createCommitter``); it is built from options as PySpark builds it,
    ``sink(options)``. Implement ``newTarget``, ``readCommitted`` and ``leftovers``; set
    ``schema`` (a pyarrow schema with an ``id`` integer column) to write other columns than
    ``id bigint, payload string``, and override ``makeRows`` if the suite cannot fill them.
    """

    sink: ClassVar[type[Any]]
    schema: ClassVar[pa.Schema] = DEFAULT_SCHEMA
    killedWorkerSeconds: ClassVar[float] = 120.0
    """How long a killed worker may take to start, prepare and hand its handle out."""
    transientSeconds: ClassVar[float] = 120.0
    """How long a committer's call is retried while it raises ``TransientCommitError``, as the
    coordinator retries it (its ``commitTimeoutSeconds``)."""

    # what a context implements ------------------------------------------------------------
    def newTarget(self) -> dict[str, str]:
        """The options of a fresh, empty target (a directory, a table, a topic)."""
        raise NotImplementedError(f"{type(self).__name__} must implement newTarget()")

    def readCommitted(self, options: Mapping[str, str]) -> pa.Table:
        """The committed rows of the target, with an ``id`` column."""
        raise NotImplementedError(f"{type(self).__name__} must implement readCommitted(options)")

    def leftovers(self, options: Mapping[str, str]) -> list[Any]:
        """What was prepared and neither committed nor aborted; ``[]`` when staged data is
        invisible by construction and nothing can linger."""
        raise NotImplementedError(f"{type(self).__name__} must implement leftovers(options)")

    def makeRows(self, ids: Sequence[int]) -> pa.RecordBatch:
        """A record batch of ``schema`` holding ``ids``: integers, floats, strings and booleans
        derived from each id, null for any other type."""
        columns = [_column(field, ids) for field in self.schema]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    # the cases ----------------------------------------------------------------------------
    def test_commit_twice_makes_the_rows_visible_once(self) -> None:
        options = self._target()
        handle = self._prepare(options, [1, 2, 3])
        committer = self._committer(options)
        self._commitBatch(committer, options, 0, [handle])
        self._commitBatch(committer, options, 0, [handle])
        self._assertCommitted(options, [1, 2, 3], "after committing one handle twice")
        self._assertNoLeftovers(options, "after committing twice")

    def test_abort_twice_raises_nothing_and_leaves_nothing(self) -> None:
        options = self._target()
        handle = self._prepare(options, [1, 2, 3])
        committer = self._committer(options)
        self._retried(lambda: committer.abort(handle))
        self._retried(lambda: committer.abort(handle))
        self._assertCommitted(options, [], "after aborting one handle twice")
        self._assertNoLeftovers(options, "after aborting twice")

    def test_a_lost_commit_reply_then_commit_again_makes_the_rows_visible_once(self) -> None:
        options = self._target()
        handle = self._prepare(options, [1, 2, 3])
        self._commitBatch(self._committer(options), options, 0, [handle])  # its reply is lost
        another = self._committer(options)  # the retry, or a restarted driver
        self._commitBatch(another, options, 0, [handle])
        self._retried(lambda: another.recoverAndCommit(handle))
        self._assertCommitted(options, [1, 2, 3], "after a commit whose reply was lost")
        self._assertNoLeftovers(options, "after a commit whose reply was lost")

    def test_prepared_rows_are_invisible_until_commit(self) -> None:
        options = self._target()
        handle = self._prepare(options, [1, 2, 3])
        visible = sorted(set(self._committedIds(options)) & {1, 2, 3})
        assert not visible, f"rows {visible} are visible after preCommit, before any commit"
        self._commitBatch(self._committer(options), options, 0, [handle])
        self._assertCommitted(options, [1, 2, 3], "after the commit")

    def test_recovery_keeps_the_kept_handle_and_aborts_the_rest(self) -> None:
        options = self._target()
        kept = self._prepare(options, [1, 2, 3], partition=0)
        self._prepare(options, [4, 5], partition=1)
        self._prepare(options, [6], partition=2, attempt=1)
        self._sweep(options, keep=(kept,))
        again = self._sweep(options, keep=(kept,))  # the next start's recovery
        assert not again, f"a second recovery aborted {again} again: the first left it prepared"
        self._assertCommitted(options, [], "after recovery, before the kept handle's commit")
        self._commitBatch(self._committer(options), options, 0, [kept])
        self._assertCommitted(options, [1, 2, 3], "after committing the one kept handle")
        self._assertNoLeftovers(options, "after recovery and the kept handle's commit")

    def test_a_worker_killed_after_prepare_is_committed_or_swept_from_its_handle(self) -> None:
        options = self._target()
        spawn = _workerProcesses(self.sink)
        workers = []
        for partition, ids in enumerate([[1, 2, 3], [4, 5]]):
            ctx = self._context(options, 0, partition, 0)
            receiving, sending = spawn.Pipe(duplex=False)
            process = spawn.Process(
                target=prepareThenDie,
                args=(
                    list(sys.path),
                    (self.sink.__module__, self.sink.__qualname__),
                    dict(options),
                    ctx,
                    self.makeRows(ids),
                    sending,
                ),
            )
            process.start()
            sending.close()
            workers.append((process, receiving))
        handles = []
        for process, receiving in workers:
            assert receiving.poll(self.killedWorkerSeconds), "a worker handed out no handle"
            handles.append(loadsHandle(receiving.recv()))
            process.join(self.killedWorkerSeconds)
            assert process.exitcode == -signal.SIGKILL, f"worker ended with {process.exitcode}"
        committed, swept = handles
        self._sweep(options, keep=(committed,))
        self._commitBatch(self._committer(options), options, 0, [committed])
        self._assertCommitted(options, [1, 2, 3], "after committing a killed worker's handle")
        self._assertNoLeftovers(options, "after sweeping the other killed worker")

    def test_a_batch_replayed_with_other_records_commits_only_the_decided_attempt(self) -> None:
        options = self._target()
        self._prepare(options, [1, 2, 3], attempt=0)
        decided = self._prepare(options, [11, 12], attempt=1)
        self._commitBatch(self._committer(options), options, 0, [decided])
        self._sweep(options, keep=(decided,), batchId=0)
        self._assertCommitted(options, [11, 12], "after committing the replay's attempt")
        self._assertNoLeftovers(options, "after sweeping the first attempt")

    # how the cases drive the sink ---------------------------------------------------------
    def _target(self) -> dict[str, str]:
        options = dict(self.newTarget())
        if optionOf(options, "sinkId") is None:
            options["sinkId"] = f"contract-{uuid.uuid4().hex[:8]}"
        return options

    def _sinkId(self, options: Mapping[str, str]) -> str:
        sinkId = optionOf(options, "sinkId")
        assert sinkId is not None
        return sinkId

    def _context(
        self, options: Mapping[str, str], batch: int, partition: int, attempt: int
    ) -> TransactionContext:
        return TransactionContext(
            self._sinkId(options), QUERY_ID, batch, partition, attempt, "contract-run", options
        )

    def _committer(self, options: Mapping[str, str]) -> Committer:
        committer = self.sink(dict(options)).createCommitter()
        assert isinstance(committer, Committer), f"createCommitter() returned {committer!r}"
        return committer

    def _prepare(
        self,
        options: Mapping[str, str],
        ids: Sequence[int],
        batch: int = 0,
        partition: int = 0,
        attempt: int = 0,
    ) -> Handle:
        """One task attempt through the framework's task runner; its handle as the log keeps it."""
        from twophase.spark.task import runTask  # plain Python: the runner imports no pyspark

        source = self.sink(dict(options))
        ctx = self._context(options, batch, partition, attempt)
        result = runTask(source.createWriter, ctx, [self.makeRows(ids)], alreadyDecided=False)
        assert result.handle is not None, "the task prepared no handle"
        return loadsHandle(dumpsHandle(result.handle))

    def _commitBatch(
        self,
        committer: Committer,
        options: Mapping[str, str],
        batchId: int,
        handles: Sequence[Handle],
    ) -> None:
        """What the coordinator does with a decided batch: commit each handle, then publish."""
        for handle in handles:
            self._retried(functools.partial(committer.commit, handle))
        sinkId = self._sinkId(options)
        self._retried(lambda: committer.completeBatch(sinkId, batchId, handles))

    def _sweep(
        self, options: Mapping[str, str], keep: tuple[Handle, ...], batchId: int | None = None
    ) -> list[Handle]:
        committer = self._committer(options)
        scope = RecoveryScope(self._sinkId(options), keep, batchId, options)
        return checkedAborted(committer, self._retried(lambda: committer.recoverAndAbort(scope)))

    def _retried(self, call: Callable[[], _T]) -> _T:
        """``call`` again after a ``TransientCommitError``, with the coordinator's kind of
        backoff, for at most ``transientSeconds``."""
        retrying = Retrying(
            retry=retry_if_exception_type(TransientCommitError),
            stop=stop_after_delay(self.transientSeconds),
            wait=wait_random_exponential(multiplier=0.05, max=2.0),
            reraise=True,
        )
        return retrying(call)

    def _committedIds(self, options: Mapping[str, str]) -> list[int]:
        table = self.readCommitted(options)
        assert isinstance(table, pa.Table), f"readCommitted returned {type(table).__name__}"
        assert "id" in table.column_names, f"readCommitted has no id column: {table.schema}"
        return sorted(table.column("id").to_pylist())

    def _assertCommitted(self, options: Mapping[str, str], ids: list[int], when: str) -> None:
        seen = self._committedIds(options)
        if seen != ids:
            pytest.fail(f"{when}, the committed ids are {seen}, not {ids}")

    def _assertNoLeftovers(self, options: Mapping[str, str], when: str) -> None:
        left = self.leftovers(options)
        assert isinstance(left, list), f"leftovers returned {type(left).__name__}, not a list"
        if left:
            pytest.fail(f"{when}, the target still holds {left}")


def _workerProcesses(sink: type[Any]) -> Any:
    """Processes that start as an executor's do, with nothing of this one's threads or open
    connections: forked from a clean server process that imported the task runner and the
    sink's module once (the first sink's, when several suites share the server)."""
    processes = multiprocessing.get_context("forkserver")
    processes.set_forkserver_preload([prepareThenDie.__module__, sink.__module__])
    return processes


def _column(field: pa.Field, ids: Sequence[int]) -> pa.Array:
    kind = field.type
    if pa.types.is_integer(kind):
        values: list[Any] = list(ids)
    elif pa.types.is_floating(kind):
        values = [float(i) for i in ids]
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        values = [f"{field.name}-{i}" for i in ids]
    elif pa.types.is_boolean(kind):
        values = [i % 2 == 0 for i in ids]
    else:
        values = [None] * len(ids)
    return pa.array(values, kind)
