"""The log records a command shows on stderr: all of them with ``--debug``, else warnings, briefly.

Without ``--debug`` the command's own paragraph (``twophase.cli.errors``) says what failed, so
twophase's errors are not logged again, each warning is shown once per message template on one
short line without its traceback, and the Kafka clients' own chatter is silenced.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

BRIEF_LOG_CHARS = 200
"""Without ``--debug``, a log line is cut here: the command's own paragraph says the rest."""


class _Briefly(logging.Filter):
    """Without ``--debug``: warnings once per message template, on one short line, no
    traceback, and nothing the command says itself (the coordinator's errors become the
    command's one paragraph)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, object]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.name.startswith("twophase."):
            return False
        key = (record.name, record.msg)
        if key in self.seen:
            return False
        self.seen.add(key)
        message = " ".join(record.getMessage().split())
        if len(message) > BRIEF_LOG_CHARS:
            message = message[: BRIEF_LOG_CHARS - 3] + "..."
        record.msg, record.args = message, None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


@contextmanager
def commandLogging(err: TextIO, debug: bool, command: str) -> Iterator[None]:
    """Log records on ``err`` for the command's duration: everything with ``--debug``, else
    warnings only, briefly; the Kafka clients' own chatter only with ``--debug``."""
    root = logging.getLogger()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    if not debug:
        handler.addFilter(_Briefly())
    quiet = logging.INFO if debug and command != "doctor" else logging.WARNING
    saved = {name: logging.getLogger(name).level for name in ("", "kafka", "confluent_kafka")}
    root.addHandler(handler)
    root.setLevel(quiet)
    if not debug:
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
        logging.getLogger("confluent_kafka").setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
