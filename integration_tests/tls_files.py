"""Certificates the secured-server tests make for themselves: a CA that signed nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path


def otherCa(directory: Path) -> str:
    """The PEM file of a new CA of the test's own, which signed no server's certificate."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=not the server's CA", "-keyout", str(directory / "other-ca.key")]
        + ["-out", str(directory / "other-ca.pem")],
        check=True,
        capture_output=True,
    )
    return str(directory / "other-ca.pem")
