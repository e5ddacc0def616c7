"""What ``twophase doctor`` says of the Kafka sink's ACLs: read with DescribeAcls when the
principal may, compared with the ACLs the sink needs (``access.sinkAcls``).

DescribeAcls needs DESCRIBE on the cluster, which a least-privileged principal rarely has
(DescribeCluster's authorized operations tell): then doctor says it cannot look and why, and
the driver's check before the first batch
(``access.checkAccess``) still names what is missing. Read-only: nothing is created.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twophase.clients.kafka import connectionConfig, letGo
from twophase.clients.kafka.errors import errorText, newClient
from twophase.clients.kafka.logs import ClientLog
from twophase.redaction import redact
from twophase.sinks.kafka.access import Acl, principalOf, sinkAcls

_IMPLIES_DESCRIBE = ("READ", "WRITE", "DELETE", "ALTER", "ALL")
"""Operations that grant DESCRIBE on the same resource."""

_SUPER = ("ALTER", "ALTER_CONFIGS", "CLUSTER_ACTION", "CREATE", "DESCRIBE_CONFIGS")
"""Cluster operations a super user is authorized for, beside DESCRIBE."""


def _covers(binding: Any, needed: Acl) -> bool:
    """True when the ALLOW ``binding`` grants ``needed``."""
    kind = {"BROKER": "CLUSTER"}.get(binding.restype.name, binding.restype.name)
    kind = str(kind).replace("_", "").upper()
    if kind != needed.resourceType.upper():
        return False
    pattern = str(binding.resource_pattern_type.name)
    if pattern == "LITERAL":
        if binding.name not in (needed.name, "*"):
            return False
    elif pattern == "PREFIXED":
        if not needed.name.startswith(binding.name):
            return False
    else:
        return False
    operation = str(binding.operation.name)
    if operation in ("ALL", needed.operation.upper()):
        return True
    return needed.operation.upper() == "DESCRIBE" and operation in _IMPLIES_DESCRIBE


def describeSinkAcls(
    config: Mapping[str, Any], topic: str | None, prefix: str, timeoutSeconds: float
) -> tuple[str, bool]:
    """One line for doctor, and whether an ACL the sink needs is missing."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    principal = principalOf(config)
    bootstrap = redact(str(config.get("bootstrap.servers")))
    settings = connectionConfig(config)
    settings.setdefault("logger", ClientLog("doctor"))
    admin = newClient(AdminClient, settings, "admin client")
    anything: Any = None  # a filter's None matches every name and host
    wanted = AclBindingFilter(
        ResourceType.ANY,
        anything,
        ResourcePatternType.ANY,
        principal,
        anything,
        AclOperation.ANY,
        AclPermissionType.ALLOW,
    )
    cannot = (
        f"cannot look: DescribeAcls needs DESCRIBE on the cluster, which {principal} lacks. "
        "The driver checks the sink's ACLs before its first batch and names any that is "
        "missing"
    )
    futures: list[Any] = []
    try:
        futures.append(
            admin.describe_cluster(
                include_authorized_operations=True, request_timeout=timeoutSeconds
            )
        )
        cluster = futures[-1].result(timeout=timeoutSeconds + 5)
        allowed = set(cluster.authorized_operations or ())
        if not allowed & {AclOperation.DESCRIBE, AclOperation.ALL}:
            return cannot, False
        if AclOperation.ALL in allowed or set(_SUPER) <= {o.name for o in allowed}:
            # a super user needs no ACL (and has none); neither does ALL on the cluster tell
            return f"{principal} may do everything on the cluster (a super user)", False
        futures.append(admin.describe_acls(wanted, request_timeout=timeoutSeconds))
        bindings = futures[-1].result(timeout=timeoutSeconds + 5)
    except Exception as exc:
        return (
            f"cannot look: DescribeAcls as {principal} was refused ({errorText(exc)}); it needs "
            "DESCRIBE on the cluster. The driver checks the sink's ACLs before its first batch "
            "and names any that is missing",
            False,
        )
    finally:
        letGo(admin, futures, timeoutSeconds)
    needed = sinkAcls(topic, prefix)
    missing = [a for a in needed if not any(_covers(b, a) for b in bindings)]
    if not missing:
        return f"{principal} holds the {len(needed)} ACLs the sink needs", False
    fixes = "; ".join(a.grant(principal, bootstrap) for a in missing)
    names = ", ".join(a.describe() for a in missing)
    return f"{principal} lacks {names}. Fix: {fixes}", True
