"""The run's ``vllm serve`` endpoints: each request routed to one, each adapter published to all.

``[sampler] engine = "vllm"`` with ``urls = "http://host:port,..."``: the
trainer stays in this process, the sampler is one or several vLLM servers
(how GPU users deploy vLLM, and how sampling scales past one machine).
:mod:`~retool.backends.vllm.endpoints` talks to one server;
:class:`VllmServers` decides which, and keeps the adapters every server
holds in step.

Design, and why:

* **Several URLs.** Each request goes to the endpoint with the fewest requests
  in flight from this process (ties in turn), so the ``G`` samples of one
  question stay on one server (its prefix cache serves them) while questions
  spread. A connection that cannot be made sent nothing, so the request moves
  to the next endpoint at once; when none answers, one line names each URL (as
  written) and why. That request, like one that fails otherwise, fails with a
  :class:`~retool.errors.BackendError`, which the rollout retries
  (``rollout.sample_retries``) and then counts as ``sampler_error``: the retry
  policy of every sampler (:mod:`retool.backends.remote` adds no layer of its
  own either). Unloading adapters from a server that is gone at the end says
  nothing (it holds none).
* **Adapters (``lora`` sync).** :meth:`VllmServers.publish` loads a PEFT
  adapter directory on every server (``POST /v1/load_lora_adapter``; the
  server needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, ``--enable-lora
  --max-lora-rank R``) and unloads the older names it published
  (``/v1/unload_lora_adapter``). The adapter path must be readable by the
  servers (same machine or a shared file system). A publish is all or nothing:
  one that a server refuses (or an interrupt cuts) is unloaded from the servers
  that took it. What is published when is
  :mod:`~retool.backends.vllm.server_policy`'s.
* **Blocking calls on a thread pool** (:meth:`VllmServers.submit`): no event
  loop of ours competes with the rollout's.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool.backends.vllm.endpoints import (
    BACKEND,
    Endpoint,
    EndpointPool,
    JsonBody,
    Unreachable,
    decode_reply,
    server_message,
)
from retool.backends.vllm.server_sampler import ServerSamplingClient
from retool.errors import BackendError, ConfigError
from retool.types import Future, Tokenizer

log = logging.getLogger(__name__)

MAX_WORKERS = 64  # requests in flight from one client pool (the rollout's default cap)


@dataclass(frozen=True)
class ServedModel:
    """One entry of a server's ``/v1/models``."""

    id: str  # the name requests use
    parent: str | None  # the base model of an adapter; None for a base model
    max_model_len: int | None  # longest prompt + completion, when the server says
    root: str  # the path or hub id it was loaded from


class VllmServers:
    """The run's vLLM endpoints: requests spread across them, adapters published to all.

    ``timeout`` bounds one reply (a long completion on a busy CPU server takes
    minutes); ``connect_timeout`` one connection attempt.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        timeout: float = 600.0,
        connect_timeout: float = 5.0,
        max_workers: int = MAX_WORKERS,
    ) -> None:
        if not urls:
            raise ConfigError("sampler.urls is empty: name at least one vllm serve URL")
        self.endpoints = tuple(Endpoint.parse(u) for u in urls)
        self.timeout = float(timeout)
        self._pools = [EndpointPool(ep, connect_timeout) for ep in self.endpoints]
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers, "retool-vllm-http")
        self.published: list[str] = []  # adapter names loaded by this object, oldest first
        self._closed = False

    # -- transport ---------------------------------------------------------------------
    def _order(self) -> list[EndpointPool]:
        """Endpoints to try: fewest requests in flight first, ties in turn."""
        turn = next(self._turn)
        n = len(self._pools)
        with self._lock:
            rotated = [self._pools[(turn + i) % n] for i in range(n)]
            return sorted(rotated, key=lambda p: p.in_flight)

    def request(self, path: str, body: JsonBody = None, method: str = "POST") -> Any:
        """The decoded JSON reply of the first endpoint that takes the request."""
        if self._closed:
            raise BackendError(f"{BACKEND}: the client is closed")
        failures = []
        for pool in self._order():
            with self._lock:
                pool.in_flight += 1
            try:
                status, payload = pool.exchange(method, path, body, self.timeout)
            except Unreachable as exc:
                failures.append(f"{pool.endpoint.url} ({exc})")
                continue
            finally:
                with self._lock:
                    pool.in_flight -= 1
            return decode_reply(status, payload, pool.endpoint, path)
        raise BackendError(
            f"{BACKEND}: cannot connect to {'; '.join(failures)}; start vllm serve there "
            "or fix sampler.urls"
        )

    def request_each(self, path: str, body: JsonBody = None, method: str = "POST") -> list[Any]:
        """The reply of every endpoint, in order (one unreachable fails the call)."""
        replies = []
        for pool in self._pools:
            try:
                status, payload = pool.exchange(method, path, body, self.timeout)
            except Unreachable as exc:
                raise BackendError(
                    f"{BACKEND}: cannot connect to {pool.endpoint.url} ({exc}); start vllm "
                    "serve there or fix sampler.urls"
                ) from None
            replies.append(decode_reply(status, payload, pool.endpoint, path))
        return replies

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        return Future(self._executor.submit(fn))

    # -- what the servers serve ----------------------------------------------------------
    def models(self) -> list[list[ServedModel]]:
        """Each endpoint's ``/v1/models``."""
        out = []
        for reply in self.request_each("/v1/models", method="GET"):
            entries = reply.get("data") if isinstance(reply, dict) else None
            if not isinstance(entries, list):
                raise BackendError(f"{BACKEND}: /v1/models sent no model list: {reply!r:.200}")
            out.append(
                [
                    ServedModel(
                        id=str(e.get("id")),
                        parent=e.get("parent"),
                        max_model_len=e.get("max_model_len"),
                        root=str(e.get("root") or ""),
                    )
                    for e in entries
                    if isinstance(e, dict)
                ]
            )
        return out

    def base_model(self) -> ServedModel:
        """The base model every endpoint serves (the same name on each, or an error)."""
        bases = []
        for endpoint, served in zip(self.endpoints, self.models(), strict=True):
            base = [m for m in served if not m.parent]
            if not base:
                raise BackendError(f"{BACKEND}: {endpoint.url} serves no base model")
            bases.append(base[0])
        names = {b.id for b in bases}
        if len(names) > 1:
            raise BackendError(
                f"{BACKEND}: the servers serve different base models ({', '.join(sorted(names))});"
                " start every URL of sampler.urls with the same model and --served-model-name"
            )
        return bases[0]

    # -- weight sync ---------------------------------------------------------------------
    def publish(self, name: str, adapter_path: str | Path, keep: int = 1) -> None:
        """Load the adapter at ``adapter_path`` as ``name`` on every server, then unload
        all but the ``keep`` newest ones this object published."""
        path = str(Path(adapter_path).resolve())
        body = {"lora_name": name, "lora_path": path, "load_inplace": True}
        try:
            self.request_each("/v1/load_lora_adapter", body)
        except BaseException as exc:
            # all or nothing: the servers that did load it (those before the failing one)
            # unload it again, or they would serve a name this object never retires
            if name not in self.published:
                self.retire(name)
            text = str(exc) if isinstance(exc, BackendError) else ""
            if "HTTP 404" in text and "load_lora_adapter" in text:
                raise BackendError(
                    f"{BACKEND}: the server refuses runtime adapters (no /v1/load_lora_adapter): "
                    "start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora "
                    "--max-lora-rank R (R >= model.lora_rank)"
                ) from None
            raise
        if name in self.published:
            self.published.remove(name)
        self.published.append(name)
        while len(self.published) > max(keep, 1):
            self.retire(self.published.pop(0))

    def retire(self, name: str) -> None:
        """Unload adapter ``name`` from every server (one already gone is fine)."""
        for pool in self._pools:
            try:
                status, payload = pool.exchange(
                    "POST", "/v1/unload_lora_adapter", {"lora_name": name}, self.timeout
                )
            except Unreachable as exc:
                # a server that is gone holds no adapter: nothing to say on the console
                log.debug("%s: could not unload %s at %s: %s", BACKEND, name, pool.endpoint, exc)
                continue
            except BackendError as exc:
                why = str(exc).removeprefix(f"{BACKEND}: ")
                log.warning("%s: could not unload %s: %s", BACKEND, name, why)
                continue
            if status not in (200, 404):
                log.warning(
                    "%s: unloading %s at %s: HTTP %d %s",
                    BACKEND,
                    name,
                    pool.endpoint.url,
                    status,
                    server_message(payload),
                )

    def client(
        self,
        model: str,
        tokenizer: Tokenizer,
        max_context_tokens: int | None = None,
    ) -> ServerSamplingClient:
        """A sampling client of the servers' ``model`` (an adapter name or the base)."""
        return ServerSamplingClient(self, model, tokenizer, max_context_tokens)

    def close(self) -> None:
        """Unload what this object published, close connections (idempotent)."""
        if self._closed:
            return
        for name in self.published:
            self.retire(name)
        self.published.clear()
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        for pool in self._pools:
            pool.close()
