"""What the systems hold for a ``twophase.multi`` sink, for ``twophase doctor``: each target's.

Every target is asked through its own sink's inspect module under its own sink id; what they
hold is listed together, each item named with its target. A logged multi handle names one
transaction per target, so its keys are its parts' keys.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from datetime import datetime
from types import ModuleType
from typing import TYPE_CHECKING

from twophase.doctor.findings import CannotCheck, Inspection
from twophase.doctor.run import inspectorOf
from twophase.protocol import Handle
from twophase.sinks.multi.targets import KIND

if TYPE_CHECKING:
    from twophase.sinks.multi.committer import MultiCommitter

BUILT_IN = ("postgres", "kafka", "files")


def _inspector(package: str) -> ModuleType:
    return importlib.import_module(f"twophase.sinks.{package}.inspect")


def handleKey(handle: Handle) -> tuple[str, ...]:
    """The names of a multi handle's parts, as each built-in target's committer names them."""
    if handle.get("kind") != KIND or not isinstance(handle.get("parts"), dict):
        return ()
    keys: list[str] = []
    for part in handle["parts"].values():
        if not isinstance(part, dict):
            continue
        for package in BUILT_IN:
            names = tuple(_inspector(package).handleKey(part))
            if names:
                keys.extend(names)
                break
    return tuple(keys)


def inspect(committer: MultiCommitter, sinkId: str, now: datetime) -> Inspection:
    """Read-only: every target's holdings; a target doctor cannot ask is said in ``where``."""
    places: list[str] = []
    merged = Inspection("multi", "")
    for target, part in committer.parts:
        inspector = inspectorOf(part)
        if inspector is None:
            places.append(f"{target.name}: not asked (a sink of your own)")
            continue
        try:
            found = inspector.inspect(part, target.sinkId, now)
        except CannotCheck as exc:
            raise CannotCheck(f"target {target.name}: {exc}") from None
        places.append(f"{target.name}: {found.system} at {found.where}")
        merged.held.extend(replace(h, what=f"{target.name}: {h.what}") for h in found.held)
        merged.otherStalls.extend(found.otherStalls)
    merged.where = "; ".join(places)
    return merged
