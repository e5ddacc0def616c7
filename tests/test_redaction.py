"""One allow-list and one redaction for sink.json, log lines and error messages."""

from __future__ import annotations

import json
import logging

import pytest

from twophase import redaction
from twophase.redaction import getLogger, publicOptions, redact, rememberSecrets


@pytest.fixture(autouse=True)
def _forgetSecrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redaction, "_secrets", set())


@pytest.mark.parametrize(
    "text, secret",
    [
        ("postgresql://:pw-only-1@db:5432/x", "pw-only-1"),
        ("postgresql://u:p@ss-2@db/x", "p@ss-2"),
        ("postgresql://u@db/x?password=query-3&sslmode=require", "query-3"),
        ("host=db password=conninfo-4 user=u", "conninfo-4"),
        ("host=db password='quoted 5' user=u", "quoted 5"),
        (
            'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" '
            'password="jaas-6";',
            "jaas-6",
        ),
        ("clientId=app clientSecret=oauth-7 scope=x", "oauth-7"),
        (
            "-----BEGIN PRIVATE KEY-----\nMIIEvAIBADANBgkq8\n-----END PRIVATE KEY-----",
            "MIIEvAIBADANBgkq8",
        ),
        ("-----BEGIN ENCRYPTED PRIVATE KEY-----\nabcdefKEY9", "abcdefKEY9"),
    ],
)
def test_redact_removes_every_form_of_credential(text: str, secret: str) -> None:
    clean = redact(text)
    assert secret not in clean
    assert "***" in clean


def test_redact_keeps_what_is_not_secret() -> None:
    text = "postgresql://app@db:5432/x?sslmode=require topic=events commitRetries=3"
    assert redact(text) == text


def test_a_user_named_like_a_secret_keeps_the_host_and_database() -> None:
    text = "postgresql://tp_secret_app:pw-13@db:5432/x"
    assert redact(text) == "postgresql://tp_secret_app:***@db:5432/x"
    assert redact("clientSecret: pw-14 and token:x") == "clientSecret: *** and token:x"


def test_public_options_is_an_allow_list() -> None:
    options = {
        "checkpointLocation": "/ckpt",
        "sinkId": "s1",
        "path": "/data",
        "apiKey": "no-pattern-names-this-one",
        "kafka.sasl.oauthbearer.config": "clientSecret=abc",
    }
    public = publicOptions(options, {"path"})
    assert public == {"checkpointLocation": "/ckpt", "path": "/data", "sinkId": "s1"}


def test_allowed_values_are_still_redacted() -> None:
    public = publicOptions({"url": "postgresql://u:pw-8@db/x"}, {"url"})
    assert public == {"url": "postgresql://u:***@db/x"}


def test_a_kept_value_is_never_rewritten_by_another_query_s_secret() -> None:
    """Another query of the process had the password ``orders-db``: this sink's database of
    that name stays whole in sink.json (written as ``***``, it would rebuild the wrong sink)."""
    rememberSecrets({"password": "orders-db"})
    url = "postgresql://app@db:5432/orders-db"
    assert publicOptions({"url": url}, {"url"}) == {"url": url}
    assert redact(url) == "postgresql://app@db:5432/***"  # shown text still hides it


def test_a_kept_value_holding_the_sink_s_own_secret_is_left_out_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    options = {"url": "postgresql://svc-7@db/svc-7", "password": "svc-7", "path": "/data"}
    with caplog.at_level(logging.WARNING, logger="twophase.redaction"):
        public = publicOptions({"url": options["url"], "path": "/data"}, {"url", "path"}, options)
    assert public == {"path": "/data"}
    assert "option url is not written to sink.json" in caplog.text
    assert "svc-7" not in caplog.text


def test_values_of_options_off_the_allow_list_are_scrubbed_from_later_text() -> None:
    rememberSecrets({"apiKey": "opaque-token-9", "path": "/data", "flag": "yes"}, {"path"})
    assert redact("connect with opaque-token-9 to /data") == "connect with *** to /data"
    assert redact("yes") == "yes"  # short values are left: they would blank out logs


def test_log_records_are_redacted_with_their_tracebacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rememberSecrets({"password": "hunter2-10"})
    log = getLogger("twophase.test_redaction")
    with caplog.at_level(logging.INFO, logger="twophase.test_redaction"):
        log.info("connecting to %s with %s", "postgresql://u:pw-11@db/x", "hunter2-10")
        try:
            raise ValueError("server said: password=pw-12 is wrong")
        except ValueError:
            log.exception("failed")
    text = caplog.text + json.dumps([r.getMessage() for r in caplog.records])
    for secret in ("pw-11", "hunter2-10", "pw-12"):
        assert secret not in text
