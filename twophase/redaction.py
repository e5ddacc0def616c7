"""What of a sink's options may be written down or shown: one allow-list, one redaction.

The checkpoint directory is often shared storage, and log lines end up in log systems, so a
secret must reach neither. Two rules, used everywhere (``sink.json``, log lines, error text):

- only options on an allow-list are persisted: the shared options every sink has, plus the
  ones a sink declares safe (its ``safeOptions``). Anything else, whatever its name, is not;
- text that is shown (log lines, error messages) passes through ``redact``: URL passwords,
  ``password=``-style parameters, private keys and the values of every option this process saw
  that is not on the allow-list are replaced by ``***``. A persisted value loses the first
  three the same way; one that holds the value of another of its sink's unlisted options is
  not persisted at all (``publicOptions``).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping

from twophase.options import SHARED_OPTIONS, keptOptions

REDACTED = "***"

SHARED_SAFE_OPTIONS = keptOptions(SHARED_OPTIONS)
"""Options of every sink (lower-cased) that hold no secret and that recovery may need."""

_MIN_SECRET_LENGTH = 4
"""Shorter option values are not scrubbed from text: ``true`` or ``10`` would blank out logs."""

# scheme://user:password@host -> scheme://user:***@host (a password may itself hold '@').
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][\w+.-]*://)(?P<userinfo>[^/\s?#]*)@")
# password=..., sslpassword=..., clientSecret=..., in URLs' queries, conninfo and JAAS text;
# 'key: value' only with a space, so a user name such as secret_app in user:pw@host stays.
_SECRET_PARAM = re.compile(
    r"(?P<key>\b[\w.-]*(?:password|passwd|secret|token|credential|apikey|api_key|"
    r"access_key|secret_key|private_key)[\w.-]*(?:\s*=\s*|:\s+))"
    r"(?P<value>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|[^\s&;,}]+)",
    re.IGNORECASE,
)
_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S
)

_secrets: set[str] = set()
_secretsLock = threading.Lock()


def isSafeOption(name: str, safe: Iterable[str] = ()) -> bool:
    """True when option ``name`` (any case) is shared or in ``safe``: it may be persisted."""
    key = name.lower()
    return key in SHARED_SAFE_OPTIONS or key in {s.lower() for s in safe}


def publicOptions(
    options: Mapping[str, str],
    safe: Iterable[str] = (),
    among: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The options that may be written to the checkpoint: allow-listed keys, each value without
    URL passwords, password-like parameters or private keys.

    A value that holds the value of one of the sink's own options off the allow-list (``among``,
    all its options; ``options`` when not given) is left out, with a warning naming the option:
    written with a hole in it, it would rebuild the wrong sink. Values other queries of the
    process remembered (``rememberSecrets``) do not touch it: a database named like another
    query's password stays whole.
    """
    allowed = {s.lower() for s in safe} | SHARED_SAFE_OPTIONS
    unlisted = _unlistedValues(options if among is None else among, safe)
    kept: dict[str, str] = {}
    for key, value in sorted(options.items()):
        if key.lower() not in allowed:
            continue
        shown = redactForms(str(value))
        if any(secret in shown for secret in unlisted):
            getLogger(__name__).warning(
                "option %s is not written to sink.json: its value holds the value of another "
                "option of the sink that is not kept (it may be a secret); give it again to "
                "twophase recover or doctor (--sink-option %s=...)",
                key,
                key,
            )
            continue
        kept[key] = shown
    return kept


def _unlistedValues(options: Mapping[str, str], safe: Iterable[str]) -> set[str]:
    """The values of ``options`` off the allow-list, long enough to be told apart."""
    return {
        str(value)
        for key, value in options.items()
        if not isSafeOption(key, safe) and len(str(value)) >= _MIN_SECRET_LENGTH
    }


def rememberSecrets(options: Mapping[str, str], safe: Iterable[str] = ()) -> None:
    """Scrub, from every later ``redact`` in this process, the values of options not allowed.

    A value that is not on the allow-list may be a secret whatever its name
    (``kafka.sasl.oauthbearer.config``, ``kafka.ssl.key.pem``, a user's own ``apiKey``...).
    """
    found = _unlistedValues(options, safe)
    if found - _secrets:
        with _secretsLock:
            _secrets.update(found)


def redact(text: str) -> str:
    """``text`` without secrets: URL passwords, password-like parameters, private keys and the
    values of options remembered by ``rememberSecrets``, each replaced by ``***``."""
    if not text:
        return text
    for secret in sorted(_secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return redactForms(text)


def redactForms(text: str) -> str:
    """``text`` without what the form of a secret gives away: private keys, URL passwords,
    password-like parameters."""
    text = _PRIVATE_KEY.sub(REDACTED, text)
    text = _URL_USERINFO.sub(_userinfoWithoutPassword, text)
    return _SECRET_PARAM.sub(lambda m: m.group("key") + REDACTED, text)


def _userinfoWithoutPassword(match: re.Match[str]) -> str:
    user, sep, _ = match.group("userinfo").partition(":")
    return f"{match.group('scheme')}{user}{':' + REDACTED if sep else ''}@"


class RedactingFilter(logging.Filter):
    """Redacts a log record's message, arguments and traceback before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text, record.exc_info = redact(text), None
        return True


_FILTER = RedactingFilter()


def getLogger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` whose records are redacted: use it in every twophase module."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
