"""docker-compose.yml must start the same servers as services/*.sh, from images built here.

The scripts take their settings from services/settings.env; this test holds docker-compose.yml,
services/docker.env and the Kafka pom to that file, and every image to a Dockerfile of docker/.
"""

from __future__ import annotations

import shlex
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / "services"

# Broker properties that docker-compose.yml sets for its own network layout (listeners, quorum);
# the script derives these from the free ports it picks, so they are not shared settings.
COMPOSE_LAYOUT_PROPERTIES = {
    "node.id",
    "process.roles",
    "controller.quorum.voters",
    "controller.listener.names",
    "listeners",
    "advertised.listeners",
    "inter.broker.listener.name",
    "listener.security.protocol.map",
}
# Variables of the Kafka image (docker/kafka/entrypoint.sh) that are not broker properties.
KAFKA_IMAGE_NON_PROPERTIES = {"CLUSTER_ID", "KAFKA_HEAP_OPTS"}


def read_env_file(path: Path) -> dict[str, str]:
    """Parse KEY=value lines (optionally `export KEY=value`, shell quoting) without a shell."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "export":
            words = words[1:]
        assert len(words) == 1 and "=" in words[0], f"{path.name}: not KEY=value: {line!r}"
        key, _, value = words[0].partition("=")
        values[key] = value
    return values


def kafka_env_name(prop: str) -> str:
    """The apache/kafka image's variable for a broker property: `.`->`_`, `_`->`__`, `-`->`___`."""
    return "KAFKA_" + prop.replace("_", "__").replace("-", "___").replace(".", "_").upper()


def as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@pytest.fixture(scope="module")
def settings() -> dict[str, str]:
    return read_env_file(SERVICES / "settings.env")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def kafka_env(compose: dict[str, Any]) -> dict[str, str]:
    env = compose["services"]["kafka"]["environment"]
    assert isinstance(env, dict), "kafka.environment must be a mapping"
    return {key: as_text(value) for key, value in env.items()}


def shared_broker_properties(settings: dict[str, str]) -> dict[str, str]:
    props = dict(p.split("=", 1) for p in settings["TWOPHASE_KAFKA_BROKER_PROPERTIES"].split())
    props["transaction.max.timeout.ms"] = settings["TWOPHASE_DEFAULT_KAFKA_TXN_MAX_TIMEOUT_MS"]
    return props


def test_kafka_version_is_the_same_everywhere(
    settings: dict[str, str], compose: dict[str, Any]
) -> None:
    version = settings["TWOPHASE_KAFKA_VERSION"]
    kafka = compose["services"]["kafka"]
    assert kafka["image"] == f"twophase/kafka:{version}"
    assert kafka["build"]["args"]["KAFKA_VERSION"] == version

    pom = ET.parse(SERVICES / "kafka" / "pom.xml").getroot()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    assert pom.findtext("m:properties/m:kafka.version", namespaces=ns) == version


def test_kafka_broker_settings_match_the_script(
    settings: dict[str, str], kafka_env: dict[str, str]
) -> None:
    for prop, value in shared_broker_properties(settings).items():
        name = kafka_env_name(prop)
        assert kafka_env.get(name) == value, f"{name} (broker property {prop}) should be {value}"
    assert kafka_env["KAFKA_HEAP_OPTS"] == settings["TWOPHASE_KAFKA_HEAP_OPTS"]


def test_compose_sets_no_kafka_property_the_script_lacks(
    settings: dict[str, str], kafka_env: dict[str, str]
) -> None:
    known = {kafka_env_name(p) for p in shared_broker_properties(settings)}
    known |= {kafka_env_name(p) for p in COMPOSE_LAYOUT_PROPERTIES}
    extra = set(kafka_env) - known - KAFKA_IMAGE_NON_PROPERTIES
    assert not extra, f"add these to services/settings.env (or explain them here): {extra}"


def test_kafka_is_a_single_kraft_node_on_the_published_port(
    compose: dict[str, Any], kafka_env: dict[str, str]
) -> None:
    assert kafka_env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert kafka_env["KAFKA_NODE_ID"] == "1"
    assert kafka_env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith("1@")
    advertised = kafka_env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    # The host's clients on the published port; the other containers by the service's name.
    assert "PLAINTEXT://127.0.0.1:9092" in advertised
    assert "INTERNAL://kafka:19092" in advertised
    assert "127.0.0.1:9092:9092" in compose["services"]["kafka"]["ports"]


def test_postgres_settings_match_the_script(
    settings: dict[str, str], compose: dict[str, Any]
) -> None:
    pg = compose["services"]["postgres"]
    assert pg["image"] == f"twophase/postgres:{settings['TWOPHASE_POSTGRES_MAJOR']}"
    assert pg["build"]["args"]["POSTGRES_MAJOR"] == settings["TWOPHASE_POSTGRES_MAJOR"]
    command = pg["command"]
    assert command[0] == "postgres"
    options = dict(command[i + 1].split("=", 1) for i, word in enumerate(command) if word == "-c")
    assert options == {
        "max_prepared_transactions": settings["TWOPHASE_PG_MAX_PREPARED_TRANSACTIONS"],
        "max_connections": settings["TWOPHASE_PG_MAX_CONNECTIONS"],
    }
    assert int(options["max_prepared_transactions"]) >= 64
    env = {key: as_text(value) for key, value in pg["environment"].items()}
    assert env == {
        "POSTGRES_USER": settings["TWOPHASE_PG_USER"],
        "POSTGRES_PASSWORD": settings["TWOPHASE_PG_PASSWORD"],
        "POSTGRES_DB": settings["TWOPHASE_PG_DATABASE"],
    }
    assert "127.0.0.1:5432:5432" in pg["ports"]


def test_docker_env_points_at_the_compose_services(settings: dict[str, str]) -> None:
    env = read_env_file(SERVICES / "docker.env")
    assert env["TWOPHASE_KAFKA_BOOTSTRAP"] == "127.0.0.1:9092"
    url = urlsplit(env["TWOPHASE_PG_URL"])
    assert url.scheme == "postgresql"
    assert (url.hostname, url.port) == ("127.0.0.1", 5432)
    assert url.username == settings["TWOPHASE_PG_USER"]
    assert url.password == settings["TWOPHASE_PG_PASSWORD"]
    assert url.path == "/" + settings["TWOPHASE_PG_DATABASE"]


def test_s3_settings_match_the_script(settings: dict[str, str], compose: dict[str, Any]) -> None:
    s3 = compose["services"]["s3"]
    version = settings["TWOPHASE_VERSITYGW_VERSION"]
    assert s3["image"] == f"twophase/versitygw:{version}"
    assert s3["build"]["args"]["VERSION"] == version
    assert s3["build"]["args"]["MODULE"] in (SERVICES / "s3.sh").read_text()
    assert s3["environment"] == {
        "ROOT_ACCESS_KEY": settings["TWOPHASE_DEFAULT_S3_ACCESS_KEY"],
        "ROOT_SECRET_KEY": settings["TWOPHASE_DEFAULT_S3_SECRET_KEY"],
        "BUCKETS": settings["TWOPHASE_DEFAULT_S3_BUCKET"],
    }
    assert "127.0.0.1:7070:7070" in s3["ports"]
    env = read_env_file(SERVICES / "docker.env")
    assert env["TWOPHASE_S3_ENDPOINT"] == "http://127.0.0.1:7070"
    assert env["TWOPHASE_S3_ACCESS_KEY"] == settings["TWOPHASE_DEFAULT_S3_ACCESS_KEY"]
    assert env["TWOPHASE_S3_SECRET_KEY"] == settings["TWOPHASE_DEFAULT_S3_SECRET_KEY"]
    assert env["TWOPHASE_S3_BUCKET"] == settings["TWOPHASE_DEFAULT_S3_BUCKET"]
    assert "TWOPHASE_VERSITYGW_VERSION" in (SERVICES / "s3.sh").read_text()


def test_mariadb_settings_match_the_script(
    settings: dict[str, str], compose: dict[str, Any]
) -> None:
    db = compose["services"]["mariadb"]
    # Debian 12's mariadb-server is the version services/settings.env names.
    assert db["image"] == f"twophase/mariadb:{settings['TWOPHASE_MARIADB_VERSION']}"
    assert f"--max-connections={settings['TWOPHASE_MARIADB_MAX_CONNECTIONS']}" in db["command"]
    env = {key: as_text(value) for key, value in db["environment"].items()}
    assert env["MARIADB_USER"] == settings["TWOPHASE_MARIADB_USER"]
    assert env["MARIADB_PASSWORD"] == settings["TWOPHASE_MARIADB_PASSWORD"]
    assert env["MARIADB_DATABASE"] == settings["TWOPHASE_MARIADB_DATABASE"]
    assert "127.0.0.1:3306:3306" in db["ports"]
    grants = compose["configs"]["mariadb-grants"]["content"]
    assert f"TO '{settings['TWOPHASE_MARIADB_USER']}'@'%'" in grants
    url = urlsplit(read_env_file(SERVICES / "docker.env")["TWOPHASE_MARIADB_URL"])
    assert url.scheme == "mysql+pymysql" and (url.hostname, url.port) == ("127.0.0.1", 3306)
    assert url.username == settings["TWOPHASE_MARIADB_USER"]
    assert url.password == settings["TWOPHASE_MARIADB_PASSWORD"]
    assert url.path == "/" + settings["TWOPHASE_MARIADB_DATABASE"]
    script = (SERVICES / "mariadb.sh").read_text()
    for name in ("TWOPHASE_MARIADB_USER", "TWOPHASE_MARIADB_MAX_CONNECTIONS", "lib.sh"):
        assert name in script, name


def test_scripts_take_their_settings_from_settings_env() -> None:
    kafka = (SERVICES / "kafka.sh").read_text()
    postgres = (SERVICES / "postgres.sh").read_text()
    lib = (SERVICES / "lib.sh").read_text()
    assert "settings.env" in lib
    assert "lib.sh" in kafka and "lib.sh" in postgres
    for name in (
        "TWOPHASE_KAFKA_VERSION",
        "TWOPHASE_KAFKA_HEAP_OPTS",
        "TWOPHASE_KAFKA_BROKER_PROPERTIES",
        "TWOPHASE_DEFAULT_KAFKA_TXN_MAX_TIMEOUT_MS",
    ):
        assert name in kafka, name
    for name in ("TWOPHASE_PG_MAX_PREPARED_TRANSACTIONS", "TWOPHASE_PG_MAX_CONNECTIONS"):
        assert name in postgres, name


def test_every_image_is_built_here_from_docker(compose: dict[str, Any]) -> None:
    """No image comes from a registry: each service builds from a Dockerfile of docker/ on the
    base image the build arg names, and the builds trust the CA bundle as a secret only."""
    assert compose["secrets"]["ca-bundle"]["file"].startswith("${TWOPHASE_CA_BUNDLE")
    builds = {name: s for name, s in compose["services"].items() if "build" in s}
    built = {s["image"] for s in builds.values()}
    for name, service in compose["services"].items():
        if "build" not in service:
            # A node of the Spark image another service builds, never pulled.
            assert service["image"] in built and service["pull_policy"] == "never", name
            continue
        build = service["build"]
        dockerfile = ROOT / build["dockerfile"]
        assert dockerfile.is_file() and dockerfile.parent.parent == ROOT / "docker", name
        assert build["context"] == "."
        assert build["args"]["BASE"] == "${TWOPHASE_BASE_IMAGE:-twophase/debian:bookworm}", name
        assert build["secrets"] == ["ca-bundle"], name
        text = dockerfile.read_text()
        assert "ARG BASE=twophase/debian:bookworm" in text, name
        assert all(
            line.split()[1].startswith(("${BASE}", "python", "jars", "build"))
            for line in text.splitlines()
            if line.startswith("FROM ")
        ), name


def test_dockerignore_lets_through_what_the_dockerfiles_copy() -> None:
    """The build context is the repository with .dockerignore's allow-list: every COPY source
    of every Dockerfile must exist and be let through."""
    allowed = [
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    for dockerfile in (ROOT / "docker").glob("*/Dockerfile"):
        for line in dockerfile.read_text().splitlines():
            words = line.split()
            if not words or words[0] != "COPY" or any(w.startswith("--from") for w in words):
                continue
            for source in words[1:-1]:
                assert (ROOT / source).exists(), f"{dockerfile}: {source} does not exist"
                assert any(source == a or source.startswith(a + "/") for a in allowed), (
                    f"{dockerfile}: {source} is not let through by .dockerignore"
                )


def test_toxiproxy_has_the_scripts_proxies_on_published_ports(
    settings: dict[str, str], compose: dict[str, Any]
) -> None:
    import json

    toxi = compose["services"]["toxiproxy"]
    version = settings["TWOPHASE_TOXIPROXY_VERSION"]
    assert toxi["image"] == f"twophase/toxiproxy:{version}"
    assert toxi["build"]["args"]["VERSION"] == version
    assert toxi["build"]["args"]["MODULE"] in (SERVICES / "toxiproxy.sh").read_text()
    proxies = json.loads(compose["configs"]["toxiproxy-proxies"]["content"])
    # The proxies services/services.sh makes (integration_tests/toxiproxy.py, PROXY_NAMES).
    assert sorted(p["name"] for p in proxies) == ["kafka", "mariadb", "postgres", "s3"]
    for proxy in proxies:
        port = proxy["listen"].rsplit(":", 1)[1]
        assert f"127.0.0.1:{port}:{port}" in toxi["ports"], proxy["name"]
        host = proxy["upstream"].split(":")[0]
        assert host in compose["services"], proxy["name"]
    kafka = next(p for p in proxies if p["name"] == "kafka")
    advertised = compose["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    # Clients that bootstrap at the proxy are told to stay on it.
    assert f"PROXIED://127.0.0.1:{kafka['listen'].rsplit(':', 1)[1]}" in advertised.split(",")
    env = read_env_file(SERVICES / "docker.env")
    assert env["TWOPHASE_TOXIPROXY_URL"] == "http://127.0.0.1:8474"
    assert env["TWOPHASE_SERVICES"] == "compose"


def test_a_worker_cut_off_from_the_servers_still_reaches_the_driver(
    compose: dict[str, Any],
) -> None:
    """The servers are on `data` only, the master on the Spark network only, the workers and
    a driver on both: disconnecting a worker from `data` (the chaos kind `worker cut off`)
    leaves it without any server while the driver and the master still reach it."""
    services = compose["services"]
    servers = [n for n, s in services.items() if not n.startswith("spark-")]
    assert servers and all(services[n]["networks"] == ["data"] for n in servers), servers
    assert "networks" not in services["spark-master"]  # the default network only
    for node in ("spark-worker-1", "spark-worker-2", "spark-driver"):
        assert services[node]["networks"] == ["default", "data"], node
    assert set(compose["networks"]) == {"default", "data"}


def test_the_chaos_overlay_shares_one_directory_with_the_workers_and_drivers() -> None:
    """docker/chaos.yml mounts the harness's directory at the same path in every worker and
    driver (an executor on either worker sees which protocol points fired), and the repository
    read-only in a driver."""
    overlay = yaml.safe_load((ROOT / "docker" / "chaos.yml").read_text())
    shared = "${TWOPHASE_CLUSTER_SHARED}:${TWOPHASE_CLUSTER_SHARED}"
    for node in ("spark-worker-1", "spark-worker-2", "spark-driver"):
        volumes = [
            v.replace(":?the directory shared with the Spark nodes", "")
            for v in overlay["services"][node]["volumes"]
        ]
        assert shared in volumes, node
    assert ".:/work/src:ro" in overlay["services"]["spark-driver"]["volumes"]
