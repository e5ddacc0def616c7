"""The targets of ``twophase.multi``: the ``targets`` option, and each target's own options.

``targets`` is ``name=kind,...``: the name is the struct column holding that target's columns and
the prefix of its options (``orders.url`` is option ``url`` of target ``orders``); the kind is a
built-in sink (``postgres``, ``kafka``, ``files``, ``delta``, ``iceberg``) or a data source class as
``module:Class``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from twophase.coordinator.formats import checkHandleVersion
from twophase.protocol import Handle
from twophase.settings import TwoPhaseConfigError, optionOf
from twophase.sinks.registry import multiTargetKinds

KIND = "multi"
"""The ``kind`` of a multi handle: ``{"kind": "multi", "parts": {target: handle}}``."""


SHARED_OPTIONS = ("checkpointlocation", "queryname")
"""Options of the query every target gets too (Spark passes them lower-cased)."""

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,39}$")
_CLASS = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass(frozen=True)
class Target:
    """One target: its name (struct column, option prefix), its kind and its sink id."""

    name: str
    kind: str
    sinkId: str


def parseTargets(options: Mapping[str, str], sinkId: str) -> list[Target]:
    """The ``targets`` option parsed and checked; errors name the option and the fix."""
    raw = optionOf(options, "targets")
    example = "option targets=orders=postgres,events=kafka"
    if not raw or not raw.strip():
        raise TwoPhaseConfigError(
            f"twophase.multi needs option targets (name=kind, comma-separated), e.g. {example}"
        )
    found: list[Target] = []
    for item in raw.split(","):
        name, sep, kind = (part.strip() for part in item.partition("="))
        if not sep or not name or not kind:
            raise TwoPhaseConfigError(
                f"option targets={raw!r}: {item.strip()!r} is not name=kind; e.g. {example}"
            )
        if not _NAME.match(name):
            raise TwoPhaseConfigError(
                f"option targets={raw!r}: target name {name!r} must be a letter followed by up "
                "to 39 letters, digits or '_' (it names the struct column and the options)"
            )
        if kind not in multiTargetKinds() and not _CLASS.match(kind):
            raise TwoPhaseConfigError(
                f"option targets={raw!r}: target {name!r} has kind {kind!r}; use one of "
                f"{', '.join(multiTargetKinds())} or a data source class as module:Class"
            )
        if any(t.name.lower() == name.lower() for t in found):
            raise TwoPhaseConfigError(f"option targets={raw!r}: target {name!r} appears twice")
        explicit = optionOf(options, f"{name}.sinkId")
        found.append(Target(name, kind, explicit or f"{sinkId}-{name.lower()}"))
    if len(found) < 2:
        raise TwoPhaseConfigError(
            f"option targets={raw!r} names one target; twophase.multi is for two or more "
            f"(for one, write with format('twophase.{found[0].kind}') directly)"
            if found[0].kind in multiTargetKinds()
            else f"option targets={raw!r} names one target; twophase.multi is for two or more"
        )
    return found


def targetOptions(options: Mapping[str, str], target: Target) -> dict[str, str]:
    """The options of one target: ``<name>.<option>`` with the prefix taken off, plus the
    query's shared ones and the target's sink id."""
    prefix = f"{target.name.lower()}."
    chosen = {k: v for k, v in options.items() if k.lower() in SHARED_OPTIONS}
    for key, value in options.items():
        if key.lower().startswith(prefix):
            chosen[key[len(prefix) :]] = value
    chosen["sinkId"] = target.sinkId
    return chosen


def refuseLostTargets(handle: Handle, targets: Sequence[Target]) -> None:
    """Refuse to commit a multi handle with a part for a target the query no longer has (its
    ``targets`` changed while the batch was decided): that part would never be committed, and
    the batch would be marked committed all the same."""
    parts = handle.get("parts")
    names = {t.name for t in targets}
    gone = sorted(str(n) for n in parts if n not in names) if isinstance(parts, dict) else []
    if gone:
        raise TwoPhaseConfigError(
            f"twophase.multi: batch {handle.get('batchId')} was decided with the targets "
            f"{', '.join(gone)}, which option targets no longer names; their parts of the batch "
            "would never be committed. Fix: start the query once more with those targets (and "
            "their options) and let it finish a batch, or run twophase recover with them; then "
            "change targets."
        )


def partOf(handle: Handle, name: str) -> Handle | None:
    """The handle of target ``name`` inside a multi handle (``None``: that target wrote nothing)."""
    parts = handle.get("parts")
    if not isinstance(parts, dict):
        raise ValueError(f"not a twophase.multi handle: {handle!r}")
    checkHandleVersion(handle, KIND)
    part = parts.get(name)
    return part if isinstance(part, dict) else None
