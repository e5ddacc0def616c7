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

import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import fsspec

from twophase.clients.s3trust import caBundleOf, endpointOf, handshakeRefusal
from twophase.sinks.files.errors import FilesTrustError, isUntrusted
from twophase.sinks.files.s3 import S3_PROTOCOLS

CA_BUNDLE = "ca_bundle"
"""The storage option (``fs.ca_bundle``) naming the PEM file of the CAs an S3 endpoint is
verified with."""


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
    refusal = handshakeRefusal(endpoint, cafile, who=who)
    if refusal is not None:
        raise FilesTrustError(f"{refusal.rstrip('.')}; nothing was written")


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
