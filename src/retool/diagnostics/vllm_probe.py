"""What one ``vllm serve`` URL answers, for ``retool doctor``: never raising.

:func:`probe` asks a server for ``/v1/models`` (what it serves, its base
model's ``max_model_len``) and for its route table (``/openapi.json``: whether
``/v1/load_lora_adapter`` is routed, i.e. the server was started with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``). Every way that fails (a URL that
does not parse, a server that is not there, a reply that is not vLLM's) is the
:class:`EndpointStatus`'s ``error``, one line, so the doctor still prints its
table. The requests go through the run's own client
(:class:`~retool.backends.vllm.servers.VllmServers`), so the doctor sees the
server as a run would.
"""

from __future__ import annotations

from dataclasses import dataclass

from retool.backends.vllm.endpoints import BACKEND
from retool.backends.vllm.servers import VllmServers
from retool.errors import BackendError, ConfigError


@dataclass(frozen=True)
class EndpointStatus:
    """What one URL answered: its models and whether it loads adapters at run time."""

    url: str  # as configured
    error: str | None  # why it could not be used; None when it answered
    models: tuple[str, ...] = ()  # /v1/models ids
    max_model_len: int | None = None  # of its base model
    # /v1/load_lora_adapter is routed (VLLM_ALLOW_RUNTIME_LORA_UPDATING); None: unknown
    runtime_lora: bool | None = None


def probe(url: str, timeout: float = 3.0) -> EndpointStatus:
    """``/v1/models`` and the route table (``/openapi.json``) of one server, never raising."""
    try:
        servers = VllmServers([url], timeout=timeout, connect_timeout=timeout, max_workers=1)
    except ConfigError as exc:
        return EndpointStatus(url, str(exc))
    try:
        served = servers.models()[0]
        base = next((m for m in served if not m.parent), None)
        servers.timeout = max(timeout, 15.0)  # the schema is built on first request: slow
        try:
            routes = servers.request("/openapi.json", method="GET").get("paths")
            runtime_lora = None if routes is None else "/v1/load_lora_adapter" in routes
        except (BackendError, AttributeError):
            runtime_lora = None
        return EndpointStatus(
            url,
            None,
            tuple(m.id for m in served),
            base.max_model_len if base else None,
            runtime_lora,
        )
    except BackendError as exc:
        return EndpointStatus(url, str(exc).removeprefix(f"{BACKEND}: "))
    finally:
        servers.close()
