"""Where a SandboxFusion client sends its calls: ``sandbox.url``, checked.

``sandbox.url`` is the service's http(s) base URL or its ``/run_code``
endpoint; :func:`parse_endpoint` checks it once, when the settings are loaded
(``retool.config.sandbox``) and again when a client is built, so a bad URL is one
``ConfigError`` naming the setting before anything starts, never a failure at
the first call. Credentials are refused: a URL shows up in every error
message.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from retool.errors import ConfigError


@dataclass(frozen=True)
class Endpoint:
    """Where ``POST /run_code`` goes."""

    url: str  # as configured, for messages
    https: bool  # TLS (certificates checked against the system store)
    host: str  # host name or address
    port: int  # TCP port
    path: str  # request target: ".../run_code" plus the query, if any


def parse_endpoint(url: str, field: str = "sandbox.url") -> Endpoint:
    """``url`` (the service's base URL or its ``/run_code`` endpoint), checked.

    Raises ``ConfigError`` naming ``field``: http(s) only, a host, a valid port,
    no credentials (they would show up in every error message).
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(
            f'{field} is required with sandbox.backend = "sandboxfusion" '
            "(for example http://localhost:8080)"
        )
    url = url.strip()
    try:  # urlsplit raises on http://[::1/ or http://[zz]:80, .port on a bad port
        parts = urlsplit(url)
        parts.hostname  # noqa: B018 - checks a [bracketed] host
    except ValueError as exc:
        raise ConfigError(f"{field} is not a valid URL ({exc}): {url!r}") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"{field} must be an http:// or https:// URL, got {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"{field} has an invalid port: {url!r}") from None
    if port == 0:
        raise ConfigError(f"{field} has an invalid port: {url!r}")
    if not parts.hostname:
        raise ConfigError(f"{field} must name a host, got {url!r}")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(f"{field} must not contain credentials (user:password@)")
    if parts.fragment:
        raise ConfigError(f"{field} must not have a #fragment, got {url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith("/run_code"):
        path += "/run_code"
    if parts.query:
        path += "?" + parts.query
    https = parts.scheme == "https"
    return Endpoint(url, https, parts.hostname, port or (443 if https else 80), path)
