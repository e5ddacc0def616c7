"""librdkafka's log lines of the admin clients and consumers, into Python logging, once each.

Without a ``logger`` librdkafka prints to stderr itself, and a cluster that refuses connections
yields a ``FAIL`` line per reconnect attempt: hundreds before an operator's command can say the
one thing that matters (the cluster is unreachable). :class:`ClientLog` forwards the first line
of each kind (facility and broker) at its own level, redacted, and the repeats at DEBUG.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from twophase.redaction import getLogger, redact

log = getLogger("twophase.kafka.librdkafka")

_VARYING = re.compile(r"\(after \d+ms[^)]*\)|\d+ms")
"""Parts of a line that differ between otherwise equal repeats (elapsed times)."""


class ClientLog:
    """A confluent-kafka ``logger``: ``log(level, "%s [%s] %s", facility, client, message)``."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def log(self, level: int, fmt: str, *args: Any) -> None:
        facility = str(args[0]) if args else ""
        message = str(args[2]) if len(args) > 2 else fmt
        kind = f"{facility} {_VARYING.sub('', message)}"
        with self._lock:
            first = kind not in self._seen
            self._seen.add(kind)
        shown = level if first else logging.DEBUG
        if log.isEnabledFor(shown):
            repeats = "" if first else " (again)"
            log.log(shown, "librdkafka %s %s: %s%s", self.what, facility, redact(message), repeats)
