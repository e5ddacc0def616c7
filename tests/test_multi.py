"""twophase.multi without servers: the targets option, each target's options, the row split."""

from __future__ import annotations

import pyarrow as pa
import pytest

from twophase.protocol.fingerprint import combined, differenceOf
from twophase.settings import TwoPhaseConfigError
from twophase.sinks.multi import Target, parseTargets, targetOptions
from twophase.sinks.multi.writer import _columnIndexes, _targetBatch


def test_targets_and_their_options() -> None:
    options = {
        "targets": " orders=postgres , events=my.module:Sink",
        "orders.url": "postgresql://u@h/db",
        "events.topic": "t",
        "events.sinkid": "custom",
        "checkpointlocation": "/ckpt",
        "unrelated": "x",
    }
    orders, events = parseTargets(options, "tp-1")
    assert orders == Target("orders", "postgres", "tp-1-orders")
    assert events == Target("events", "my.module:Sink", "custom")
    assert targetOptions(options, orders) == {
        "checkpointlocation": "/ckpt",
        "url": "postgresql://u@h/db",
        "sinkId": "tp-1-orders",
    }
    with pytest.raises(TwoPhaseConfigError, match="write with format\\('twophase.kafka'\\)"):
        parseTargets({"targets": "events=kafka"}, "tp-1")


def test_rows_split_by_target_and_null_structs_skip_a_target() -> None:
    ids = pa.array([1, 2, 3], pa.int64())
    orders = pa.StructArray.from_arrays([ids], names=["id"])
    events = pa.StructArray.from_arrays(
        [ids.cast(pa.string())], names=["key"], mask=pa.array([False, True, False])
    )
    batch = pa.RecordBatch.from_arrays([orders, events, ids], names=["Orders", "events", "x"])
    where = _columnIndexes(batch.schema, ["orders", "events"])
    assert where == {"orders": 0, "events": 1}
    assert _targetBatch(batch.column(0)).column("id").to_pylist() == [1, 2, 3]
    assert _targetBatch(batch.column(1)).column("key").to_pylist() == ["1", "3"]
    with pytest.raises(ValueError, match="target 'x' needs a struct column named 'x'"):
        _columnIndexes(batch.schema, ["x"])


def test_a_combined_fingerprint_says_which_target_differs() -> None:
    logged = combined({"events": "2:01:02", "orders": "2:03:04"})
    assert differenceOf(logged, logged) is None
    replay = combined({"events": "1:01:02", "orders": "2:03:04"})
    assert differenceOf(logged, replay) == "events: 2 records were prepared, the replay gave 1"
