"""The schema registry client against a registry that requires HTTP basic auth.

services/registry.sh runs, beside the open registry, one whose every API path requires a user
and password (Quarkus's basic auth over its embedded users: Apicurio's own authentication needs an
OIDC server). With ``schema.registry.basic.auth.user.info`` the client registers and looks up a
schema; without it, or with a wrong password, the registry's 401 is one error of code
``TWOPHASE_BAD_OPTION`` (never retried) that names the option to fix and shows no password, in
its message or in any log line; the checkpoint's allow-list keeps the URL and not the user info.
"""

from __future__ import annotations

import json
import logging
import uuid

import pytest

from integration_tests.conftest import HOW_TO_START, service_setting
from twophase.failures.causes import failureOfText
from twophase.failures.classify import Classifier
from twophase.failures.codes import declaredCode, marked
from twophase.schemaregistry.client import (
    SAFE_REGISTRY_SETTINGS,
    register,
    registryClient,
    registryConfig,
)
from twophase.settings import TwoPhaseConfigError

SCHEMA = json.dumps({"type": "record", "name": "Row", "fields": [{"name": "id", "type": "long"}]})


@pytest.fixture(scope="module")
def secured() -> tuple[str, str, str]:
    """The basic-auth registry's URL, user and password."""
    names = ("URL", "USER", "PASSWORD")
    values = [service_setting(f"TWOPHASE_SCHEMA_REGISTRY_AUTH_{n}") for n in names]
    if not all(values):
        pytest.fail(f"TWOPHASE_SCHEMA_REGISTRY_AUTH_* are not set: {HOW_TO_START}", pytrace=False)
    url, user, password = (str(v) for v in values)
    return url, user, password


def test_the_client_sends_basic_auth_and_a_refusal_is_fatal_and_shows_no_password(
    secured: tuple[str, str, str], caplog: pytest.LogCaptureFixture
) -> None:
    url, user, password = secured
    subject = f"it-auth-{uuid.uuid4().hex[:8]}-value"
    caplog.set_level(logging.DEBUG)
    options = {
        "schema.registry.url": url,
        "schema.registry.basic.auth.user.info": f"{user}:{password}",
    }
    config = registryConfig(options)
    assert config is not None
    found = register(registryClient(config), subject, SCHEMA, "AVRO")
    assert found.schemaId > 0 and found.version == 1
    assert set(SAFE_REGISTRY_SETTINGS) & {"basic.auth.user.info"} == set()

    wrong = f"{user}:not-{password}"
    for info in (None, wrong):
        given = {"schema.registry.url": url}
        if info is not None:
            given["schema.registry.basic.auth.user.info"] = info
        settings = registryConfig(given)
        assert settings is not None
        with pytest.raises(TwoPhaseConfigError) as refused:
            register(registryClient(settings), subject, SCHEMA, "AVRO")
        message = str(refused.value)
        assert "401" in message and "schema.registry.basic.auth.user.info" in message
        assert password not in message
        code = declaredCode(refused.value)
        assert code == "TWOPHASE_BAD_OPTION"
        verdict = Classifier().classify(failureOfText(marked(code, message)))
        assert not verdict.recoverable
    assert password not in caplog.text
