"""Why a server's certificate did not verify, in the same words and fixes for every system.

Clients say little: librdkafka says "broker certificate could not be verified" whether the CA
is wrong, the certificate has expired or it is for another name, and its advice (set
``ssl.ca.location``) fits only the first. OpenSSL's verification message, from the client's
own error where it has one or from a handshake of our own under the same trust, says which it
is; each needs another fix.
"""

from __future__ import annotations

import socket
import ssl

from twophase.redaction import getLogger

log = getLogger(__name__)

PROBE_TIMEOUT = 5.0
"""Seconds the probe's TCP connect and TLS handshake may take."""

_NAME_MARKERS = ("hostname mismatch", "ip address mismatch", "does not match host name")


def probe(
    host: str,
    port: int,
    cafile: str | None,
    *,
    checkHostname: bool = True,
    preamble: bytes = b"",
    timeout: float = PROBE_TIMEOUT,
) -> str | None:
    """OpenSSL's verification message for a TLS handshake with ``host:port`` under the CA in
    ``cafile`` (``None``: the default store); ``None`` when it verifies or the probe cannot
    tell. ``preamble`` is sent first and must be answered by ``S`` (PostgreSQL's
    SSLRequest)."""
    context = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    context.check_hostname = checkHostname
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            if preamble:
                raw.sendall(preamble)
                if raw.recv(1) != b"S":
                    return None
            with context.wrap_socket(raw, server_hostname=host):
                return None
    except ssl.SSLCertVerificationError as exc:
        return str(exc.verify_message)
    except (OSError, ssl.SSLError):
        log.debug("TLS probe of %s:%d failed", host, port, exc_info=True)
        return None


def certificateProblem(message: str, *, name: str, ca: str, caOption: str) -> str:
    """What OpenSSL's verification ``message`` means for a server reached as ``name`` and
    checked against ``ca`` (a file, or words for the default store), and its fix;
    ``caOption`` is the option that names the CA file."""
    lowered = message.lower()
    if "expired" in lowered:
        return (
            f"the server's certificate has expired, though the CA in {ca} signed it ({message}). "
            "Fix: have the server's certificate renewed, or, if it is still valid, this "
            "machine's clock set right; the CA option is not the problem."
        )
    if "not yet valid" in lowered:
        return (
            f"the server's certificate is not valid yet, though the CA in {ca} signed it "
            f"({message}). Fix: set this machine's clock right, or have the server present a "
            "certificate valid now."
        )
    if any(marker in lowered for marker in _NAME_MARKERS):
        return (
            f"the server's certificate (signed by the CA in {ca}) is not for the name {name!r} "
            f"it was reached by ({message}). Fix: connect by a name the certificate holds, or "
            "have the server's certificate issued for this name."
        )
    return (
        f"the server's certificate did not verify against the CA in {ca} ({message}). Fix: "
        f"set {caOption} to the PEM file of the CA that signed the server's certificate."
    )


__all__ = ["PROBE_TIMEOUT", "certificateProblem", "probe"]
