"""Certificates the secured-server tests make for themselves: a CA that signed nothing, and
certificates from the set's CA that have expired."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
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


def expiredCertificate(
    directory: Path, caFile: str, commonName: str, keyFile: str | None = None
) -> tuple[str, str]:
    """A certificate for ``commonName`` signed by the set's CA (its key beside ``caFile``, kept
    for tests like these), valid from ten days ago until yesterday: (cert, key). With
    ``keyFile`` it certifies that key (a server's own, so the server can present it) and holds
    the set's server names (127.0.0.1 and localhost); else a new key, for a client."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    tls = Path(caFile).parent
    ca = x509.load_pem_x509_certificate((tls / "ca.pem").read_bytes())
    caKey = serialization.load_pem_private_key((tls / "ca.key").read_bytes(), None)
    assert isinstance(caKey, rsa.RSAPrivateKey)
    keyPath = directory / "expired.key"
    if keyFile is None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        keyPath.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    else:
        keyPath.write_bytes(Path(keyFile).read_bytes())
    keyPath.chmod(0o600)
    loaded = serialization.load_pem_private_key(keyPath.read_bytes(), None)
    assert isinstance(loaded, rsa.RSAPrivateKey)
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, commonName)]))
        .issuer_name(ca.subject)
        .public_key(loaded.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=10))
        .not_valid_after(now - timedelta(days=1))
    )
    if keyFile is not None:
        import ipaddress

        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(caKey, hashes.SHA256())
    certPath = directory / "expired.pem"
    certPath.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(certPath), str(keyPath)


def resolvesHere() -> str | None:
    """A name of this machine that resolves to 127.0.0.1 and is not one the set's server
    certificate holds (its host name, on these machines), or None."""
    import socket

    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        return None
    return name if address == "127.0.0.1" and name not in ("localhost", "127.0.0.1") else None
