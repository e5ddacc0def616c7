"""Why a TLS connection to PostgreSQL failed, in words that name the server, the CA and the fix.

A server that refuses the client's certificate (``sslcert``: expired, or of a CA it does not
trust) answers with a TLS alert, which names the reason. libpq says only ``certificate verify
failed`` when the server's certificate is not signed by the ``sslrootcert`` CA, has expired or
is not valid yet. ``tlsProblem`` recognises libpq's TLS failures and, for that one, asks the
server itself: it opens a TCP connection, sends PostgreSQL's ``SSLRequest`` and runs the TLS
handshake with Python's ``ssl`` against the same CA, whose verification error says which it is.
A TLS failure is never retried: the same certificate fails the same way
(``twophase.clients.postgres.connect``).
"""

from __future__ import annotations

import socket
import ssl
import struct

from twophase.redaction import getLogger

log = getLogger(__name__)

_SSL_REQUEST = struct.pack("!ii", 8, 80877103)
"""PostgreSQL's SSLRequest: length 8, then the code 1234.5679."""

_TLS_MARKERS = ("ssl error", "certificate", "ssl syscall", "sslmode", "ssl ")


def isTlsFailure(text: str) -> bool:
    """libpq's message ``text`` is about TLS (the handshake, a certificate, sslmode)."""
    lowered = text.lower()
    return any(marker in lowered for marker in _TLS_MARKERS)


def _handshake(host: str, port: int, caFile: str, timeout: float) -> str | None:
    """The verification error of a TLS handshake with the server at ``host:port`` against
    ``caFile`` (hostname not checked: libpq says a name mismatch itself); ``None`` when it
    verifies, or the probe itself cannot tell."""
    context = ssl.create_default_context(cafile=caFile)
    context.check_hostname = False
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            raw.sendall(_SSL_REQUEST)
            if raw.recv(1) != b"S":
                return "the server does not accept TLS (it answered the SSLRequest with no)"
            with context.wrap_socket(raw):
                return None
    except ssl.SSLCertVerificationError as exc:
        return str(exc.verify_message)
    except (OSError, ssl.SSLError):
        log.debug("postgres: TLS probe of %s:%d failed", host, port, exc_info=True)
        return None


def tlsProblem(text: str, params: dict[str, str]) -> str | None:
    """What went wrong with TLS in libpq's error ``text`` for a connection with libpq
    ``params``, with the CA named and the fix; ``None`` when it is not about TLS."""
    if not isTlsFailure(text):
        return None
    ca = params.get("sslrootcert") or "~/.postgresql/root.crt (libpq's default)"
    mode = params.get("sslmode") or "prefer"
    host = params.get("hostaddr") or params.get("host") or "localhost"
    name = params.get("host") or host
    lowered = text.lower()
    if "does not match host name" in lowered:
        return (
            f"the server's certificate (verified against the CA in sslrootcert={ca}) is not for "
            f"host name {name!r}, which sslmode={mode} checks. Fix: connect by a name the "
            "certificate holds, or have the server's certificate issued for this name."
        )
    if "alert" in lowered and params.get("sslcert"):  # the server refused our certificate
        refused = "it has expired" if "expired" in lowered else "the server does not trust it"
        return (
            f"the server refused the client certificate sslcert={params['sslcert']}: {refused} "
            f"(the server's own certificate verified against sslrootcert={ca}). Fix: give a "
            "client certificate that is valid now and signed by a CA the server trusts "
            "(its ssl_ca_file)."
        )
    if "certificate verify failed" in lowered:
        why = None
        if params.get("sslrootcert") and not host.startswith("/"):
            why = _handshake(host, int(params.get("port") or 5432), ca, 5.0)
        return (
            f"the server's certificate did not verify against the CA in sslrootcert={ca} "
            f"({why or 'certificate verify failed'}). Fix: give sslrootcert the CA that signed "
            "the server's certificate, or have the server's certificate renewed if it expired."
        )
    return f"TLS failed (sslmode={mode}, sslrootcert={ca}). Fix: check the TLS options."


__all__ = ["isTlsFailure", "tlsProblem"]
