"""SIGTERM stops the supervised queries cleanly, whichever process of the driver receives it.

Kubernetes, YARN and systemd end a driver with SIGTERM, then SIGKILL after a grace period. Who
receives it depends on how the driver runs: ``python app.py`` makes Python the main process
(the JVM is its child); ``spark-submit app.py`` makes the JVM the main process, whose default
answer runs Spark's shutdown hooks, which stop the SparkContext mid-batch. ``watch`` installs a
handler in both: in Python (from the main thread) and, on a classic session, in the driver JVM
through Py4J's callback server. Either stops every running ``SupervisedQuery`` cleanly
(``stop``), each within its own ``stopTimeout``, and returns: the application's own code, in
``awaitTermination``, then goes on and exits. With nothing supervised running, the signal
takes its earlier course.
"""

from __future__ import annotations

import os
import signal
import threading
import weakref
from typing import Any, Protocol

from twophase.redaction import getLogger

log = getLogger(__name__)


class Stoppable(Protocol):
    @property
    def isActive(self) -> bool: ...

    def stopOnSignal(self, source: str) -> None: ...


_watched: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_python: dict[str, Any] = {}
"""The Python handler before ours, once ours is installed (``previous``)."""
_jvm: dict[int, Any] = {}
"""Per JVM gateway (its id), the handler object we gave it and the JVM's handler before."""


def watch(supervised: Stoppable) -> None:
    """Stop ``supervised`` cleanly on SIGTERM; installs the handlers once per process and JVM."""
    with _lock:
        _watched.add(supervised)
        _installPython()
        _installJvm()


def onSigterm(source: str) -> bool:
    """Stop every running supervised query cleanly, each on a thread of its own; False when
    none runs."""
    running = [s for s in list(_watched) if s.isActive]
    if not running:
        return False
    log.warning(
        "twophase: SIGTERM (%s): stopping %d supervised quer%s cleanly",
        source,
        len(running),
        "y" if len(running) == 1 else "ies",
    )
    for supervised in running:
        threading.Thread(
            target=supervised.stopOnSignal, args=(source,), name="twophase-sigterm", daemon=True
        ).start()
    return True


def _installPython() -> None:
    if "previous" in _python:
        return
    if threading.current_thread() is not threading.main_thread():
        log.info(
            "twophase: SIGTERM is not handled in Python: supervise was called outside the main "
            "thread (the driver JVM's handler still stops the queries on a classic session)"
        )
        _python["previous"] = None
        return
    _python["previous"] = signal.signal(signal.SIGTERM, _pythonHandler)


def _pythonHandler(signum: int, frame: Any) -> None:
    if onSigterm("the Python driver process"):
        return
    previous = _python.get("previous")
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


class _JvmHandler:
    """The driver JVM's SIGTERM handler, in Python through Py4J's callback server."""

    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway
        self.previous: Any = None

    def handle(self, sig: Any) -> None:
        if onSigterm("the driver JVM"):
            return
        previous = self.previous
        name = "" if previous is None else str(previous.getClass().getName())
        if previous is not None and "NativeSignalHandler" not in name:
            previous.handle(sig)
            return
        log.warning("twophase: SIGTERM in the driver JVM with no supervised query running: exiting")
        self.gateway.jvm.java.lang.System.exit(143)

    class Java:
        implements = ["sun.misc.SignalHandler"]


def _installJvm() -> None:
    try:
        from pyspark import SparkContext
        from pyspark.java_gateway import ensure_callback_server_started
    except ImportError:
        return
    gateway = SparkContext._gateway
    if gateway is None or id(gateway) in _jvm:
        return
    try:
        ensure_callback_server_started(gateway)
        handler = _JvmHandler(gateway)
        jvm = gateway.jvm
        handler.previous = jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal("TERM"), handler)
    except Exception as exc:  # a JVM that will not take it: Python's handler alone
        log.info("twophase: SIGTERM is not handled in the driver JVM: %s", exc)
        handler = None
    _jvm[id(gateway)] = handler


__all__ = ["onSigterm", "watch"]
