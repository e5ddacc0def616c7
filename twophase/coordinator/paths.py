"""Where decision logs live: one folder per sink under ``<checkpointLocation>/twophase/``."""

from __future__ import annotations

from collections.abc import Iterator

import fsspec.core

LOG_DIRECTORY = "twophase"
"""The folder of a checkpoint that holds one decision log per sink."""


def logLocationFor(checkpointLocation: str, sinkId: str) -> str:
    """Where the log of ``sinkId`` lives by default: ``<checkpointLocation>/twophase/<sinkId>``.

    ``sinkId`` must be usable as one path segment.
    """
    if not sinkId or "/" in sinkId or sinkId in (".", ".."):
        raise ValueError(f"sink id {sinkId!r} cannot name a directory")
    return f"{checkpointLocation.rstrip('/')}/{LOG_DIRECTORY}/{sinkId}"


def sinkLogLocations(
    checkpointLocation: str, sinkId: str | None = None
) -> Iterator[tuple[str, str]]:
    """(sinkId, log URL) of every sink log under ``<checkpointLocation>/twophase/``."""
    fs, root = fsspec.core.url_to_fs(checkpointLocation)
    base = f"{root.rstrip('/')}/{LOG_DIRECTORY}"
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    prefix = "" if protocol in ("file", "local") else f"{protocol}://"
    try:
        entries = fs.ls(base, detail=True)
    except FileNotFoundError:
        return
    for entry in sorted(entries, key=lambda e: str(e["name"])):
        if entry["type"] != "directory":
            continue
        name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
        if sinkId is None or name == sinkId:
            yield name, f"{prefix}{entry['name']}"
