"""The words and fix for each way a server's certificate fails to verify."""

from __future__ import annotations

import pytest

from twophase.clients.tlsverify import certificateProblem, probe


@pytest.mark.parametrize(
    ("message", "says", "fix"),
    [
        ("certificate has expired", "has expired, though the CA in ca.pem signed it", "renewed"),
        ("certificate is not yet valid", "is not valid yet", "clock"),
        ("Hostname mismatch, certificate is not valid for 'db'.", "not for the name 'db'", "name"),
        ("IP address mismatch, certificate is not valid for '10.0.0.1'.", "'db'", "name"),
        (
            'server certificate for "localhost" does not match host name "db"',
            "not for the name 'db'",
            "connect by a name the certificate holds",
        ),
        ("unable to get local issuer certificate", "did not verify against the CA", "ssl_ca"),
    ],
)
def test_each_verification_failure_gets_its_own_fix(message: str, says: str, fix: str) -> None:
    text = certificateProblem(message, name="db", ca="ca.pem", caOption="ssl_ca")
    assert says in text and message in text
    assert fix in text.split("Fix:")[1]


def test_a_probe_of_nothing_listening_cannot_tell() -> None:
    import socket

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    assert probe("127.0.0.1", port, None, timeout=1.0) is None
