"""The S3 endpoint's TLS trust: the CA bundle option, its file on each process, and a handshake
checked before anything is written.

A private S3 server (MinIO, versitygw, Ceph behind a company CA) presents a certificate no
public CA signs. ``fs.ca_bundle`` names a PEM file of the CAs to trust (AWS's own name for the
setting, ``ca_bundle`` in an AWS profile, ``AWS_CA_BUNDLE`` in the environment); the files
sink hands it to s3fs as ``client_kwargs={"verify": <file>}``, and checks, on the driver before
each batch, that a TLS handshake with the endpoint verifies under it. A certificate that does
not verify is one error naming the endpoint and the CA, of code ``TWOPHASE_CREDENTIALS``: never
retried, since every retry meets the same certificate. The file is read where each filesystem
is opened, on the driver and on every executor, so it must exist at the same path on every
host: a missing one is an error naming the path and the host.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import fsspec

from twophase.redaction import getLogger, redact
from twophase.sinks.files.errors import FilesTrustError, isUntrusted
from twophase.sinks.files.s3 import S3_PROTOCOLS

log = getLogger(__name__)

CA_BUNDLE = "ca_bundle"
"""The storage option (``fs.ca_bundle``) naming the PEM file of the CAs an S3 endpoint is
verified with."""

HANDSHAKE_TIMEOUT = 10.0
"""Seconds the check's TCP connect and TLS handshake may take."""

_verified: set[tuple[str, str, float]] = set()
"""(endpoint, the trust it verified under, that file's mtime) checked in this process."""
_lock = threading.Lock()


def withCaBundle(storage: dict[str, Any]) -> dict[str, Any]:
    """``storage`` (the ``fs.*`` options, prefix removed) with ``ca_bundle`` moved to s3fs's
    ``client_kwargs["verify"]`` (other ``client_kwargs`` kept); ``ValueError`` for an empty or
    non-text value, or one that contradicts a ``client_kwargs.verify`` also given."""
    if CA_BUNDLE not in storage:
        return storage
    out = dict(storage)
    path = out.pop(CA_BUNDLE)
    if not isinstance(path, str) or not path.strip():
        raise ValueError(
            "option fs.ca_bundle must name a PEM file of the CAs to trust "
            "(e.g. fs.ca_bundle=/etc/ssl/private-ca.pem)"
        )
    kwargs = dict(out.get("client_kwargs") or {})
    given = kwargs.get("verify")
    if given is not None and given != path.strip():
        raise ValueError(
            "options fs.ca_bundle and fs.client_kwargs.verify disagree: give the CA file once, "
            "as fs.ca_bundle"
        )
    kwargs["verify"] = path.strip()
    out["client_kwargs"] = kwargs
    return out


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


def checkCaFile(path: str) -> None:
    """Refuse a CA file missing on this host or holding no PEM certificate, naming the path and
    the host: the file must be at the same path on the driver and on every executor."""
    host = socket.gethostname()
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as exc:
        raise FilesTrustError(
            f"the CA file {path} (fs.ca_bundle) cannot be read on host {host}: "
            f"{exc.strerror or exc}. The file must exist at the same path on the driver and on "
            "every executor: copy it there (or ship it with spark.files and name the path it "
            "lands at on each host)"
        ) from None
    if b"-----BEGIN CERTIFICATE-----" not in text:
        raise FilesTrustError(
            f"the CA file {path} (fs.ca_bundle) on host {host} holds no PEM certificate "
            "(-----BEGIN CERTIFICATE-----): give the CA's certificate in PEM form"
        )


def checkStorageTrust(storage: Mapping[str, Any]) -> None:
    """Where these storage options open a filesystem: the CA file they name is on this host."""
    verify = (storage.get("client_kwargs") or {}).get("verify")
    if isinstance(verify, str) and verify:
        checkCaFile(verify)


def checkPathTrust(path: str, storage: Mapping[str, Any], *, who: str = "s3fs") -> None:
    """:func:`checkEndpointTrust` for an output on ``s3://`` (or ``s3a://``); nothing elsewhere."""
    protocol = fsspec.core.split_protocol(path)[0]
    if protocol in S3_PROTOCOLS:
        checkEndpointTrust(storage, who=who)


def checkEndpointTrust(storage: Mapping[str, Any], *, who: str = "s3fs") -> None:
    """Driver, before anything is written: a TLS handshake with the ``https://`` endpoint of
    these storage options verifies under their CA file (or the default trust store).

    A certificate that does not verify raises :class:`FilesTrustError` naming the endpoint and
    the CA; an endpoint that does not answer is left to the writes, which report it as
    unreachable. A verified (endpoint, CA file) is not checked again in this process until the
    file changes.
    """
    endpoint = endpointOf(storage)
    if not endpoint or urlsplit(endpoint).scheme.lower() != "https":
        return
    cafile = caBundleOf(storage)
    if cafile:
        checkCaFile(cafile)
    verifyHandshake(endpoint, cafile, who=who)


def verifyHandshake(endpoint: str, cafile: str | None, *, who: str) -> None:
    """A TLS handshake with ``endpoint`` verified under ``cafile`` (``None``: the default trust
    store, which honours ``SSL_CERT_FILE``); :class:`FilesTrustError` when it does not verify."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    port = parts.port or 443
    # The default store is what SSL_CERT_FILE or SSL_CERT_DIR name, when they are set.
    trust = cafile or os.environ.get("SSL_CERT_FILE") or os.environ.get("SSL_CERT_DIR") or ""
    stamp = os.stat(trust).st_mtime if trust and os.path.exists(trust) else 0.0
    key = (endpoint, f"{bool(cafile)}:{trust}", stamp)
    with _lock:
        if key in _verified:
            return
    context = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    try:
        with socket.create_connection((host, port), timeout=HANDSHAKE_TIMEOUT) as raw:
            with context.wrap_socket(raw, server_hostname=host):
                pass
    except ssl.SSLCertVerificationError as exc:
        trusted = f"the CA in {cafile}" if cafile else "the default trust store"
        raise FilesTrustError(
            redact(
                f"the S3 endpoint {endpoint} presented a certificate that {trusted} does not "
                f"verify for {who} ({exc.verify_message}); nothing was written"
            )
        ) from None
    except OSError as exc:
        log.debug("TLS check of %s skipped: %s", endpoint, exc)
        return
    with _lock:
        _verified.add(key)


__all__ = [
    "CA_BUNDLE",
    "FilesTrustError",
    "caBundleOf",
    "checkCaFile",
    "checkEndpointTrust",
    "checkPathTrust",
    "checkStorageTrust",
    "endpointOf",
    "isUntrusted",
    "verifyHandshake",
    "withCaBundle",
]
