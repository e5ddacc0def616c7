"""A query's checkpoint as ``status``, ``recover`` and ``doctor`` read it: its sinks and their logs.

``--checkpoint`` and ``--sink-id`` choose the sinks; ``logLocations`` finds their decision logs
(or says in a ``CommandError`` why there are none); ``loadSink`` rebuilds a sink's committer
from the ``sink.json`` beside its log plus the options the operator gives again. Nothing here
writes to the checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import fsspec.core

from twophase.cli.errors import CommandError
from twophase.coordinator.description import SINK_DESCRIPTION, readSinkDescription
from twophase.coordinator.paths import LOG_DIRECTORY, sinkLogLocations
from twophase.loading import importQualified
from twophase.protocol import Committer
from twophase.redaction import rememberSecrets
from twophase.sinks.registry import bindingNamed


def addCheckpointArguments(cmd: Any) -> None:
    """``--checkpoint`` (required) and ``--sink-id`` on a subcommand."""
    cmd.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
    cmd.add_argument("--sink-id", help="only this sink (default: every sink of the query)")


def logLocations(checkpoint: str, sinkId: str | None) -> list[tuple[str, str]]:
    """(sinkId, log URL) of the sinks to act on; a ``CommandError`` saying why there are none."""
    try:
        fs, root = fsspec.core.url_to_fs(checkpoint)
        exists = bool(fs.exists(root))
    except (OSError, ValueError, ImportError) as exc:
        raise CommandError(
            f"cannot open the checkpoint {checkpoint}: {type(exc).__name__}: {exc}. Fix: give "
            "the query's checkpointLocation, with the storage's credentials in the environment"
        ) from None
    if not exists:
        raise CommandError(
            f"no checkpoint at {checkpoint}. Fix: give the query's checkpointLocation (the "
            "option its writeStream got)"
        )
    found = list(sinkLogLocations(checkpoint, sinkId))
    if found:
        return found
    base = f"{checkpoint.rstrip('/')}/{LOG_DIRECTORY}"
    others = [name for name, _ in sinkLogLocations(checkpoint)]
    if sinkId is not None and others:
        raise CommandError(
            f"no decision log of sink {sinkId} under {base}: this checkpoint's query has the "
            f"sinks {', '.join(others)}. Fix: --sink-id one of them, or the checkpoint of the "
            f"query whose sink is {sinkId}"
        )
    raise CommandError(
        f"no twophase decision log under {base}: {checkpoint} is not the checkpoint of a "
        "query with a twophase sink, or its sink never decided a batch. Fix: give the "
        "checkpointLocation of the query that wrote with the twophase sink"
    )


def loadSink(url: str, extraOptions: Mapping[str, str]) -> tuple[Committer, dict[str, str]]:
    """Rebuild the committer of the sink described by ``sink.json`` in a log directory.

    ``sink.json`` holds only the sink's safe options; ``extraOptions`` (``--sink-option``,
    ``--sink-option-file``) add what it lacks, such as a password, and win over the stored
    ones. Reads ``sink.json``, never writes it: the query alone writes it.
    """
    description = readSinkDescription(url)
    if description is None:
        raise CommandError(
            f"{url} has no {SINK_DESCRIPTION}: the sink never planned a batch with this "
            "version of twophase, so recover cannot know which sink finishes its transactions. "
            "Fix: restart the query (its start finishes what the log decided)"
        )
    className = bindingNamed(description.className)
    try:
        target: Any = importQualified(className)
    except (ImportError, AttributeError) as exc:
        raise CommandError(
            f"{url}/{SINK_DESCRIPTION} names the sink class {className}, which cannot be "
            f"imported here ({type(exc).__name__}: {exc}). Fix: install the package that "
            "provides it in this environment"
        ) from None
    options = {**description.options, **extraOptions}
    rememberSecrets(extraOptions, getattr(target, "safeOptions", ()))
    sink = target(options)
    makeCommitter = getattr(sink, "createCommitter", None)
    committer = makeCommitter() if makeCommitter is not None else sink
    return committer, options
