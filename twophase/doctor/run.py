"""``twophase doctor``: for each sink of a checkpoint, ask its system and compare with the log.

Per sink: read the decision log, rebuild the sink's committer from ``sink.json`` (plus
``--sink-option`` and ``--sink-option-file``, as ``twophase recover`` does), ask the system
through the inspect module that the sink's entry in ``twophase.sinks.registry`` names,
classify, render. Read-only everywhere; no Spark session. Exit status: 0 clean, 1 findings
that need action or that the next start acts on, 2 could not check (no checkpoint, no log, a
server that does not answer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import ModuleType
from typing import Any, TextIO

import fsspec.core

from twophase.coordinator import DecisionLog
from twophase.coordinator.description import SINK_DESCRIPTION, readSinkDescription
from twophase.coordinator.paths import LOG_DIRECTORY, sinkLogLocations
from twophase.doctor.classify import Commands, HandleKey, classify
from twophase.doctor.findings import (
    EXIT_CANNOT_CHECK,
    CannotCheck,
    Inspection,
    SinkReport,
    exitStatus,
)
from twophase.doctor.listing import listedHeld
from twophase.doctor.render import writeJson, writeText
from twophase.protocol import Committer, Handle, listsPrepared
from twophase.redaction import getLogger, redact
from twophase.sinks.registry import specOfModule

log = getLogger(__name__)

SinkLoader = Callable[[str, Mapping[str, str]], tuple[Any, dict[str, str]]]
"""``twophase.cli.checkpoint.loadSink``: a log directory and extra options -> (committer,
options)."""


@dataclass(frozen=True)
class RecoverCommand(Commands):
    """``Commands`` whose ``twophase recover`` also names the operator's option files.

    Options read from a ``--sink-option-file`` are not spelled out as ``--option KEY=...``:
    the fix points at the same file, so a secret kept there stays out of the command line.
    """

    optionFiles: tuple[str, ...] = ()

    @property
    def recover(self) -> str:
        files = "".join(f" --sink-option-file {path}" for path in self.optionFiles)
        return f"{super().recover}{files}"


def inspectorOf(committer: object) -> ModuleType | None:
    """The inspect module that the registry names for a built-in committer's sink, or ``None``
    (a user's sink: doctor checks its log only)."""
    spec = specOfModule(type(committer).__module__)
    return None if spec is None else spec.inspectorModule()


def listedBySink(committer: Committer, sinkId: str) -> tuple[Inspection, HandleKey]:
    """A user's sink in the narrow form, asked through its own ``listPrepared``: what it holds
    prepared, named as its ``preparedNames`` names a logged handle."""
    system = type(committer).__name__
    held = listedHeld(committer, system, sinkId)

    def handleKey(handle: Handle) -> tuple[str, ...] | None:
        return tuple(committer.preparedNames(handle)) or None

    return Inspection(system, "as its listPrepared lists it", held), handleKey


def checkSink(
    sinkId: str,
    url: str,
    checkpoint: str,
    loadSink: SinkLoader,
    extraOptions: Mapping[str, str],
    now: datetime,
    inFlightSeconds: float,
    optionFiles: Sequence[str] = (),
    fileOptionKeys: frozenset[str] = frozenset(),
) -> SinkReport:
    """Everything doctor says about one sink (never raises for a system's trouble)."""
    report = SinkReport(sinkId, url)
    decisionLog = DecisionLog(url)
    inspection: Inspection | None = None
    handleKey = None
    try:
        if readSinkDescription(url) is None:
            raise CannotCheck(
                f"{url} has no {SINK_DESCRIPTION}: the sink never planned a batch with this "
                "version of twophase, so doctor cannot tell which system to ask"
            )
        committer, _ = loadSink(url, extraOptions)
        inspector = inspectorOf(committer)
        if inspector is None and listsPrepared(committer):
            inspection, handleKey = listedBySink(committer, sinkId)
            report.system, report.where = inspection.system, inspection.where
        elif inspector is None:
            report.system = type(committer).__name__
            report.where = (
                "not asked: the sink lists nothing it prepared (listPrepared, "
                "docs/writing-a-sink.md); its decision log alone is checked"
            )
        else:
            report.system = inspector.__name__.split(".")[-2]
            inspection = inspector.inspect(committer, sinkId, now)
            handleKey = inspector.handleKey
            report.system, report.where = inspection.system, inspection.where
            report.grants, report.grantsMissing = inspection.grants, inspection.grantsMissing
    except CannotCheck as exc:
        report.cannotCheck = str(exc)
    except SystemExit as exc:  # loadSink's own message for an unusable sink.json
        report.cannotCheck = str(exc.code)
    except Exception as exc:  # bad options, a missing module: one line, no traceback
        report.cannotCheck = (
            f"cannot rebuild the sink from {SINK_DESCRIPTION}: {type(exc).__name__}: "
            f"{redact(' '.join(str(exc).split()))}"
        )
    lineKeys = tuple(sorted(k for k in extraOptions if k not in fileOptionKeys))
    commands = RecoverCommand(checkpoint, sinkId, lineKeys, tuple(optionFiles))
    try:
        report.findings = classify(
            sinkId, decisionLog, inspection, handleKey, commands, now, inFlightSeconds
        )
    except Exception as exc:  # an unreadable log: say so in one line, no traceback
        report.cannotCheck = (
            f"cannot read the decision log {url}: {type(exc).__name__}: "
            f"{redact(' '.join(str(exc).split()))}"
        )
        return report
    if report.cannotCheck is not None:  # the log alone says nothing about the system
        report.findings = [f for f in report.findings if f.needsAction]
    return report


def doctor(
    checkpoint: str,
    sinkId: str | None,
    asJson: bool,
    out: TextIO,
    loadSink: SinkLoader,
    extraOptions: Mapping[str, str] | None = None,
    inFlightSeconds: float = 0.0,
    optionFiles: Sequence[str] = (),
    fileOptionKeys: frozenset[str] = frozenset(),
) -> int:
    """Run ``twophase doctor`` and return its exit status (see the module docstring).

    ``optionFiles`` are the ``--sink-option-file`` paths and ``fileOptionKeys`` the options
    that came only from them: the fixes doctor prints name the files, not those options.
    """
    now = datetime.now(UTC)
    problem = _missing(checkpoint, sinkId)
    if problem is not None:
        if asJson:
            writeJson([], EXIT_CANNOT_CHECK, now, out, problem)
        else:
            out.write(redact(f"twophase doctor: {problem}") + "\n")
        return EXIT_CANNOT_CHECK
    reports = [
        checkSink(
            name,
            url,
            checkpoint,
            loadSink,
            extraOptions or {},
            now,
            inFlightSeconds,
            optionFiles,
            fileOptionKeys,
        )
        for name, url in sinkLogLocations(checkpoint, sinkId)
    ]
    status = exitStatus(reports)
    (writeJson if asJson else writeText)(reports, status, now, out)
    return status


def _missing(checkpoint: str, sinkId: str | None) -> str | None:
    """Why there is nothing to check, or ``None``."""
    try:
        fs, root = fsspec.core.url_to_fs(checkpoint)
        exists = bool(fs.exists(root))
    except (OSError, ValueError, ImportError) as exc:
        return f"cannot open the checkpoint {checkpoint}: {type(exc).__name__}: {exc}"
    if not exists:
        return f"no checkpoint at {checkpoint}; give the query's checkpointLocation"
    if not any(True for _ in sinkLogLocations(checkpoint, sinkId)):
        which = f" for sink {sinkId}" if sinkId else ""
        return f"no twophase decision log{which} under {checkpoint.rstrip('/')}/{LOG_DIRECTORY}"
    return None
