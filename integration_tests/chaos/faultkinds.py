"""Faults beyond kills: how each kind reaches a running query, and how it heals.

A crashed process closes its sockets at once; these faults do not:

- ``freeze``: every process of a server stopped (SIGSTOP), as a paused VM or a stopped
  container: connections stay open and nothing answers; resumed (SIGCONT) after the event;
- ``partition``: the server's proxy drops every byte both ways and holds the connections open;
- ``slow``: the server's proxy delays every byte both ways;
- ``reply lost``: the server's proxy lets requests through and drops the answers, so a commit
  may be applied while its client hears nothing;
- ``disk full``: the pipeline's disk (a size-limited tmpfs holding the checkpoint and, for the
  files sink, the output and its staging area) filled to the last byte;
- ``past timeout``: the broker partitioned away for longer than the pipeline's Kafka
  transaction timeout while the query keeps running, so the broker aborts what was open.

The network kinds need the proxies of ``services/toxiproxy.sh`` between the query and its
servers (``servers.Services``); ``disk full`` needs a tmpfs, which only root may mount.

On the compose cluster (``cluster``), faults of whole nodes besides:

- ``worker lost``: a Spark worker's container killed with its executors, started again after
  the event;
- ``worker frozen``: a worker's container paused past Spark's network timeout, so the driver
  gives its executors up while they still hold their tasks, then resumed;
- ``worker cut off``: a worker disconnected from the servers' network while the driver and the
  master still reach it, then connected again;
- ``driver lost``: the driver's container killed; the next start is a new container;
- ``second driver``: a replacement driver started on the same checkpoint while the first still
  runs (or is paused, then resumed): the older one must be fenced off.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
from pathlib import Path

NODE_KINDS = ("worker lost", "worker frozen", "worker cut off", "driver lost", "second driver")
"""Faults of the compose cluster's nodes (``cluster``)."""
FAULT_KINDS = (
    "partition",
    "freeze",
    "slow",
    "reply lost",
    "disk full",
    "past timeout",
    *NODE_KINDS,
)
"""Every kind, in the order of the report's columns."""
WORKERS = ("spark-worker-1", "spark-worker-2")
"""The targets of the worker kinds: the compose cluster's workers."""
DRIVER = "driver"
"""The target of ``driver lost`` and ``second driver``: the running start's driver."""
NETWORK_KINDS = frozenset({"partition", "slow", "reply lost", "past timeout"})
"""Kinds delivered by a server's proxy."""
DISK = "disk"
"""The target of ``disk full``: the pipeline's own disk rather than a server."""
SLOW_LATENCY_MS = (300, 100)
"""Delay and jitter of ``slow``, added to every packet each way."""

log = logging.getLogger(__name__)


class Disk:
    """A size-limited tmpfs under a pipeline's work directory, which can be filled to the brim.

    ``fill`` takes every free byte with one preallocated file, so the next write of the
    checkpoint, the decision log or a staged file fails with ENOSPC; ``free`` deletes it.
    """

    def __init__(self, path: Path, sizeMb: int = 256) -> None:
        self.path = path
        self.sizeMb = sizeMb
        self._filler = path / ".chaos-filler"
        self.mounted = False

    @staticmethod
    def possible() -> bool:
        """Only root may mount a tmpfs; elsewhere the pipeline runs without ``disk full``."""
        return os.geteuid() == 0 and shutil.which("mount") is not None

    def mount(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.sizeMb}m", "chaos-disk", str(self.path)],
            check=True,
            capture_output=True,
        )
        self.mounted = True

    def fill(self) -> None:
        """Take every free byte: preallocate what ``statvfs`` says is free, halving the request
        each time the filesystem refuses it, down to one page."""
        stat = os.statvfs(self.path)
        chunk, offset = stat.f_bavail * stat.f_frsize, 0
        fd = os.open(self._filler, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            while chunk >= 4096:
                try:
                    os.posix_fallocate(fd, offset, chunk)
                    offset += chunk
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    chunk //= 2
        finally:
            os.close(fd)

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)

    def unmount(self, keepCopyIn: Path | None = None) -> None:
        """Unmount; ``keepCopyIn``: what it held is copied there (the mount point itself will
        do: the copy lands on the disk below once the tmpfs is gone)."""
        if not self.mounted:
            return
        self.free()
        copy = None
        if keepCopyIn is not None:
            copy = self.path.parent / f".{self.path.name}-copy"
            shutil.copytree(self.path, copy, dirs_exist_ok=True)
        done = subprocess.run(["umount", str(self.path)], capture_output=True)
        if done.returncode != 0:  # a process still holds a file: detach it anyway
            log.warning("umount %s: %s; detaching lazily", self.path, done.stderr.decode().strip())
            subprocess.run(["umount", "-l", str(self.path)], check=True)
        self.mounted = False
        if copy is not None and keepCopyIn is not None:
            shutil.copytree(copy, keepCopyIn, dirs_exist_ok=True)
            shutil.rmtree(copy)
