"""``sink.json`` beside a decision log: which class, with which safe options, finishes its work.

``twophase recover`` rebuilds a sink's committer from it in any process. The caller passes only
options that are safe to persist (``twophase.redaction.publicOptions``); secrets come back from
the environment, ``.pgpass`` or options given again on the command line. It carries its own
``format`` (absent: 1, :mod:`~twophase.coordinator.formats`), checked by every read. A query
started again with another sink class while the log holds decided batches not committed is
refused before ``sink.json`` changes: only the class that prepared them can commit them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec

from twophase.coordinator import scans
from twophase.coordinator.errors import DecisionLogWriteError, SinkChangedError
from twophase.coordinator.formats import DESCRIPTION_FORMAT, refuseNewer, versionOf
from twophase.coordinator.storage import LogStorage
from twophase.redaction import getLogger
from twophase.version import __version__

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
            {
                "format": DESCRIPTION_FORMAT,
                "twophase": __version__,
                "sinkId": self.sinkId,
                "class": self.className,
                "options": dict(self.options),
            },
            indent=2,
            sort_keys=True,
        )

    @property
    def classQualName(self) -> str:
        """The class without its module: a built-in sink's binding moved between releases."""
        return self.className.rpartition(":")[2]

    @classmethod
    def fromJson(cls, data: Any, where: str = SINK_DESCRIPTION) -> SinkDescription:
        if not isinstance(data, dict):
            raise ValueError(f"{where} is not a sink description: {data!r}")
        found = versionOf(data.get("format"), where)
        refuseNewer(found, DESCRIPTION_FORMAT, where, data.get("twophase"))
        if not isinstance(data.get("class"), str):
            raise ValueError(f"{where} is not a sink description: {data!r}")
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
            text = f.read()
    except FileNotFoundError:
        text = None
    if text == body:
        return
    if text is not None:
        try:
            old = _parsed(text, logLocation)
        except ValueError as exc:  # nothing to keep (a newer format is no ValueError: it stops)
            log.warning("sink description %s: replacing an unreadable one: %s", logLocation, exc)
        else:
            refuseOtherClass(logLocation, old, description)
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


def refuseOtherClass(logLocation: str, old: SinkDescription, new: SinkDescription) -> None:
    """Raise ``SinkChangedError`` when ``new`` is another sink class than ``old`` (the one
    ``sink.json`` names) and the log holds decided batches not committed."""
    if old.classQualName == new.classQualName:
        return
    storage = LogStorage(logLocation, {})
    waiting = scans.outstanding(storage, storage.listing())
    if waiting:
        raise SinkChangedError(
            logLocation,
            new.sinkId,
            f"the query now writes with the sink class {new.className}, but {SINK_DESCRIPTION} "
            f"names {old.className}, the sink that decided the log's batches",
            f"the data source {old.className}, as {SINK_DESCRIPTION} names it",
            [s.batchId for s in waiting],
        )


def _parsed(text: str, logLocation: str) -> SinkDescription:
    where = f"{logLocation.rstrip('/')}/{SINK_DESCRIPTION}"
    try:
        return SinkDescription.fromJson(json.loads(text), where)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not complete JSON ({exc})") from None


def readSinkDescription(logLocation: str) -> SinkDescription | None:
    """The ``sink.json`` of a log directory, or ``None`` when the sink never wrote one;
    ``LogFormatError`` when a newer twophase wrote it in a newer format."""
    fs, root = fsspec.core.url_to_fs(logLocation)
    try:
        with fs.open(f"{root.rstrip('/')}/{SINK_DESCRIPTION}", "r") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    return _parsed(text, logLocation)
