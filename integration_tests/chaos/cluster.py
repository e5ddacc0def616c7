"""The chaos runner on the compose cluster: each start's driver in a container, faults of nodes.

``make compose-up`` runs a Spark standalone cluster beside the servers (docker-compose.yml).
Here a start's driver is a ``spark-driver`` container (``docker compose run``) whose executors
run on the two workers; Spark's checkpoint is on the S3 server through ``s3a://``, the decision
log beside it, file outputs on S3 too. The harness keeps its own files (the spec, each start's
log, the markers of the protocol points that fired) in a directory of the host that the workers
and drivers mount at the same path (``docker/chaos.yml``). The servers are reached by service
name inside the network; the runner, its checks and its live reader reach the same servers on
the host's published ports (``services/docker.env``).

Besides the kinds of a run on one machine (an executor killed, a server killed or frozen by
``docker compose``), the node kinds of ``faultkinds.NODE_KINDS``: a worker's container killed,
paused past Spark's network timeout or cut off from the servers' network; the driver's
container killed; a second driver started on the same checkpoint while the first runs or is
paused. The Toxiproxy kinds and ``disk full`` are the single machine's.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_fixed

from integration_tests.chaos.faultkinds import DRIVER, WORKERS
from integration_tests.chaos.report import Kill
from integration_tests.chaos.runner import ChaosRun
from integration_tests.chaos.schedule import Event, Schedule
from integration_tests.chaos.servers import Services
from integration_tests.chaos.spec import PipelineSpec
from integration_tests.spark_processes import REPO_ROOT

SHARED_ENV = "TWOPHASE_CLUSTER_SHARED"
DEFAULT_SHARED = "/tmp/twophase-cluster"
COMPOSE = REPO_ROOT / "docker" / "compose.sh"
OVERLAY = REPO_ROOT / "docker" / "chaos.yml"
PROJECT = "twophase"
DATA_NETWORK = f"{PROJECT}_data"
MASTER = "spark://spark-master:7077"
PIPELINES = ("multi", "kafka-kafka", "kafka", "postgres", "delta", "s3", "mariadb")
"""The chaos pipelines that run on the cluster: every one whose outputs an executor on another
host can reach (``files`` and ``iceberg`` keep theirs on one host's disk)."""
PROCESS_KINDS = ("executor",)
"""Timed kills of the query's processes on the cluster; its driver is lost as a node."""
IN_CLUSTER = {
    "127.0.0.1:9092": "kafka:19092",
    "127.0.0.1:5432": "postgres:5432",
    "127.0.0.1:3306": "mariadb:3306",
    "127.0.0.1:7070": "s3:7070",
}
"""The servers' published addresses (``services/docker.env``) and the same servers by service
name, as a container reaches them."""
SPARK_CONF = {
    "spark.driver.bindAddress": "0.0.0.0",
    "spark.executor.memory": "1g",
    # Two pipelines side by side: each takes a core of each worker, an executor on each.
    "spark.cores.max": "2",
    # A frozen worker's executors are given up after 30 s (checked every 5 s), not 120 s.
    "spark.network.timeout": "30s",
    "spark.network.timeoutInterval": "5s",
    "spark.executor.heartbeatInterval": "3s",
    "spark.hadoop.fs.s3a.endpoint": "http://s3:7070",
    "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
    "spark.hadoop.fs.s3a.path.style.access": "true",
    "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
}
"""The drivers' Spark settings on the cluster (the S3A keys come from the ``spark-driver``
container's ``AWS_*`` variables, as the decision log's do)."""
KAFKA_TIMEOUT_MS = "60000"
"""The Kafka targets' transaction timeout on the cluster: the one-machine runs' 15 s is shorter
than a batch whose tasks wait for a lost or frozen worker's, and a transaction that outlives
it is written again, a restart each (the ``past timeout`` kind belongs to those runs)."""
SECOND_DRIVER_GRACE = 180.0
"""Seconds the first driver has, after a second one took over, to stop by itself (fenced, or
refused by Spark's own check of its checkpoint) before it is killed."""
PROGRESS_EVERY = 1.0
"""Seconds between two listings of the checkpoint on S3."""


def inCluster(text: str) -> str:
    """``text`` with every published address replaced by the service's name."""
    for published, internal in IN_CLUSTER.items():
        text = text.replace(published, internal)
    return text


class Cluster:
    """The compose cluster as the chaos runner drives it: its containers, its networks, its
    drivers. ``shared`` is the host directory the workers and drivers mount."""

    def __init__(self, shared: Path | None = None) -> None:
        self.shared = (shared or Path(os.environ.get(SHARED_ENV, DEFAULT_SHARED))).resolve()
        self.shared.mkdir(parents=True, exist_ok=True)

    def _run(
        self, words: list[str], timeout: float, check: bool
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, SHARED_ENV: str(self.shared)}
        done = subprocess.run(words, env=env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(words)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
            )
        return done

    def compose(self, *words: str, timeout: float = 300, check: bool = True) -> Any:
        """``docker compose`` with docker-compose.yml and the chaos overlay."""
        return self._run([str(COMPOSE), "compose", "-f", str(OVERLAY), *words], timeout, check)

    def docker(self, *words: str, timeout: float = 120, check: bool = True) -> Any:
        return self._run(["docker", *words], timeout, check)

    def up(self) -> None:
        """Every service running and healthy, the workers with the shared directory mounted
        (they are made again when they run without it). Fails clearly when the cluster is
        not up at all."""
        probe = self.docker("inspect", self.container("spark-master"), check=False)
        if probe.returncode != 0:
            raise RuntimeError(
                "the compose cluster is not running: start it with `make compose-up` "
                f"(docker inspect: {probe.stderr.strip()})"
            )
        self.compose("up", "-d", "--wait", "--wait-timeout", "300", timeout=420)

    @staticmethod
    def container(service: str) -> str:
        return f"{PROJECT}-{service}-1"

    # -- node faults ------------------------------------------------------------------------

    def loseWorker(self, worker: str) -> None:
        self.docker("kill", self.container(worker))

    def restoreWorker(self, worker: str) -> None:
        """Start a lost worker again; returns once the master lists it as alive."""
        self.compose("up", "-d", "--no-deps", "--wait", worker)

    @retry(
        retry=retry_if_exception_type(RuntimeError),
        stop=stop_after_attempt(5),
        wait=wait_fixed(1),
        reraise=True,
    )
    def pause(self, name: str) -> None:
        """``docker pause``, tried again: the cgroup freezer can refuse a container whose
        processes are busy starting others ("unable to freeze")."""
        self.docker("pause", name)

    def unpause(self, name: str) -> None:
        self.docker("unpause", name, check=False)  # a container gone meanwhile: nothing to do

    def cutOff(self, worker: str) -> None:
        self.docker("network", "disconnect", DATA_NETWORK, self.container(worker))

    def reconnect(self, worker: str) -> None:
        self.docker("network", "connect", DATA_NETWORK, self.container(worker))

    # -- drivers ----------------------------------------------------------------------------

    def startDriver(
        self, name: str, spec: PipelineSpec, specPath: Path, crash: dict[str, str], out: IO[bytes]
    ) -> ContainerDriver:
        """A ``spark-driver`` container called ``name`` running ``spec`` (written to
        ``specPath`` with the servers' in-cluster addresses and the driver's own host)."""
        conf = {**spec.sparkConf, "spark.driver.host": name}
        child = PipelineSpec(**{**asdict(spec), "sparkConf": conf})
        specPath.write_text(inCluster(json.dumps(asdict(child), indent=1)))
        env = {**crash, "TWOPHASE_LOG_LEVEL": os.environ.get("TWOPHASE_LOG_LEVEL", "INFO")}
        words = [str(COMPOSE), "compose", "-f", str(OVERLAY), "run", "--rm", "-T"]
        words += ["--name", name]
        for key, value in env.items():
            words += ["-e", f"{key}={value}"]
        words += ["spark-driver", "python", "-m", "integration_tests.chaos.pipeline"]
        words.append(str(specPath))
        process = subprocess.Popen(
            words,
            env={**os.environ, SHARED_ENV: str(self.shared)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return ContainerDriver(self, name, process)


class ContainerDriver:
    """A start's driver in a container of its own (``LocalDriver``'s counterpart)."""

    def __init__(self, cluster: Cluster, name: str, process: subprocess.Popen[bytes]) -> None:
        self.cluster = cluster
        self.name = name
        self.process = process

    def poll(self) -> int | None:
        """The driver's exit status; a container killed (137) reads as a SIGKILL."""
        code = self.process.poll()
        return -signal.SIGKILL if code == 128 + signal.SIGKILL else code

    def kill(self) -> None:
        """The driver's container killed: its JVM, its Python workers, all at once."""
        self.cluster.docker("kill", self.name, check=False)

    def dumpThreads(self) -> None:
        """The driver JVM's threads printed to its log (SIGQUIT)."""
        self.cluster.docker("exec", self.name, "pkill", "-QUIT", "java", check=False)

    def executorPids(self) -> list[int]:
        """The executor JVMs of this driver's application, on either worker (a container's
        processes are the host's too): those whose driver URL names this driver's host."""
        mark = f"@{self.name}:".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:  # gone meanwhile
                continue
            if b"CoarseGrainedExecutorBackend" in cmdline and mark in cmdline:
                pids.append(int(entry.name))
        return sorted(pids)

    def end(self) -> None:
        """The container removed, whatever state it is in, and its ``docker`` client gone."""
        self.cluster.docker("rm", "-f", self.name, check=False)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def progressFilesystem(s3: Any) -> Any:
    """The runner's own view of the S3 server, where every checkpoint is: requests bounded in
    seconds and not retried, so that a fault of that server (which the runner itself heals)
    never holds the runner in a listing."""
    import s3fs

    fs = s3fs.S3FileSystem(
        endpoint_url=s3.endpoint,
        key=s3.accessKey,
        secret=s3.secretKey,
        skip_instance_cache=True,
        config_kwargs={
            "connect_timeout": 2,
            "read_timeout": 3,
            "retries": {"max_attempts": 1, "mode": "standard"},
        },
    )
    fs.retries = 1  # s3fs's own loop over botocore's
    return fs


def batchesNeeded(schedule: Schedule) -> int:
    """Enough batches that the source is not drained before the last event: the schedule's
    own count, and more for the faults that last seconds (the other worker goes on at a batch
    a second or so) and for each second driver (two drivers meet, then the first has its
    grace)."""
    lasting = sum(math.ceil(e.downSeconds) for e in schedule.events if e.isFault)
    seconds = sum(1 for e in schedule.events if e.kind == "second driver")
    return schedule.batchesNeeded() + lasting + 30 * seconds


def place(spec: PipelineSpec, services: Services) -> None:
    """Put ``spec`` on the cluster: its master and Spark settings, its checkpoint and its file
    outputs in a fresh prefix of the S3 server's bucket."""
    s3 = services.s3
    if s3 is None:
        raise SystemExit("the S3 server is not configured: `set -a; . services/docker.env`")
    prefix = f"chaos/{spec.pipeline}-{uuid.uuid4().hex[:10]}"
    spec.master = MASTER
    spec.sparkConf.update(SPARK_CONF)
    spec.checkpointUrl = f"s3a://{s3.bucket}/{prefix}/checkpoint"
    spec.storeUrl = s3.url(prefix)
    spec.storeOptions = dict(s3.options())
    for key in spec.sinkOptions:
        if key.endswith("kafka.transaction.timeout.ms"):
            spec.sinkOptions[key] = KAFKA_TIMEOUT_MS


class ClusterRun(ChaosRun):
    """:class:`ChaosRun` with each start's driver in a container and the node faults."""

    def __init__(self, cluster: Cluster, spec: PipelineSpec, *args: Any, **kwargs: Any) -> None:
        super().__init__(spec, *args, **kwargs)
        self.cluster = cluster
        self.fs = progressFilesystem(self.services.s3)
        self.checkpointPath = spec.checkpointUrl.removeprefix("s3a://")
        self._listed: dict[str, tuple[float, list[int]]] = {}
        self._successor: ContainerDriver | None = None
        self._launchedAt = 0
        """Batches committed when the running start began."""
        self.secondDrivers: list[str] = []
        """How each first driver ended after a second one took over."""

    def drained(self, code: int) -> bool:
        """A second driver still running is the next start, even when the first drained."""
        return code == 0 and self._successor is None

    def run(self, maxStarts: int | None = None) -> Any:
        try:
            result = super().run(maxStarts)
        finally:
            if self._successor is not None:  # a run that failed: no driver left behind
                self._successor.end()
        if self.secondDrivers:
            result.report += "\nthe first drivers, after a second took over: " + "; ".join(
                self.secondDrivers
            )
        return result

    def _ids(self, folder: str) -> list[int]:
        """Batch ids in a folder of the checkpoint on S3 (listed at most every second)."""
        seen = self._listed.get(folder)
        if seen is not None and time.monotonic() - seen[0] < PROGRESS_EVERY:
            return seen[1]
        try:
            names = self.fs.ls(f"{self.checkpointPath}/{folder}", refresh=True, detail=False)
        except FileNotFoundError:
            names = []
        except Exception:  # the S3 server killed or frozen: progress unknown for now
            return seen[1] if seen is not None else []
        ids = [int(n.rsplit("/", 1)[-1]) for n in names if n.rsplit("/", 1)[-1].isdigit()]
        self._listed[folder] = (time.monotonic(), ids)
        return ids

    def committedBatches(self) -> int:
        ids = self._ids("commits")
        return max(ids) + 1 if ids else 0

    def plannedBatches(self) -> list[int]:
        return self._ids("offsets")

    def launch(self, number: int, crash: dict[str, str], out: IO[bytes]) -> Any:
        """Start ``number``'s driver container; a second driver that took over the previous
        start is this start (its points armed by nobody: the cluster's schedules draw none)."""
        self._launchedAt = self.committedBatches()
        if self._successor is not None:
            driver, self._successor = self._successor, None
            self.log(f"[chaos] start {number} is the second driver {driver.name}")
            return driver
        name = f"chaos-{self.spec.pipeline}-{uuid.uuid4().hex[:6]}-{number}"
        return self.cluster.startDriver(
            name, self.spec, self.workdir / f"spec-{number}.json", crash, out
        )

    def _deliver(self, event: Event, driver: Any) -> bool:
        if event.kind not in ("driver lost", "second driver"):
            return super()._deliver(event, driver)
        if self.committedBatches() <= self._launchedAt:
            return False  # a driver still starting up: lose or double it once it commits
        self.progress.delivering(event)
        began = time.monotonic()
        if event.kind == "driver lost":
            driver.kill()
            time.sleep(event.downSeconds)
        else:
            self._secondDriver(event, driver)
        self.kills.append(Kill(event, began))
        self.progress.happened(event)
        self.log(f"[chaos] {event.describe()}: delivered")
        return True

    def _secondDriver(self, event: Event, first: ContainerDriver) -> None:
        """Start a second driver on the same checkpoint while ``first`` runs (or is paused,
        one time in two), let both be for the event's ``downSeconds``, then give ``first``
        ``SECOND_DRIVER_GRACE`` to stop by itself; the second is the next start."""
        frozen = self.rng.random() < 0.5
        if frozen:
            self.cluster.pause(first.name)
        number = self.starts + 1
        logPath = self.workdir / f"start-{number}.log"
        with logPath.open("wb") as out:
            name = f"chaos-{self.spec.pipeline}-{uuid.uuid4().hex[:6]}-{number}"
            second = self.cluster.startDriver(
                name, self.spec, self.workdir / f"spec-{number}.json", {}, out
            )
        self.log(
            f"[chaos] second driver {second.name} started beside {first.name}"
            + (" (paused)" if frozen else "")
        )
        self._waitWatching(time.monotonic() + event.downSeconds, lambda: False)
        if frozen:
            self.cluster.unpause(first.name)
        self._waitWatching(time.monotonic() + SECOND_DRIVER_GRACE, lambda: first.poll() is not None)
        code = first.poll()
        if code is None:
            first.dumpThreads()  # what it waits for, in its log, before it goes
            time.sleep(2)
            first.kill()
            outcome = f"still running after {SECOND_DRIVER_GRACE:.0f}s: killed (threads in its log)"
        else:
            outcome = f"ended by itself ({code}): {self._why(self.starts)}"
        self.secondDrivers.append(outcome)
        self.log(f"[chaos] the first driver {first.name} {outcome}")
        self._successor = second

    def _waitWatching(self, until: float, done: Any) -> None:
        while time.monotonic() < until and not done():
            self._sawCommits()
            time.sleep(0.5)

    def _why(self, number: int) -> str:
        """What start ``number``'s log says ended its query: fenced, Spark's own check, other."""
        text = (self.workdir / f"start-{number}.log").read_text(errors="replace")
        if "DriverFencedError" in text:
            return "fenced by the decision log"
        if "ConcurrentModificationException" in text or "Multiple streaming queries" in text:
            return "refused by Spark's checkpoint"
        if "QUERY FAILED" in text:
            return "its query failed"
        return "drained"

    def _faultFor(self, event: Event) -> None:
        if event.kind not in ("worker lost", "worker frozen", "worker cut off"):
            super()._faultFor(event)
            return
        worker = event.target
        heal: Any
        if event.kind == "worker lost":
            self.cluster.loseWorker(worker)
            heal = lambda: self.cluster.restoreWorker(worker)  # noqa: E731
        elif event.kind == "worker frozen":
            self.cluster.pause(self.cluster.container(worker))
            heal = lambda: self.cluster.unpause(self.cluster.container(worker))  # noqa: E731
        else:
            self.cluster.cutOff(worker)
            heal = lambda: self.cluster.reconnect(worker)  # noqa: E731
        try:
            self._waitWatching(time.monotonic() + event.downSeconds, lambda: False)
        finally:
            heal()


def nodeTargets() -> dict[str, tuple[str, ...]]:
    """The node kinds and what each may hit."""
    workers = tuple(WORKERS)
    return {
        "worker lost": workers,
        "worker frozen": workers,
        "worker cut off": workers,
        "driver lost": (DRIVER,),
        "second driver": (DRIVER,),
    }
