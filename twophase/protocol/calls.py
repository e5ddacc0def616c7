"""Which batch a committer call serves, for code that wraps a committer.

A handle is the sink's own JSON and need not name its batch; the coordinator knows it for every
commit and abort it makes. It says so here around each such call (``servingBatch``), so a
wrapper of the sink's committer (fault injection, ``twophase.faults``) can read it
(``batchOfCall``) without the coordinator knowing about the wrapper.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_batch: ContextVar[int | None] = ContextVar("twophase.batchOfCall", default=None)


@contextmanager
def servingBatch(batchId: int) -> Iterator[None]:
    """The committer calls made inside serve batch ``batchId`` (in this thread)."""
    token = _batch.set(batchId)
    try:
        yield
    finally:
        _batch.reset(token)


def batchOfCall() -> int | None:
    """The batch the committer call in progress serves; ``None`` outside ``servingBatch``."""
    return _batch.get()
