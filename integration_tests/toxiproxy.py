"""The proxies of services/toxiproxy.sh: cut, slow or half-break one server's network.

``make services`` puts a Toxiproxy proxy in front of each server (``postgres``, ``mariadb``,
``s3``, ``kafka``); a client that connects to a proxy's ``listen`` address instead of the
server's own can then have its traffic disturbed (Toxiproxy's "toxics") while everything else
reaches the server directly. Kafka's proxy forwards to a broker listener that advertises the
proxy, so a client that bootstraps there stays on the proxy (services/kafka.sh).

Standard library only, so that any process (a test, the chaos soak, a Spark worker) can use it::

    proxies = Toxiproxy.fromEnvironment()
    pg = proxies.proxy("postgres")
    url = proxiedUrl(pgUrl, pg)  # connect here to be disturbed
    pg.loseReplies()  # requests reach the server, its answers never come back
    ...
    pg.heal()
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

PROXY_NAMES = ("postgres", "mariadb", "s3", "kafka")
"""The proxies services/services.sh makes, one per server."""

STREAMS = ("upstream", "downstream")
"""Toxiproxy's directions: ``upstream`` is client to server, ``downstream`` server to client."""


class ToxiproxyError(RuntimeError):
    """Toxiproxy refused a request (``status``: its HTTP status), or did not answer (None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Toxiproxy:
    """A client of Toxiproxy's HTTP API at ``url`` (``http://127.0.0.1:<port>``)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"Toxiproxy({self.url!r})"

    @classmethod
    def fromEnvironment(cls) -> Toxiproxy | None:
        """The Toxiproxy of ``make services`` (``TWOPHASE_TOXIPROXY_URL``, from the environment
        or .services.env), or None when it runs none."""
        from integration_tests.conftest import service_setting

        url = service_setting("TWOPHASE_TOXIPROXY_URL")
        return cls(url) if url else None

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One API request; its JSON answer (None when it has none)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data is not None else {},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            raise ToxiproxyError(
                f"toxiproxy at {self.url}: {method} {path} answered {exc.code}: {detail}",
                exc.code,
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ToxiproxyError(
                f"toxiproxy at {self.url} did not answer {method} {path} ({reason}); start it "
                "with `make services` (services/toxiproxy.sh)"
            ) from None
        return json.loads(text) if text.strip() else None

    def proxies(self) -> dict[str, Proxy]:
        """Every proxy, by name."""
        found = self.call("GET", "/proxies") or {}
        return {name: Proxy._of(self, info) for name, info in found.items()}

    def proxy(self, name: str) -> Proxy:
        """The proxy ``name`` (``postgres``, ``mariadb``, ``s3``, ``kafka``)."""
        try:
            info = self.call("GET", f"/proxies/{quote(name, safe='')}")
        except ToxiproxyError as exc:
            if exc.status != 404:
                raise
            raise ToxiproxyError(
                f"toxiproxy at {self.url} has no proxy {name!r}; `make services` makes "
                f"{', '.join(PROXY_NAMES)}"
            ) from None
        return Proxy._of(self, info)

    def reset(self) -> None:
        """Every proxy enabled and without toxics (what a test leaves behind is gone)."""
        self.call("POST", "/reset")


class Proxy:
    """One proxy: ``listen`` (``127.0.0.1:<port>``, where clients connect) forwards to
    ``upstream`` (the server). Toxics act on new and open connections alike, from the moment
    they are added."""

    def __init__(self, toxiproxy: Toxiproxy, name: str, listen: str, upstream: str) -> None:
        self.toxiproxy = toxiproxy
        self.name = name
        self.listen = listen
        self.upstream = upstream

    @classmethod
    def _of(cls, toxiproxy: Toxiproxy, info: dict[str, Any]) -> Proxy:
        listen = str(info["listen"])
        host, _, port = listen.rpartition(":")
        # A proxy listening on every address (docker-compose.yml's, inside its container) is
        # reached on the host's loopback, where its port is published.
        if host in ("0.0.0.0", "[::]", "::"):
            listen = f"127.0.0.1:{port}"
        return cls(toxiproxy, str(info["name"]), listen, str(info["upstream"]))

    def __repr__(self) -> str:
        return f"Proxy({self.name!r}, listen={self.listen!r}, upstream={self.upstream!r})"

    @property
    def _path(self) -> str:
        return f"/proxies/{quote(self.name, safe='')}"

    def add(
        self,
        toxicType: str,
        stream: str = "downstream",
        toxicity: float = 1.0,
        name: str | None = None,
        **attributes: Any,
    ) -> str:
        """Add a toxic (``timeout``, ``latency``, ``bandwidth``, ``reset_peer``, ...) to one
        direction; ``toxicity`` is the share of connections it applies to. Returns its name
        (Toxiproxy's ``<type>_<stream>`` unless ``name`` is given)."""
        if stream not in STREAMS:
            raise ValueError(f"stream must be one of {STREAMS}, not {stream!r}")
        body: dict[str, Any] = {
            "type": toxicType,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": attributes,
        }
        if name is not None:
            body["name"] = name
        toxic = self.toxiproxy.call("POST", f"{self._path}/toxics", body)
        return str(toxic["name"])

    def remove(self, name: str) -> None:
        """Remove the toxic ``name``. A ``timeout`` toxic closes the connections it held."""
        self.toxiproxy.call("DELETE", f"{self._path}/toxics/{quote(name, safe='')}")

    def toxics(self) -> list[dict[str, Any]]:
        """The proxy's toxics, as Toxiproxy describes them."""
        return list(self.toxiproxy.call("GET", f"{self._path}/toxics") or [])

    def clear(self) -> None:
        """Remove every toxic of this proxy."""
        for toxic in self.toxics():
            self.remove(str(toxic["name"]))

    def enable(self) -> None:
        """Listen again (after ``disable``)."""
        self.toxiproxy.call("POST", self._path, {"enabled": True})

    def disable(self) -> None:
        """Stop listening and close every connection: new ones are refused (a server down)."""
        self.toxiproxy.call("POST", self._path, {"enabled": False})

    def partition(self) -> None:
        """A network partition: every byte either way is dropped, connections stay open and
        nothing is reset, so each side waits until its own timeout (new connections are
        accepted by the proxy and then hear nothing)."""
        self.add("timeout", "upstream", name="partition_upstream", timeout=0)
        self.add("timeout", "downstream", name="partition_downstream", timeout=0)

    def loseReplies(self) -> None:
        """Requests reach the server, its answers never come back (connections stay open):
        the server acts on what it was sent while the client waits until its timeout."""
        self.add("timeout", "downstream", name="lose_replies", timeout=0)

    def slow(self, latencyMs: int, jitterMs: int = 0) -> None:
        """Every byte either way delayed by ``latencyMs`` (± ``jitterMs``) milliseconds."""
        for stream in STREAMS:
            self.add("latency", stream, name=f"slow_{stream}", latency=latencyMs, jitter=jitterMs)

    def heal(self) -> None:
        """Remove every toxic (``clear``): new connections get through again; those a
        ``partition`` or ``loseReplies`` held are closed as the toxic goes."""
        self.clear()


def proxiedUrl(url: str, proxy: Proxy) -> str:
    """``url`` (PostgreSQL, SQLAlchemy, HTTP) with its host and port replaced by the proxy's
    ``listen`` address; user, password, path and query kept. For Kafka, the bootstrap through
    the proxy is simply ``proxy.listen``."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"no host in {url!r} to replace with the proxy {proxy.name}")
    userinfo, at, _ = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{proxy.listen}"))


__all__ = ["PROXY_NAMES", "Proxy", "Toxiproxy", "ToxiproxyError", "proxiedUrl"]
