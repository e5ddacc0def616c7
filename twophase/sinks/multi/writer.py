"""The executor half of ``twophase.multi``: one transaction per target in each task attempt.

A task's input has one struct column per target; each Arrow batch is split into the targets'
batches (the struct's fields; a row whose struct is null goes to no transaction of that target)
and written to that target's open transaction. ``preCommit`` prepares every target's
transaction and returns their handles in one: the batch is decided on all of them or none.
A task that dies between preparing one target and the next leaves prepared transactions no
decision names, which each target's ``recoverAndAbort`` sweeps as for a single sink.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from twophase.protocol import Handle, TransactionContext, TransactionWriter
from twophase.redaction import getLogger
from twophase.sinks.multi.targets import KIND, Target

log = getLogger(__name__)


@dataclass
class MultiTransaction:
    """The open transactions of one task attempt, in the order of the targets."""

    ctx: TransactionContext = field(repr=False)
    txns: list[tuple[Target, TransactionWriter[Any], Any]]
    columns: dict[str, int] = field(default_factory=dict)


class MultiWriter(TransactionWriter[MultiTransaction]):
    """Executor side: the targets' writers driven together, one handle for all of them."""

    def __init__(self, parts: Sequence[tuple[Target, TransactionWriter[Any], dict[str, str]]]):
        self.parts = list(parts)

    def beginTransaction(self, ctx: TransactionContext) -> MultiTransaction:
        txns: list[tuple[Target, TransactionWriter[Any], Any]] = []
        try:
            for target, writer, options in self.parts:
                sub = replace(ctx, sinkId=target.sinkId, options=options)
                txns.append((target, writer, writer.beginTransaction(sub)))
        except BaseException:
            self._abortAll(txns)
            raise
        return MultiTransaction(ctx, txns)

    def write(self, txn: MultiTransaction, batch: pa.RecordBatch) -> None:
        if not txn.columns:
            txn.columns = _columnIndexes(batch.schema, [t.name for t, _, _ in txn.txns])
        for target, writer, open_ in txn.txns:
            part = _targetBatch(batch.column(txn.columns[target.name]))
            if part.num_rows:
                writer.write(open_, part)

    def preCommit(self, txn: MultiTransaction) -> Handle:
        parts: dict[str, Any] = {}
        for target, writer, open_ in txn.txns:
            parts[target.name] = writer.preCommit(open_)
        return {
            "kind": KIND,
            "batchId": txn.ctx.batchId,
            "partitionId": txn.ctx.partitionId,
            "attempt": txn.ctx.attemptNumber,
            "parts": parts,
        }

    def abortTransaction(self, txn: MultiTransaction) -> None:
        self._abortAll(txn.txns)

    @staticmethod
    def _abortAll(txns: Sequence[tuple[Target, TransactionWriter[Any], Any]]) -> None:
        for target, writer, open_ in txns:
            try:
                writer.abortTransaction(open_)
            except Exception:  # best effort: recovery sweeps what is left
                log.warning("multi: could not roll back target %s", target.name, exc_info=True)


def _columnIndexes(schema: pa.Schema, names: Sequence[str]) -> dict[str, int]:
    """Where each target's struct column is (exact name first, then any case)."""
    found: dict[str, int] = {}
    for name in names:
        index = schema.get_field_index(name)
        if index < 0:
            matches = [i for i, f in enumerate(schema) if f.name.lower() == name.lower()]
            index = matches[0] if len(matches) == 1 else -1
        if index < 0 or not pa.types.is_struct(schema.field(index).type):
            raise ValueError(
                f"twophase.multi: target {name!r} needs a struct column named {name!r} in the "
                f"input (columns: {', '.join(schema.names)})"
            )
        found[name] = index
    return found


def _targetBatch(column: pa.Array | pa.ChunkedArray) -> pa.RecordBatch:
    """The rows of one target: the struct's fields, without the rows whose struct is null."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    batch = pa.RecordBatch.from_struct_array(column)
    if column.null_count:
        batch = batch.filter(column.is_valid())
    return batch
