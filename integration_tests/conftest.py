"""Fixtures for tests against real Kafka and PostgreSQL servers.

Where the servers are comes from the environment (TWOPHASE_PG_URL, TWOPHASE_KAFKA_BOOTSTRAP),
else from .services.env at the repo root, which `make services` writes. A server that is not
configured or not reachable fails the test: these tests are never skipped silently.

Tests that restart a server use the `kafka_broker` and `postgres_server` fixtures; they drive
services/kafka.sh and services/postgres.sh (stop/start keep data and ports). Tests that disturb
a server's network use `proxies` (services/toxiproxy.sh, integration_tests/toxiproxy.py) and
connect through a proxy (`proxiedUrl`, or the `kafka` proxy's listen address as bootstrap).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from integration_tests import jvm_archive
from integration_tests.toxiproxy import PROXY_NAMES, Toxiproxy, ToxiproxyError

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVICES_DIR = REPO_ROOT / "services"
SERVICES_ENV = REPO_ROOT / ".services.env"

HOW_TO_START = (
    "start it with `make services` (or `docker compose up -d` and `set -a; . services/docker.env`)"
)


ARCHIVE = pytest.StashKey[jvm_archive.Archive]()


def pytest_configure(config: pytest.Config) -> None:
    """A pytest-xdist worker other than the first takes its own set of servers; every Spark JVM
    the tests start maps Spark's classes from one archive (``integration_tests.jvm_archive``),
    made in the background when missing while the unit tests run (by the process that runs
    the session, not by each worker); ``TWOPHASE_JVM_ARCHIVE=0`` runs without it,
    ``=existing`` uses it only when made already."""
    useWorkersServers()
    setting = os.environ.get("TWOPHASE_JVM_ARCHIVE", "")
    if setting == "0" or hasattr(config, "workerinput"):
        return
    archive = jvm_archive.Archive(cacheDir(), make=setting != "existing")
    archive.start()
    config.stash[ARCHIVE] = archive


LONGEST_FIRST = (
    "chaos/test_chaos.py",
    "test_supervise.py",
    "test_docs_example.py",
    "test_secrets.py",
    "test_spark_connect.py",
    "test_spark_crash_windows.py",
    "test_spark_attempts.py",
    "test_spark_binding.py",
    "test_kafka_spark.py",
    "test_two_drivers.py",
    "test_postgres_spark.py",
    "test_rescale.py",
    "test_packaging.py",
    "test_executors_check.py",
    "test_multi.py",
    "test_upgrade.py",
    "test_cli_next_start.py",
)
"""The test files that take longest, longest first. ``make test``'s workers take a file at a
time in collection order (``--no-loadscope-reorder``), so these start early and the short
ones fill in at the end, instead of one long file running alone after everything else."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Integration test files after the unit tests (which run while the JVM class archive is
    made), the longest first (``LONGEST_FIRST``); the order within a file is kept."""
    here = Path(__file__).parent
    rank = {here / name: index for index, name in enumerate(LONGEST_FIRST)}
    gone = [name for name in LONGEST_FIRST if not (here / name).is_file()]
    if gone:
        raise pytest.UsageError(f"LONGEST_FIRST names files that are gone: {gone}")

    def key(item: pytest.Item) -> tuple[int, int]:
        path = Path(item.path)
        if here not in path.parents:
            return (0, 0)
        return (1, rank.get(path, len(rank)))

    items[:] = sorted(items, key=key)  # stable: collection order within each rank


def pytest_unconfigure(config: pytest.Config) -> None:
    if ARCHIVE in config.stash:
        config.stash[ARCHIVE].finish()  # no warm-up left running, no lock left held


@pytest.fixture(scope="session", autouse=True)
def jvm_class_archive() -> None:
    """Before the first integration test: wait for the archive and hand it to every Spark JVM
    started from here on, in this process or a child (``PYSPARK_SUBMIT_ARGS``)."""
    if os.environ.get("TWOPHASE_JVM_ARCHIVE", "") == "0":
        return
    path = jvm_archive.waitForArchive(cacheDir())
    existing = os.environ.get(jvm_archive.SUBMIT_ARGS)
    if path is not None and str(path) not in (existing or ""):
        os.environ[jvm_archive.SUBMIT_ARGS] = jvm_archive.submitArgs(path, existing)


def cacheDir() -> Path:
    """TWOPHASE_CACHE, as the Makefile and services/lib.sh default it."""
    return Path(os.environ.get("TWOPHASE_CACHE") or Path.home() / ".cache" / "twophase")


def useWorkersServers() -> None:
    """On pytest-xdist's worker ``gw<n>`` (n > 0): the servers of set n + 1
    (``TWOPHASE_SERVICES_SET``, ``.services-<n+1>.env``) in this process's environment, so
    that a test's kills, freezes and partitions never reach another worker's tests, nor do
    its tables, topics and prepared transactions. Worker ``gw0`` keeps set 1."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or worker == "gw0":
        return
    number = int(worker[2:]) + 1
    path = REPO_ROOT / f".services-{number}.env"
    values = _read_env_file(path)
    if not values:
        raise pytest.UsageError(
            f"pytest worker {worker} has no servers of its own: {path} is missing. Start set "
            f"{number} with `TWOPHASE_SERVICES_SET={number} services/services.sh up` (`make "
            "test` starts one set per worker), or run without -n"
        )
    os.environ.update(values)


def _read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines, optionally prefixed with `export`, with shell quoting."""
    values: dict[str, str] = {}
    if not path.is_file():
        return values
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == "export":
            words = words[1:]
        if len(words) == 1 and "=" in words[0]:
            key, _, value = words[0].partition("=")
            values[key] = value
    return values


def service_setting(name: str) -> str | None:
    """The environment first, then .services.env."""
    return os.environ.get(name) or _read_env_file(SERVICES_ENV).get(name)


def scriptEnvironment() -> dict[str, str]:
    """The environment for services/*.sh: the state lives under the TWOPHASE_CACHE and in the
    TWOPHASE_SERVICES_SET the servers were started with."""
    env = dict(os.environ)
    for name in ("TWOPHASE_CACHE", "TWOPHASE_SERVICES_SET"):
        value = service_setting(name)
        if value:
            env[name] = value
    return env


@pytest.fixture(scope="session")
def services_dir() -> Path:
    return SERVICES_DIR


@pytest.fixture(scope="session")
def pg_url() -> str:
    url = service_setting("TWOPHASE_PG_URL")
    if not url:
        pytest.fail(
            f"PostgreSQL is not configured: TWOPHASE_PG_URL is unset and {SERVICES_ENV} "
            f"has none; {HOW_TO_START}",
            pytrace=False,
        )
    import psycopg

    problem = None
    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        problem = " ".join(str(exc).split())
    if problem is not None:  # failing outside `except` keeps the report to one line
        pytest.fail(
            f"PostgreSQL is not reachable at {url} ({problem}); {HOW_TO_START}", pytrace=False
        )
    return url


@pytest.fixture(scope="session")
def schema_registry_url() -> str:
    """The registry's Confluent-compatible base URL, checked to list the subjects."""
    url = service_setting("TWOPHASE_SCHEMA_REGISTRY_URL")
    if not url:
        pytest.fail(
            "The schema registry is not configured: TWOPHASE_SCHEMA_REGISTRY_URL is unset and "
            f"{SERVICES_ENV} has none; {HOW_TO_START}",
            pytrace=False,
        )
    problem = None
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=10) as reply:
            if reply.status != 200:
                problem = f"GET /subjects answered {reply.status}"
    except (urllib.error.URLError, OSError) as exc:
        problem = str(exc)
    if problem is not None:
        pytest.fail(
            f"The schema registry is not reachable at {url} ({problem}); {HOW_TO_START}",
            pytrace=False,
        )
    return url


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    bootstrap = service_setting("TWOPHASE_KAFKA_BOOTSTRAP")
    if not bootstrap:
        pytest.fail(
            f"Kafka is not configured: TWOPHASE_KAFKA_BOOTSTRAP is unset and {SERVICES_ENV} "
            f"has none; {HOW_TO_START}",
            pytrace=False,
        )
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    problem = None
    try:
        if not admin.list_topics(timeout=15).brokers:
            problem = "the metadata response lists no broker"
    except KafkaException as exc:
        problem = exc.args[0].str() if exc.args else str(exc)
    if problem is not None:
        pytest.fail(
            f"Kafka is not reachable at {bootstrap} ({problem}); {HOW_TO_START}", pytrace=False
        )
    return bootstrap


# ---------------------------------------------------------------------------------------------
# Stopping and starting the servers, for restart and crash tests.


@dataclass
class ServiceControl:
    """Stops and starts one server started by services/*.sh, keeping its data and port."""

    script: Path
    noun: str  # "broker" or "server": the scripts' verbs are stop-<noun>, start-<noun>, ...

    def _run(self, verb: str) -> None:
        result = subprocess.run(
            [str(self.script), f"{verb}-{self.noun}"],
            env=scriptEnvironment(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{self.script.name} {verb}-{self.noun} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )

    def stop(self) -> None:
        """Graceful shutdown."""
        self._run("stop")

    def kill(self) -> None:
        """Crash: SIGKILL for Kafka, immediate shutdown for PostgreSQL."""
        self._run("kill")

    def start(self) -> None:
        """Start again on the same port with the same data; returns once it serves requests."""
        self._run("start")

    def restart(self) -> None:
        self.stop()
        self.start()

    def freeze(self) -> None:
        """SIGSTOP to every process of the server: connections stay open and unanswered."""
        self._run("freeze")

    def thaw(self) -> None:
        """SIGCONT to them again (nothing when the server is not running)."""
        self._run("thaw")


def callsDuringAFreeze(
    server: ServiceControl, calls: dict[str, Callable[[], object]], limit: float = 30.0
) -> dict[str, tuple[BaseException | None, float]]:
    """Run ``calls`` in threads while ``server`` is frozen; each one's error (``None`` when it
    returned) and seconds. The server is thawed after ``limit`` seconds whatever happened; a
    call still blocked then is missing from the result."""
    return callsDuring(server.freeze, server.thaw, calls, limit)


def callsDuring(
    fault: Callable[[], object],
    heal: Callable[[], object],
    calls: dict[str, Callable[[], object]],
    limit: float = 30.0,
) -> dict[str, tuple[BaseException | None, float]]:
    """Run ``calls`` in threads while a fault lasts (``fault`` makes it, ``heal`` ends it:
    ``proxy.loseReplies`` and ``proxy.heal``, say); as ``callsDuringAFreeze``."""
    outcomes: dict[str, tuple[BaseException | None, float]] = {}

    def timed(name: str, call: Callable[[], object]) -> threading.Thread:
        def run() -> None:
            started = time.monotonic()
            try:
                call()
                outcomes[name] = (None, time.monotonic() - started)
            except Exception as exc:
                outcomes[name] = (exc, time.monotonic() - started)

        return threading.Thread(target=run, daemon=True)

    threads = [timed(name, call) for name, call in calls.items()]
    fault()
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + limit
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
    finally:
        heal()
    return dict(outcomes)


def failedWithin(
    outcomes: dict[str, tuple[BaseException | None, float]],
    name: str,
    errorType: type[BaseException],
    seconds: float,
) -> BaseException:
    """The error call ``name`` of ``callsDuringAFreeze`` (or ``callsDuring``) ended with,
    checked: it ended, with an ``errorType``, within ``seconds``."""
    assert name in outcomes, f"{name} was still blocked when the fault ended: {outcomes}"
    error, took = outcomes[name]
    assert isinstance(error, errorType), f"{name} ended with {error!r}, not a {errorType.__name__}"
    assert took < seconds, f"{name} failed after {took:.1f} s, not within {seconds} s"
    return error


@dataclass
class ComposeControl(ServiceControl):
    """Stops and starts one server of docker-compose.yml (`make compose-up`): a stop, a kill,
    a start that waits until the server is healthy, and a freeze as `docker compose pause`."""

    service: str = ""

    def _run(self, verb: str) -> None:
        words = {
            "stop": ["stop", self.service],
            "kill": ["kill", self.service],
            "start": ["up", "-d", "--no-deps", "--wait", self.service],
            "freeze": ["pause", self.service],
            "thaw": ["unpause", self.service],
        }[verb]
        result = subprocess.run(
            [str(self.script), "compose", *words], capture_output=True, text=True, timeout=300
        )
        # unpause of a container that is not paused is the script verbs' "nothing to thaw".
        if result.returncode != 0 and verb != "thaw":
            raise RuntimeError(
                f"docker compose {' '.join(words)} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )


def _compose_managed() -> bool:
    """The servers are docker-compose.yml's (services/docker.env says so)."""
    return service_setting("TWOPHASE_SERVICES") == "compose"


def _control(
    script: Path, noun: str, service: str, query: list[str], address: str, what: str
) -> ServiceControl:
    """The control of one server, by docker compose or by its script, as it was started; a
    server the script did not start (`script query` prints another address) fails the test."""
    if _compose_managed():
        return ComposeControl(REPO_ROOT / "docker" / "compose.sh", noun, service)
    if not _managed_by_scripts(script, query, address):
        pytest.fail(
            f"{what} was not started by services/{script.name}, so this test cannot restart "
            "it; run it after `make services`",
            pytrace=False,
        )
    return ServiceControl(script, noun)


def _managed_by_scripts(script: Path, query: list[str], address: str) -> bool:
    """True when `script query` (the running service's address) matches what the tests use."""
    result = subprocess.run(
        [str(script), *query], env=scriptEnvironment(), capture_output=True, text=True, timeout=60
    )
    return result.returncode == 0 and result.stdout.strip() == address


@pytest.fixture
def kafka_broker(kafka_bootstrap: str, services_dir: Path) -> Iterator[ServiceControl]:
    """Control of the Kafka broker; it is running again after the test, whatever happened."""
    control = _control(
        services_dir / "kafka.sh",
        "broker",
        "kafka",
        ["bootstrap"],
        kafka_bootstrap,
        f"the broker at {kafka_bootstrap}",
    )
    yield control
    control.thaw()
    control.start()


@pytest.fixture
def postgres_server(pg_url: str, services_dir: Path) -> Iterator[ServiceControl]:
    """Control of the PostgreSQL server; it is running again after the test, whatever happened."""
    control = _control(
        services_dir / "postgres.sh",
        "server",
        "postgres",
        ["url"],
        pg_url,
        f"the server at {pg_url}",
    )
    yield control
    control.thaw()
    control.start()


@pytest.fixture
def registry_server(schema_registry_url: str, services_dir: Path) -> Iterator[ServiceControl]:
    """Control of the schema registry; running again after the test, whatever happened."""
    control = _control(
        services_dir / "registry.sh",
        "server",
        "registry",
        ["url"],
        schema_registry_url,
        f"the registry at {schema_registry_url}",
    )
    yield control
    control.thaw()
    control.start()


@pytest.fixture(scope="session")
def mariadb_url() -> str:
    """The SQLAlchemy URL of the MariaDB of services/mariadb.sh (TWOPHASE_MARIADB_URL)."""
    url = service_setting("TWOPHASE_MARIADB_URL")
    if not url:
        pytest.fail(
            f"MariaDB is not configured: TWOPHASE_MARIADB_URL is unset and {SERVICES_ENV} "
            f"has none; {HOW_TO_START}",
            pytrace=False,
        )
    import sqlalchemy as sa

    problem = None
    try:
        with sa.create_engine(url, poolclass=sa.pool.NullPool).connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.SQLAlchemyError as exc:
        problem = " ".join(str(getattr(exc, "orig", exc)).split())
    if problem is not None:
        pytest.fail(f"MariaDB is not reachable ({problem}); {HOW_TO_START}", pytrace=False)
    return url


@pytest.fixture
def mariadb_server(mariadb_url: str, services_dir: Path) -> Iterator[ServiceControl]:
    """Control of the MariaDB server; it is running again after the test, whatever happened."""
    control = _control(
        services_dir / "mariadb.sh", "server", "mariadb", ["url"], mariadb_url, "the MariaDB server"
    )
    yield control
    control.thaw()
    control.start()


@dataclass(frozen=True)
class S3Service:
    """The S3 server of services/s3.sh: endpoint, credentials, bucket."""

    endpoint: str
    accessKey: str
    secretKey: str
    bucket: str

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix.strip('/')}"

    def options(self) -> dict[str, str]:
        """The files sink's ``fs.*`` options that reach this server."""
        return {
            "fs.endpoint_url": self.endpoint,
            "fs.key": self.accessKey,
            "fs.secret": self.secretKey,
        }

    def filesystem(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(
            endpoint_url=self.endpoint, key=self.accessKey, secret=self.secretKey
        )


@pytest.fixture(scope="session")
def s3() -> S3Service:
    names = ("ENDPOINT", "ACCESS_KEY", "SECRET_KEY", "BUCKET")
    values = {n: service_setting(f"TWOPHASE_S3_{n}") for n in names}
    if not all(values.values()):
        pytest.fail(
            f"S3 is not configured: TWOPHASE_S3_* are unset and {SERVICES_ENV} has none; "
            f"{HOW_TO_START}",
            pytrace=False,
        )
    service = S3Service(*(str(values[n]) for n in names))
    problem = None
    try:
        service.filesystem().ls(service.bucket)
    except Exception as exc:  # any failure to list means the server is not usable
        problem = " ".join(str(exc).split())
    if problem is not None:
        pytest.fail(
            f"S3 is not reachable at {service.endpoint} ({problem}); {HOW_TO_START}",
            pytrace=False,
        )
    return service


@pytest.fixture
def s3_server(s3: S3Service, services_dir: Path) -> Iterator[ServiceControl]:
    """Control of the S3 server; it is running again after the test, whatever happened."""
    control = _control(
        services_dir / "s3.sh",
        "server",
        "s3",
        ["endpoint"],
        s3.endpoint,
        f"the S3 server at {s3.endpoint}",
    )
    yield control
    control.thaw()
    control.start()


@dataclass(frozen=True)
class PgRole:
    """A role of the test's own with a password nothing else contains, and its table."""

    url: str
    password: str
    table: str


@pytest.fixture
def pg_role(pg_url: str) -> Iterator[PgRole]:
    """A fresh role owning a fresh table (both named ``it_role_<token>``); afterwards both and
    their leftovers are gone. The servers' own password is a common word (it is also the user
    name), so a check that a password never shows needs this role's unique one."""
    token = uuid.uuid4().hex[:10]
    name, password = f"it_role_{token}", f"Role-{token}-S3cret"
    url = make_conninfo(pg_url, user=name, password=password)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(name), sql.Literal(password)
            )
        )
        conn.execute(
            sql.SQL("GRANT CREATE, USAGE ON SCHEMA public TO {}").format(sql.Identifier(name))
        )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, payload text NOT NULL)").format(
                sql.Identifier(name)
            )
        )
    yield PgRole(url, password, name)
    with psycopg.connect(url, autocommit=True) as conn:
        for (gid,) in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE owner = current_user"
        ).fetchall():
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        conn.execute("SET lock_timeout = '10s'")
        for table in (name, f"{name}_twophase_staging", f"{name}_twophase_commits"):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("REVOKE ALL ON SCHEMA public FROM {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
def pg_table(pg_url: str) -> Iterator[str]:
    """A fresh PostgreSQL table name; the table and the postgres sink's helper tables are
    dropped afterwards."""
    name = f"it_table_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for dropped in (name, f"{name}_twophase_staging", f"{name}_twophase_commits"):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(dropped)))


# ---------------------------------------------------------------------------------------------
# The network between a client and a server, through the proxies of services/toxiproxy.sh.


@pytest.fixture(scope="session")
def toxiproxy() -> Toxiproxy:
    """The Toxiproxy of services/toxiproxy.sh (TWOPHASE_TOXIPROXY_URL), with its four proxies."""
    url = service_setting("TWOPHASE_TOXIPROXY_URL")
    if not url:
        pytest.fail(
            f"Toxiproxy is not configured: TWOPHASE_TOXIPROXY_URL is unset and {SERVICES_ENV} "
            "has none; start it with `make services` or `make compose-up`",
            pytrace=False,
        )
    client = Toxiproxy(url)
    problem = None
    try:
        missing = sorted(set(PROXY_NAMES) - set(client.proxies()))
        if missing:
            problem = (
                f"Toxiproxy at {url} has no proxy {', '.join(missing)}; `make services` makes them"
            )
    except ToxiproxyError as exc:  # it says what went wrong and how to start it
        problem = str(exc)
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    return client


@pytest.fixture
def proxies(toxiproxy: Toxiproxy) -> Iterator[Toxiproxy]:
    """The proxies with no toxic and all enabled; reset again after the test, whatever
    happened, so a fault never outlives its test."""
    toxiproxy.reset()
    yield toxiproxy
    toxiproxy.reset()
