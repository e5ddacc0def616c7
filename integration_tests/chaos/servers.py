"""The servers a chaos pipeline may crash: where they are, and how one is killed and restarted.

A pipeline names the servers it depends on by kind (``pipelines/``); a timed kill of that kind
SIGKILLs the server (or shuts PostgreSQL down immediately) through its services/*.sh script,
keeps it down for the event's ``downSeconds`` and starts it again on the same data and port
(``conftest.ServiceControl``). A sink that needs a new server adds its kind here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from integration_tests.conftest import SERVICES_DIR, S3Service, ServiceControl, service_setting


@dataclass(frozen=True)
class Server:
    """One kind of server: its script in services/, the noun of its verbs (``kill-<noun>``,
    ``start-<noun>``) and the pytest fixture that fails clearly when it is not running."""

    script: str
    noun: str
    fixture: str


SERVERS = {
    "broker": Server("kafka.sh", "broker", "kafka_bootstrap"),
    "postgres": Server("postgres.sh", "server", "pg_url"),
    "s3": Server("s3.sh", "server", "s3"),
    "mariadb": Server("mariadb.sh", "server", "mariadb_url"),
}
"""Every kind of server a schedule may kill, in the order of the report's columns."""


@dataclass
class Services:
    """Where the servers of ``make services`` are, and how the runner crashes one of them."""

    pgUrl: str = ""
    bootstrap: str = ""
    s3: Any = None
    """The S3 server (``conftest.S3Service``) of the ``s3`` pipeline."""
    mariadbUrl: str = ""
    """The SQLAlchemy URL of the MariaDB of the ``mariadb`` pipeline."""

    def crash(self, kind: str, downSeconds: float) -> None:
        """Kill the server of ``kind``, keep it down ``downSeconds``, start it again."""
        server = SERVERS[kind]
        control = ServiceControl(SERVICES_DIR / server.script, server.noun)
        control.kill()
        time.sleep(downSeconds)
        control.start()


def servicesFromEnvironment() -> Services:
    """The servers of ``make services`` (environment first, then .services.env)."""
    names = ("ENDPOINT", "ACCESS_KEY", "SECRET_KEY", "BUCKET")
    s3 = [service_setting(f"TWOPHASE_S3_{n}") or "" for n in names]
    return Services(
        pgUrl=service_setting("TWOPHASE_PG_URL") or "",
        bootstrap=service_setting("TWOPHASE_KAFKA_BOOTSTRAP") or "",
        s3=S3Service(*s3) if all(s3) else None,
        mariadbUrl=service_setting("TWOPHASE_MARIADB_URL") or "",
    )
