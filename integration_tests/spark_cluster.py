"""A standalone Spark cluster on distinct loopback hosts, for the speculation tests.

Spark never launches a speculative copy on a host where the task already ran, and in
``local[...]`` and ``local-cluster[...]`` every executor reports the same host, so these tests
need workers bound to 127.0.0.2, 127.0.0.3 ...
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from integration_tests.spark_processes import FAST_JVM, freePort, killSession, makeSparkHome


class StandaloneCluster:
    """A master and ``workers`` worker JVMs (1 core each), on 127.0.0.1, .2, .3 ...

    Started from the harness's private ``SPARK_HOME`` in a session of its own; ``stop`` kills
    that session. Worker work directories are under ``<workdir>/standalone``.
    """

    def __init__(self, workdir: Path, workers: int = 2, memory: str = "1g") -> None:
        self.workdir = workdir / "standalone"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sparkHome = makeSparkHome(workdir / "spark-home")
        self.port = freePort()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.workers = workers
        self.memory = memory
        self.processes: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, args: list[str], host: str) -> None:
        env = dict(os.environ, SPARK_HOME=str(self.sparkHome), SPARK_LOCAL_IP=host)
        env["SPARK_LOCAL_DIRS"] = str(self.workdir / f"{name}-local")
        env["SPARK_WORKER_DIR"] = str(self.workdir / f"{name}-work")
        env["SPARK_DAEMON_JAVA_OPTS"] = FAST_JVM
        log = (self.workdir / f"{name}.log").open("w")
        self.processes.append(
            subprocess.Popen(
                [str(self.sparkHome / "bin" / "spark-class"), *args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        log.close()

    def start(self, timeout: float = 120.0) -> StandaloneCluster:
        self._start(
            "master",
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
            + ["--port", str(self.port), "--webui-port", str(freePort())],
            "127.0.0.1",
        )
        for n in range(self.workers):
            host = f"127.0.0.{n + 2}"
            self._start(
                f"worker-{n}",
                ["org.apache.spark.deploy.worker.Worker", "--host", host, "--cores", "1"]
                + ["--memory", self.memory, "--webui-port", str(freePort(host)), self.url],
                host,
            )
        deadline = time.monotonic() + timeout
        master = self.workdir / "master.log"
        while time.monotonic() < deadline:
            registered = master.read_text(errors="replace").count("Registering worker")
            if registered >= self.workers:
                return self
            if any(p.poll() is not None for p in self.processes):
                break
            time.sleep(0.5)
        logs = "\n".join(
            f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-30:])
            for p in sorted(self.workdir.glob("*.log"))
        )
        self.stop()
        raise AssertionError(f"the standalone cluster did not come up:\n{logs}")

    def stop(self) -> None:
        for process in self.processes:
            killSession(process.pid)
            process.wait()
        self.processes.clear()
