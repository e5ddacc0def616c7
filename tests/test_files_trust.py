"""``fs.ca_bundle``: how the files sink hands a CA file to s3fs, keeps its path, and refuses a
file that is missing or holds no certificate, naming the path and the host (no server: the
handshake itself is tested against the S3 server in integration_tests/test_s3_secured.py)."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest

from twophase.protocol.errors import SinkFailure
from twophase.sinks.files.errors import FilesSinkError, FilesTrustError, isUntrusted
from twophase.sinks.files.settings import SAFE_OPTIONS, FilesSettings
from twophase.sinks.files.trust import checkCaFile, checkPathTrust

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_the_ca_bundle_becomes_s3fs_verify_beside_other_client_kwargs(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text(PEM)
    settings = FilesSettings.fromOptions(
        {
            "path": "s3://b/p",
            "fs.ca_bundle": str(ca),
            "fs.client_kwargs": '{"region_name": "eu-west-1"}',
        }
    )
    assert settings.storageOptions["client_kwargs"] == {
        "region_name": "eu-west-1",
        "verify": str(ca),
    }
    assert "ca_bundle" not in settings.storageOptions
    assert "fs.ca_bundle" in SAFE_OPTIONS


def test_a_ca_bundle_that_contradicts_client_kwargs_verify_is_refused() -> None:
    with pytest.raises(ValueError, match="disagree: give the CA file once"):
        FilesSettings.fromOptions(
            {
                "path": "s3://b/p",
                "fs.ca_bundle": "/a.pem",
                "fs.client_kwargs": '{"verify": "/b.pem"}',
            }
        )
    with pytest.raises(ValueError, match="must name a PEM file"):
        FilesSettings.fromOptions({"path": "s3://b/p", "fs.ca_bundle": " "})


def test_a_missing_or_non_pem_ca_file_names_the_path_and_the_host(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(FilesTrustError) as refused:
        checkCaFile(str(missing))
    assert str(missing) in str(refused.value)
    assert socket.gethostname() in str(refused.value)
    assert refused.value.reason is SinkFailure.CREDENTIALS
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    with pytest.raises(FilesTrustError, match="holds no PEM certificate"):
        checkCaFile(str(key))


def test_only_an_https_s3_output_is_checked_and_a_failed_verification_is_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    missing = {"client_kwargs": {"verify": str(tmp_path / "none.pem")}}
    checkPathTrust(str(tmp_path / "out"), {"endpoint_url": "https://127.0.0.1:1", **missing})
    checkPathTrust("s3://b/p", {"endpoint_url": "http://127.0.0.1:1", **missing})
    with pytest.raises(FilesTrustError):
        checkPathTrust("s3://b/p", {"endpoint_url": "https://127.0.0.1:1", **missing})
    failed = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] unable to get")
    wrapped = OSError("SSL validation failed")
    wrapped.__cause__ = failed
    assert isUntrusted(wrapped)
    assert not isUntrusted(ConnectionRefusedError("refused"))
    assert FilesSinkError.classify(ConnectionRefusedError("refused")) is None
