"""``sink.json`` beside a decision log: which class, with which safe options, finishes its work.

``twophase recover`` rebuilds a sink's committer from it in any process. The caller passes only
options that are safe to persist (``twophase.redaction.publicOptions``); secrets come back from
the environment, ``.pgpass`` or options given again on the command line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec

from twophase.coordinator.errors import DecisionLogWriteError
from twophase.redaction import getLogger

log = getLogger(__name__)

SINK_DESCRIPTION = "sink.json"


@dataclass(frozen=True)
class SinkDescription:
    """The sink id, its data source class as ``module:QualName`` and its persisted options."""

    sinkId: str
    className: str
    options: Mapping[str, str]

    def toText(self) -> str:
        return json.dumps(
            {"sinkId": self.sinkId, "class": self.className, "options": dict(self.options)},
            indent=2,
            sort_keys=True,
        )

    @classmethod
    def fromJson(cls, data: Any) -> SinkDescription:
        if not isinstance(data, dict) or not isinstance(data.get("class"), str):
            raise ValueError(f"{SINK_DESCRIPTION} is not a sink description: {data!r}")
        options = data.get("options") or {}
        return cls(
            str(data.get("sinkId", "")), data["class"], {str(k): str(v) for k, v in options.items()}
        )


def writeSinkDescription(logLocation: str, description: SinkDescription) -> None:
    """Write ``sink.json`` in the log directory, only when it changed (a batch costs one read).

    Written under a temporary name, then renamed; a write the filesystem refuses (a full or
    read-only disk) raises ``DecisionLogWriteError`` after removing the temporary file.
    """
    body = description.toText()
    fs, root = fsspec.core.url_to_fs(logLocation)
    path = f"{root.rstrip('/')}/{SINK_DESCRIPTION}"
    try:
        with fs.open(path, "r") as f:
            if f.read() == body:
                return
    except FileNotFoundError:
        pass
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fs.makedirs(root, exist_ok=True)
        with fs.open(tmp, "w") as f:
            f.write(body)
        fs.mv(tmp, path)
    except OSError as exc:
        try:
            if fs.exists(tmp):
                fs.rm(tmp)
        except OSError as rmError:  # the write's own error matters more
            log.warning("sink description %s: could not remove %s: %s", logLocation, tmp, rmError)
        record = f"the sink description ({SINK_DESCRIPTION})"
        raise DecisionLogWriteError(logLocation, record, exc) from exc


def readSinkDescription(logLocation: str) -> SinkDescription | None:
    """The ``sink.json`` of a log directory, or ``None`` when the sink never wrote one."""
    fs, root = fsspec.core.url_to_fs(logLocation)
    try:
        with fs.open(f"{root.rstrip('/')}/{SINK_DESCRIPTION}", "r") as f:
            return SinkDescription.fromJson(json.load(f))
    except FileNotFoundError:
        return None
