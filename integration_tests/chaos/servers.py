"""The servers a chaos pipeline may crash or cut off: where they are, and how each fault is done.

A pipeline names the servers it depends on by kind (``pipelines/``); a timed kill of that kind
SIGKILLs the server (or shuts PostgreSQL down immediately) through its services/*.sh script,
keeps it down for the event's ``downSeconds`` and starts it again on the same data and port
(``conftest.ServiceControl``). The faults beyond kills (``faultkinds``) freeze the server
through the same script, or act on its proxy: when ``make services`` runs the proxies, every
address here goes through them, so the query's connections can be partitioned, slowed or lose
their replies. Pipelines run side by side share these servers: ``exclusive`` lets one fault or
kill at a time act on a server, so that one pipeline's heal never ends another's fault early.
A sink that needs a new server adds its kind here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from integration_tests.chaos.faultkinds import SLOW_LATENCY_MS
from integration_tests.conftest import (
    REPO_ROOT,
    SERVICES_DIR,
    ComposeControl,
    S3Service,
    ServiceControl,
    service_setting,
)


@dataclass(frozen=True)
class Server:
    """One kind of server: its script in services/, the noun of its verbs (``kill-<noun>``,
    ``start-<noun>``) and the pytest fixture that fails clearly when it is not running."""

    script: str
    noun: str
    fixture: str
    proxy: str
    """Its proxy's name in services/toxiproxy.sh."""
    service: str
    """Its service in docker-compose.yml."""


SERVERS = {
    "broker": Server("kafka.sh", "broker", "kafka_bootstrap", "kafka", "kafka"),
    "postgres": Server("postgres.sh", "server", "pg_url", "postgres", "postgres"),
    "s3": Server("s3.sh", "server", "s3", "s3", "s3"),
    "mariadb": Server("mariadb.sh", "server", "mariadb_url", "mariadb", "mariadb"),
}
"""Every kind of server a schedule may kill, in the order of the report's columns."""


@dataclass
class Services:
    """Where the servers of ``make services`` are, and how the runner crashes one of them."""

    pgUrl: str = ""
    """The PostgreSQL URL of the ``postgres`` and ``multi`` pipelines: the TLS role's
    (``TWOPHASE_PG_TLS_URL``: not a superuser, ``sslmode=verify-full``) where ``make services``
    has one."""
    bootstrap: str = ""
    s3: Any = None
    """The S3 server (``conftest.S3Service``) of the ``s3`` pipeline."""
    mariadbUrl: str = ""
    """The SQLAlchemy URL of the MariaDB of the ``mariadb`` pipeline: its TLS user's
    (``TWOPHASE_MARIADB_TLS_URL``: an ordinary user, the server's certificate verified) where
    ``make services`` has one, so the bounded profile's faults meet TLS sessions too."""
    proxies: Any = None
    """The proxies (``integration_tests.toxiproxy.Toxiproxy``) every address above goes
    through, or None when ``make services`` runs none: no network faults then."""
    compose: bool = False
    """The servers are docker-compose.yml's: ``docker compose`` kills, starts and pauses them."""
    locks: dict[str, threading.Lock] = field(default_factory=dict, repr=False)

    def exclusive(self, kind: str) -> threading.Lock:
        """The lock a fault or kill of the server of ``kind`` holds from its start to its
        healing, when pipelines run side by side."""
        return self.locks.setdefault(kind, threading.Lock())

    def control(self, kind: str) -> ServiceControl:
        server = SERVERS[kind]
        if self.compose:
            return ComposeControl(REPO_ROOT / "docker" / "compose.sh", server.noun, server.service)
        return ServiceControl(SERVICES_DIR / server.script, server.noun)

    def crash(self, kind: str, downSeconds: float) -> None:
        """Kill the server of ``kind``, keep it down ``downSeconds``, start it again."""
        control = self.control(kind)
        control.kill()
        time.sleep(downSeconds)
        control.start()

    def freeze(self, kind: str) -> Callable[[], None]:
        """Stop every process of the server of ``kind``; returns what resumes them."""
        control = self.control(kind)
        control.freeze()
        return control.thaw

    def restartProxies(self) -> None:
        """Kill and start Toxiproxy again (same proxies and ports, no toxics): under heavy
        Kafka traffic its API can stop answering for a proxy whose toxic is being removed
        (Shopify/toxiproxy#558), which leaves that proxy wedged. Every connection through
        the proxies is closed, a network blip for every pipeline; one restart at a time."""
        with self.locks.setdefault("toxiproxy restart", threading.Lock()):
            control = ServiceControl(SERVICES_DIR / "toxiproxy.sh", "server")
            control.kill()
            control.start()

    def disturb(self, fault: str, kind: str) -> Callable[[], None]:
        """Through the proxy of the server of ``kind``: ``partition`` (also ``past timeout``),
        ``slow`` or ``reply lost``; returns what heals it."""
        proxy = self.proxies.proxy(SERVERS[kind].proxy)
        if fault in ("partition", "past timeout"):
            proxy.partition()
        elif fault == "slow":
            proxy.slow(*SLOW_LATENCY_MS)
        elif fault == "reply lost":
            proxy.loseReplies()
        else:
            raise ValueError(f"no network fault {fault!r}")
        heal: Callable[[], None] = proxy.heal
        return heal


def servicesFromEnvironment(proxies: bool = True) -> Services:
    """The servers of ``make services`` (environment first, then .services.env), through
    their proxies when it runs them and ``proxies``; driven by ``docker compose`` when they
    are docker-compose.yml's (``services/docker.env``)."""
    names = ("ENDPOINT", "ACCESS_KEY", "SECRET_KEY", "BUCKET")
    s3 = [service_setting(f"TWOPHASE_S3_{n}") or "" for n in names]
    services = Services(
        pgUrl=service_setting("TWOPHASE_PG_TLS_URL") or service_setting("TWOPHASE_PG_URL") or "",
        bootstrap=service_setting("TWOPHASE_KAFKA_BOOTSTRAP") or "",
        s3=S3Service(*s3) if all(s3) else None,
        mariadbUrl=service_setting("TWOPHASE_MARIADB_TLS_URL")
        or service_setting("TWOPHASE_MARIADB_URL")
        or "",
        compose=service_setting("TWOPHASE_SERVICES") == "compose",
    )
    proxiesUrl = service_setting("TWOPHASE_TOXIPROXY_URL")
    return throughProxies(services, proxiesUrl) if proxiesUrl and proxies else services


def throughProxies(services: Services, proxiesUrl: str) -> Services:
    """``services`` with every address replaced by its server's proxy."""
    from integration_tests.toxiproxy import Toxiproxy, proxiedUrl

    proxies = Toxiproxy(proxiesUrl)
    proxies.reset()  # no fault left over from an interrupted run

    def through(url: str, kind: str) -> str:
        return proxiedUrl(url, proxies.proxy(SERVERS[kind].proxy)) if url else url

    return replace(
        services,
        pgUrl=through(services.pgUrl, "postgres"),
        bootstrap=proxies.proxy("kafka").listen if services.bootstrap else "",
        s3=replace(services.s3, endpoint=through(services.s3.endpoint, "s3"))
        if services.s3
        else None,
        mariadbUrl=through(services.mariadbUrl, "mariadb"),
        proxies=proxies,
    )
