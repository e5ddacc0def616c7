"""Whether an S3 endpoint's certificate verifies: one TLS handshake, before anything is sent.

botocore retries a handshake that fails to verify (and s3fs each of those attempts again), so
a wrong CA surfaces only after many seconds, as a connection error among others. A handshake of
our own under the same trust (the CA file s3fs is given, ``AWS_CA_BUNDLE``, or the default
store) tells that case apart at once. Used by the files sink's driver checks and by the
decision log on S3; each turns a refusal into its own error.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from twophase.clients.tlsverify import certificateProblem
from twophase.redaction import getLogger, redact

log = getLogger(__name__)

HANDSHAKE_TIMEOUT = 10.0
"""Seconds the check's TCP connect and TLS handshake may take."""

_verified: set[tuple[str, str, float]] = set()
"""(endpoint, the trust it verified under, that file's mtime) checked in this process."""
_lock = threading.Lock()


def caBundleOf(storage: Mapping[str, Any]) -> str | None:
    """The CA file s3fs verifies with under these storage options (``client_kwargs.verify``
    or ``AWS_CA_BUNDLE``), or ``None`` for the default trust store."""
    verify = (storage.get("client_kwargs") or {}).get("verify")
    if isinstance(verify, str) and verify:
        return verify
    return os.environ.get("AWS_CA_BUNDLE") or None


def endpointOf(storage: Mapping[str, Any]) -> str | None:
    """The S3 endpoint URL these storage options reach, or ``None`` for AWS's own."""
    endpoint = storage.get("endpoint_url") or (storage.get("client_kwargs") or {}).get(
        "endpoint_url"
    )
    endpoint = (
        endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    )
    return str(endpoint) if endpoint else None


def handshakeRefusal(endpoint: str, cafile: str | None, *, who: str) -> str | None:
    """``None`` when a TLS handshake with ``endpoint`` verifies under ``cafile`` (``None``: the
    default trust store, which honours ``SSL_CERT_FILE``), else what refused it, naming the
    endpoint and the trust. An endpoint that does not answer is ``None`` too: the calls that
    follow report it as unreachable. A verified (endpoint, trust) is not checked again in this
    process until the trust's file changes."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    port = parts.port or 443
    # The default store is what SSL_CERT_FILE or SSL_CERT_DIR name, when they are set.
    trust = cafile or os.environ.get("SSL_CERT_FILE") or os.environ.get("SSL_CERT_DIR") or ""
    stamp = os.stat(trust).st_mtime if trust and os.path.exists(trust) else 0.0
    key = (endpoint, f"{bool(cafile)}:{trust}", stamp)
    with _lock:
        if key in _verified:
            return None
    context = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    try:
        with socket.create_connection((host, port), timeout=HANDSHAKE_TIMEOUT) as raw:
            with context.wrap_socket(raw, server_hostname=host):
                pass
    except ssl.SSLCertVerificationError as exc:
        problem = certificateProblem(
            str(exc.verify_message),
            name=host,
            ca=cafile or "the default trust store",
            caOption="fs.ca_bundle (AWS_CA_BUNDLE for the decision log, SSL_CERT_FILE for "
            "delta-rs and pyiceberg)",
        )
        return redact(f"the S3 endpoint {endpoint}, reached for {who}: {problem}")
    except OSError as exc:
        log.debug("TLS check of %s skipped: %s", endpoint, exc)
        return None
    with _lock:
        _verified.add(key)
    return None


def storageRefusal(storage: Mapping[str, Any], *, who: str) -> str | None:
    """:func:`handshakeRefusal` for the ``https://`` endpoint these s3fs storage options reach;
    ``None`` for any other endpoint."""
    endpoint = endpointOf(storage)
    if not endpoint or urlsplit(endpoint).scheme.lower() != "https":
        return None
    return handshakeRefusal(endpoint, caBundleOf(storage), who=who)


__all__ = ["caBundleOf", "endpointOf", "handshakeRefusal", "storageRefusal"]
