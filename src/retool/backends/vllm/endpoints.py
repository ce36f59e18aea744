"""One ``vllm serve`` endpoint: its URL, parsed, and a keep-alive connection pool to it.

What every request to a server goes through, and the one-line errors it fails
with; :mod:`retool.backends.vllm.servers` picks the endpoint of each request.

Design, and why:

* **A URL is checked once, when the client is made.** One that does not parse
  is a :class:`~retool.errors.ConfigError` naming ``sampler.urls``, never a
  traceback at the first request; one with ``user:password@`` is refused with
  the credentials masked (they would not be sent, and every message names the
  URL). An :class:`Endpoint` prints as its URL as written, so messages name
  what the user typed.
* **Unreachable is not failed.** A connection that cannot be made sent
  nothing, so :class:`Unreachable` lets the caller move the request to the next
  endpoint. Anything after the connection (an HTTP error, a dropped reply, a
  timeout) is a :class:`~retool.errors.BackendError` the rollout retries
  (``rollout.sample_retries``): a server that died may be restarted, so none of
  it is permanent.
* **Only the standard library** (``http.client``), one keep-alive connection
  pool per endpoint: no new dependency. A pooled connection the server closed
  while idle fails before any reply byte and is replaced by one fresh one.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from retool.errors import BackendError, ConfigError

BACKEND = "vllm server"
MAX_ERROR_CHARS = 300  # of a server's error message kept in ours

JsonBody = Mapping[str, Any] | None  # a request's JSON object; None sends no body


@dataclass(frozen=True)
class Endpoint:
    """One server's address."""

    url: str  # as configured, for messages: http://127.0.0.1:8000
    host: str  # connect here
    port: int  # TCP port
    tls: bool  # https
    prefix: str  # path before /v1 ("" for a server at the root)

    def __str__(self) -> str:
        """The URL as configured: what every message names (never the dataclass repr)."""
        return self.url

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """``http(s)://host[:port][/prefix][/v1]`` -> an endpoint (``/v1`` is implied).

        Every way the text can be wrong is a :class:`ConfigError` naming
        ``sampler.urls`` and the URL: ``urlsplit`` itself raises ``ValueError`` on
        an unclosed IPv6 bracket or a bracketed host that is no address
        (``http://[::1/``, ``http://[zz]:8000``), ``.port`` on a port that is no
        number or out of range.
        """
        text = url.strip() if isinstance(url, str) else ""
        try:
            parts = urlsplit(text)
            host, port = parts.hostname, parts.port
        except ValueError as exc:
            why = " ".join(str(exc).split()) or "not a URL"
            raise ConfigError(
                f"sampler.urls: {url!r} is not a valid URL ({why}); give the http(s) URL of "
                "vllm serve (e.g. http://127.0.0.1:8000 or http://[::1]:8000)"
            ) from None
        if parts.scheme not in ("http", "https") or not host:
            raise ConfigError(
                f"sampler.urls: {url!r} is not an http(s) URL of vllm serve "
                "(e.g. http://127.0.0.1:8000)"
            )
        if port == 0:
            raise ConfigError(f"sampler.urls: {url!r} has an invalid port (0)")
        if parts.username is not None or parts.password is not None:
            raise ConfigError(
                f"sampler.urls: {_without_credentials(text)!r} must not contain credentials "
                "(user:password@): they would not be sent, and every error message would "
                "show them"
            )
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/v1"):
            prefix = prefix[: -len("/v1")]
        https = parts.scheme == "https"
        return cls(text.rstrip("/"), host, port or (443 if https else 80), https, prefix)


def _without_credentials(url: str) -> str:
    """``url`` with its ``user:password@`` replaced by ``***@`` (for a message)."""
    return re.sub(r"(?<=://)[^/@]*@", "***@", url, count=1)


class Unreachable(Exception):
    """No connection could be made (nothing was sent): another endpoint may take the call."""


class EndpointPool:
    """Keep-alive connections to one endpoint, and the count of requests in flight."""

    def __init__(self, endpoint: Endpoint, connect_timeout: float) -> None:
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.in_flight = 0
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _new(self) -> http.client.HTTPConnection:
        ep = self.endpoint
        cls = http.client.HTTPSConnection if ep.tls else http.client.HTTPConnection
        return cls(ep.host, ep.port, timeout=self.connect_timeout)

    def exchange(
        self, method: str, path: str, body: JsonBody, read_timeout: float
    ) -> tuple[int, bytes]:
        """(HTTP status, body) of one request; :class:`Unreachable` when no connection opens.

        A pooled connection the server closed while idle fails before any reply
        byte: one fresh connection follows at once.
        """
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        for fresh in (False, True):
            with self._lock:
                conn = self._idle.pop() if self._idle and not fresh else None
            reused = conn is not None
            if conn is None:
                conn = self._new()
                try:
                    conn.connect()
                except OSError as exc:
                    conn.close()
                    raise Unreachable(_reason(exc)) from None
            try:
                assert conn.sock is not None
                conn.sock.settimeout(read_timeout)
                conn.request(method, self.endpoint.prefix + path, data, headers)
                response = conn.getresponse()
                payload = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                if reused:
                    continue
                raise BackendError(
                    f"{BACKEND}: {self.endpoint.url} dropped the connection during {path}"
                ) from None
            except TimeoutError:
                conn.close()
                raise BackendError(
                    f"{BACKEND}: no reply from {self.endpoint.url}{path} within {read_timeout:g} s"
                ) from None
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise BackendError(
                    f"{BACKEND}: {path} at {self.endpoint.url} failed: {_reason(exc)}"
                ) from None
            if response.will_close:
                conn.close()
            else:
                with self._lock:
                    self._idle.append(conn)
            return response.status, payload
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})"
    if isinstance(exc, TimeoutError):
        return "connect timed out"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())


def server_message(payload: bytes) -> str:
    """The error text of a vLLM error reply (``{"error": {"message"}}``), else its start."""
    text = payload.decode("utf-8", "replace")
    try:
        decoded = json.loads(text)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict):
        error = decoded.get("error", decoded)
        if isinstance(error, dict) and error.get("message"):
            text = str(error["message"])
        elif decoded.get("detail"):
            text = str(decoded["detail"])
    text = " ".join(text.split())
    return text[:MAX_ERROR_CHARS] + ("..." if len(text) > MAX_ERROR_CHARS else "")


def decode_reply(status: int, payload: bytes, endpoint: Endpoint, path: str) -> Any:
    """The decoded JSON of a 200 reply; any other status is one line with the server's words."""
    if status != 200:
        hint = ""
        if status == 404 and path.startswith("/v1/completions"):
            hint = " (is the policy's adapter loaded on this server?)"
        raise BackendError(
            f"{BACKEND}: {endpoint.url}{path} answered HTTP {status}: "
            f"{server_message(payload)}{hint}"
        )
    text = payload.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        if path.endswith("_lora_adapter"):  # these answer plain text on success
            return text
        raise BackendError(
            f"{BACKEND}: {endpoint.url}{path} sent a reply that is not JSON: {text[:200]!r}"
        ) from None
