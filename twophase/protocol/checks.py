"""Where a sink's return values enter the framework: check them and name the fix.

A user's sink that returns the wrong thing should fail with its own class and method named,
not with a ``TypeError`` inside the coordinator or a log entry that cannot be read back.
"""

from __future__ import annotations

import json
from typing import Any

from twophase.protocol.errors import SinkContractError
from twophase.protocol.handles import Handle


def ownerName(owner: object) -> str:
    """``module.Class`` of the sink (or writer, or committer) that returned a value."""
    cls = owner if isinstance(owner, type) else type(owner)
    return f"{cls.__module__}.{cls.__qualname__}"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def checkedHandle(owner: object, value: Any) -> Handle:
    """``preCommit``'s return value, checked: a dict that survives ``json.dumps``.

    The handle is written to the decision log and read back by another process, so anything
    JSON cannot carry (a connection, a set, bytes) would be lost on the way.
    """
    where = f"{ownerName(owner)}.preCommit"
    if not isinstance(value, dict):
        raise SinkContractError(
            f"{where} returned {type(value).__name__} {_shown(value)}; it must return a dict "
            "(the handle) that any process can commit from, for example "
            '{"path": ..., "txnId": ...}'
        )
    try:
        text = json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise SinkContractError(
            f"{where} returned a handle that JSON cannot hold ({exc}); put only strings, "
            "numbers, booleans, None, lists and dicts with string keys in it"
        ) from None
    if json.loads(text) != value:
        raise SinkContractError(
            f"{where} returned a handle that changes on its way through JSON (tuples or "
            "non-string keys?); use lists and string keys"
        )
    return value


def checkedAborted(owner: object, value: Any) -> list[Handle]:
    """``recoverAndAbort``'s return value, checked: a list of handles; ``None`` means none."""
    if value is None:
        return []
    where = f"{ownerName(owner)}.recoverAndAbort"
    if not isinstance(value, list | tuple) or not all(isinstance(h, dict) for h in value):
        raise SinkContractError(
            f"{where} returned {type(value).__name__} {_shown(value)}; it must return a list "
            "of the handles (dicts) it aborted, or an empty list (None also means nothing)"
        )
    return list(value)


def checkedDescription(owner: object, value: Any, fallback: str) -> str:
    """``describe``'s return value: a string, else the fallback (a log line must not fail)."""
    return value if isinstance(value, str) else fallback
