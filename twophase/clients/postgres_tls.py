"""Why a TLS connection to PostgreSQL failed, in words that name the server, the CA and the fix.

A server that refuses the client's certificate (``sslcert``: expired, or of a CA it does not
trust) answers with a TLS alert, which names the reason. libpq says only ``certificate verify
failed`` when the server's certificate is not signed by the ``sslrootcert`` CA, has expired or
is not valid yet. ``tlsProblem`` recognises libpq's TLS failures and, for that one, asks the
server itself: a handshake of our own after PostgreSQL's ``SSLRequest``, against the same CA,
whose verification error says which it is (``twophase.clients.tlsverify``).
A TLS failure is never retried: the same certificate fails the same way
(``twophase.clients.postgres.connect``).
"""

from __future__ import annotations

import struct

from twophase.clients.tlsverify import certificateProblem, probe

SSL_REQUEST = struct.pack("!ii", 8, 80877103)
"""PostgreSQL's SSLRequest: length 8, then the code 1234.5679."""

_TLS_MARKERS = ("ssl error", "certificate", "ssl syscall", "sslmode", "ssl ")


def isTlsFailure(text: str) -> bool:
    """libpq's message ``text`` is about TLS (the handshake, a certificate, sslmode)."""
    lowered = text.lower()
    return any(marker in lowered for marker in _TLS_MARKERS)


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
        return certificateProblem(text.strip(), name=name, ca=ca, caOption="sslrootcert") + (
            f" (sslmode={mode} checks the name)"
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
            port = int(params.get("port") or 5432)
            why = probe(host, port, ca, checkHostname=False, preamble=SSL_REQUEST)
        if why is not None:
            return certificateProblem(
                why, name=name, ca=f"sslrootcert={ca}", caOption="sslrootcert"
            )
        return (
            f"the server's certificate did not verify against the CA in sslrootcert={ca} "
            "(certificate verify failed). Fix: give sslrootcert the CA that signed the "
            "server's certificate, or have the server's certificate renewed if it expired."
        )
    return f"TLS failed (sslmode={mode}, sslrootcert={ca}). Fix: check the TLS options."


__all__ = ["SSL_REQUEST", "isTlsFailure", "tlsProblem"]
