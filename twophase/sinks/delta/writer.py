"""The Delta sink's writer: the files sink's, on the table's data files' settings."""

from __future__ import annotations

from twophase.sinks.delta.settings import DeltaSettings
from twophase.sinks.files import FilesWriter


class DeltaWriter(FilesWriter):
    """Tasks stage the batch's Parquet files as ``twophase.files`` does, outside the table;
    the committer moves them in and adds them to the log."""

    def __init__(self, settings: DeltaSettings) -> None:
        super().__init__(settings.files)
