"""Runs documented example scripts one after another in one Python process, sharing its Spark.

Each example is a whole script that makes its session with ``getOrCreate()``; run in one
process, the second and later examples find the first one's session and skip a Spark start
(a new JVM and PySpark's daemons). Each still runs as ``__main__`` with its own ``sys.argv``,
environment and standard output. The child runs :func:`serve`; :class:`ExampleRunner` drives it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import runpy
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, Any

REPLY = "@@example-runner@@ "


class ExampleRunner:
    """A child process in ``cwd`` that runs example scripts in turn; started at the first
    :meth:`run`, and again after a run that timed out (which kills it)."""

    def __init__(self, cwd: Path) -> None:
        self._cwd = cwd
        self._child: subprocess.Popen[str] | None = None
        self._replies: queue.Queue[str | None] = queue.Queue()

    def run(self, script: Path, args: list[str], env: dict[str, str], timeout: float) -> list[str]:
        """Run ``script`` as ``__main__`` with ``args`` and ``env`` added to the environment;
        its output lines. Fails the test with its traceback, or when it takes over ``timeout``."""
        child = self._start()
        assert child.stdin is not None
        request = {"script": str(script), "args": args, "env": env}
        child.stdin.write(json.dumps(request) + "\n")
        child.stdin.flush()
        try:
            line = self._replies.get(timeout=timeout)
        except queue.Empty:
            self.close(kill=True)
            raise AssertionError(f"{script.name} did not end within {timeout:.0f} s") from None
        if line is None:
            self.close(kill=True)
            raise AssertionError(f"the example runner exited while running {script.name}")
        reply: dict[str, Any] = json.loads(line)
        assert reply["ok"], f"{script.name} failed:\n{reply['error']}\n{reply['stdout'][-3000:]}"
        return str(reply["stdout"]).splitlines()

    def close(self, *, kill: bool = False) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        if kill:
            child.kill()
        elif child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    def _start(self) -> subprocess.Popen[str]:
        if self._child is not None and self._child.poll() is None:
            return self._child
        env = dict(os.environ, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
        self._child = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=self._cwd,
        )
        self._replies = queue.Queue()
        assert self._child.stdout is not None
        threading.Thread(
            target=_readReplies, args=(self._child.stdout, self._replies), daemon=True
        ).start()
        return self._child


def _readReplies(stream: IO[str], replies: queue.Queue[str | None]) -> None:
    for line in stream:
        if line.startswith(REPLY):
            replies.put(line[len(REPLY) :])
    replies.put(None)


def serve() -> None:
    """Run each request read from standard input; answer each on standard output."""
    out = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        reply = runOne(request["script"], request["args"], request["env"])
        out.write(REPLY + json.dumps(reply) + "\n")
        out.flush()
    _stopSpark()


def runOne(script: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    captured = io.StringIO()
    saved = dict(os.environ)
    os.environ.update(env)
    sys.argv = [script, *args]
    sys.path[0] = str(Path(script).parent)  # as `python script.py` has it
    ok, error = True, ""
    try:
        with contextlib.redirect_stdout(captured):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        ok = exit.code in (None, 0)
        error = "" if ok else f"SystemExit({exit.code!r})"
    except BaseException:
        ok, error = False, traceback.format_exc()
    finally:
        os.environ.clear()
        os.environ.update(saved)
        _stopQueries()
    return {"ok": ok, "error": error, "stdout": captured.getvalue()}


def _stopQueries() -> None:
    """A failed example may leave its query running; the next one starts without it."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    for query in spark.streams.active if spark is not None else []:
        query.stop()


def _stopSpark() -> None:
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is not None:
        spark.stop()


if __name__ == "__main__":
    serve()
