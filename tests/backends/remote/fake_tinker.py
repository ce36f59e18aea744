"""A fake Tinker service behind an ``httpx.MockTransport`` (see ``fakes.py``).

Requests are answered the way the SDK expects: an ``UntypedAPIFuture`` for
every asynchronous operation, results through ``/api/v1/retrieve_future``
(JSON, or protobuf built with the SDK's own ``tinker_public_pb2`` for
``ForwardBackwardOutput`` and ``SampleResponse``), forward/backward requests
decoded from the SDK's protobuf. The trainer sums, as Tinker documents.
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from tests.backends.remote.fakes import Faults, Policy, install_transport

API_KEY = "tml-test-key"
_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


@dataclass
class Model:
    model_id: str
    base_model: str
    rank: int
    source: str = ""
    restored_optimizer: bool = False
    optimizer_steps: int = 0


@dataclass
class FakeTinker:
    base_model: str  # the served model's name (a local tokenizer dir, so get_tokenizer works)
    max_context_length: int = 512
    faults: Faults = field(default_factory=Faults)
    loss_metric: str | None = "loss:sum"  # a service of another version: another name, or None
    models: dict[str, Model] = field(default_factory=dict)
    samplers: dict[str, str | None] = field(default_factory=dict)  # session id -> model path
    checkpoints: dict[str, tuple[Model, int]] = field(default_factory=dict)
    results: dict[str, tuple[str, Any]] = field(default_factory=dict)  # request id -> (kind, value)
    forward_requests: list[Any] = field(default_factory=list)  # pb.ForwardBackwardRequest
    objectives: list[float] = field(default_factory=list)
    gradients: list[np.ndarray] = field(default_factory=list)
    sample_requests: list[dict] = field(default_factory=list)
    optim_requests: list[dict] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)  # training requests, in the order they arrived
    seen_keys: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    counter: Any = field(default_factory=itertools.count)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            path = request.url.path
            path = path[path.find("/api/v1/") :]  # the production URL has a prefix
            self.seen_keys.add(request.headers.get("x-api-key", ""))
            if request.headers.get("x-api-key") != API_KEY:
                return httpx.Response(401, json={"detail": "bad key"})
            if (injected := self.faults.take(path)) is not None:
                return injected
            handler = getattr(self, "on_" + path.removeprefix("/api/v1/").replace("/", "_"), None)
            if handler is None and path.startswith("/api/v1/samplers/"):
                sampler = path.rsplit("/", 1)[-1]
                return httpx.Response(
                    200,
                    json={
                        "sampler_id": sampler,
                        "base_model": self.base_model,
                        "model_path": self.samplers.get(sampler),
                    },
                )
            if handler is None:
                return httpx.Response(404, json={"detail": path})
            if request.headers.get("content-type", "").startswith("application/x-protobuf"):
                return handler(request.content)
            return handler(json.loads(request.content) if request.content else {})

    # -- session -------------------------------------------------------------------------
    def on_client_config(self, body: dict) -> httpx.Response:
        return httpx.Response(
            200,
            json={
                "pjwt_auth_enabled": False,
                "use_pyqwest_transport": False,
                "sample_use_retrieve_futures": False,
                "parallel_fwdbwd_chunks": True,
            },
        )

    def on_client_dynamic_config(self, body: dict) -> httpx.Response:
        return httpx.Response(200, json={})

    def on_create_session(self, body: dict) -> httpx.Response:
        return httpx.Response(200, json={"session_id": "sess1"})

    def on_session_heartbeat(self, body: dict) -> httpx.Response:
        return httpx.Response(200, json={})

    def on_telemetry(self, body: dict) -> httpx.Response:
        return httpx.Response(200, json={"status": "accepted"})

    def on_get_server_capabilities(self, body: dict) -> httpx.Response:
        models = [{"model_name": self.base_model, "max_context_length": self.max_context_length}]
        return httpx.Response(200, json={"supported_models": models})

    def on_sessions_sess1_finish(self, body: dict) -> httpx.Response:
        return httpx.Response(200, json={})

    # -- futures -------------------------------------------------------------------------
    def future(self, kind: str, value: Any, **extra: Any) -> httpx.Response:
        request_id = f"req{next(self.counter)}"
        self.results[request_id] = (kind, value)
        return httpx.Response(200, json={"request_id": request_id, **extra})

    def on_retrieve_future(self, body: dict) -> httpx.Response:
        kind, value = self.results[body["request_id"]]
        if kind == "proto":
            return httpx.Response(
                200, content=value, headers={"content-type": "application/x-protobuf"}
            )
        return httpx.Response(200, json=value)

    # -- training ------------------------------------------------------------------------
    def on_create_model(self, body: dict) -> httpx.Response:
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"
        self.models[model_id] = Model(model_id, body["base_model"], body["lora_config"]["rank"])
        return self.future("json", {"model_id": model_id})

    def on_load_weights(self, body: dict) -> httpx.Response:
        origin, steps = self.checkpoints[body["path"]]
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"
        model = Model(model_id, origin.base_model, origin.rank, body["path"], body["optimizer"])
        model.optimizer_steps = steps if body["optimizer"] else 0
        self.models[model_id] = model
        return self.future("json", {"path": body["path"], "model_id": model_id})

    def on_get_info(self, body: dict) -> httpx.Response:
        model = self.models[body["model_id"]]
        return httpx.Response(
            200,
            json={
                "model_id": model.model_id,
                "model_data": {"model_name": model.base_model, "tokenizer_id": model.base_model},
                "is_lora": True,
                "lora_rank": model.rank,
            },
        )

    def on_forward_backward(self, content: bytes) -> httpx.Response:
        request = pb.ForwardBackwardRequest()
        request.ParseFromString(content)
        self.forward_requests.append(request)
        self.calls.append("forward_backward" if not request.forward_only else "forward")
        config = dict(request.loss_fn_config)
        total, grads, outputs = 0.0, [], []
        for datum in request.data:
            inputs = {
                name: np.frombuffer(t.dense, dtype=_DTYPES[t.dtype]).astype(np.float64)
                for name, t in datum.loss_fn_inputs.items()
            }
            old = inputs.get("logprobs", np.zeros(len(inputs["target_tokens"])))
            current = Policy.current(old)
            losses, grad = Policy.losses(request.loss_fn, inputs, current, config)
            total += float(losses.sum())
            grads.append(grad)
            outputs.append(current.astype(np.float32))
        self.objectives.append(total)
        self.gradients.append(np.concatenate(grads))
        offsets = np.cumsum([0] + [o.nbytes for o in outputs]).astype(np.int64)
        record = pb.ArrayRecord(num_datums=len(outputs))
        record.fields["logprobs"].CopyFrom(
            pb.BatchedTensor(
                data=b"".join(o.tobytes() for o in outputs),
                offsets=offsets.tobytes(),
                dtype=pb.DTYPE_FLOAT32,
            )
        )
        message = pb.ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord",
            loss_fn_outputs=[record],
            metrics={
                **({self.loss_metric: total} if self.loss_metric else {}),
                "entropy:mean": 0.25,
                "ignored:hash2": 7.0,
            },
        )
        return self.future("proto", message.SerializeToString(), model_id=request.model_id)

    def on_optim_step(self, body: dict) -> httpx.Response:
        self.optim_requests.append(body)
        self.calls.append("optim_step")
        model = self.models[body["model_id"]]
        model.optimizer_steps += 1
        return self.future(
            "json", {"metrics": {"grad_norm:mean": 0.5, "steps:max": model.optimizer_steps}}
        )

    def on_save_weights(self, body: dict) -> httpx.Response:
        model = self.models[body["model_id"]]
        path = f"tinker://{model.model_id.replace(':', '-')}/weights/{body['path']}"
        self.checkpoints[path] = (model, model.optimizer_steps)
        return self.future("json", {"path": path})

    def on_save_weights_for_sampler(self, body: dict) -> httpx.Response:
        model = self.models[body["model_id"]]
        run = model.model_id.replace(":", "-")
        if body.get("path"):
            path = f"tinker://{run}/sampler_weights/{body['path']}"
            self.checkpoints[path] = (model, model.optimizer_steps)
            return self.future("json", {"path": path})
        session = f"sampler{body['sampling_session_seq_id']}"
        self.samplers[session] = None
        return self.future("json", {"sampling_session_id": session})

    # -- sampling ------------------------------------------------------------------------
    def on_create_sampling_session(self, body: dict) -> httpx.Response:
        session = f"sampler{body['sampling_session_seq_id']}"
        self.samplers[session] = body.get("model_path")
        return httpx.Response(200, json={"sampling_session_id": session})

    def on_asample(self, body: dict) -> httpx.Response:
        self.sample_requests.append(body)
        prompt = [t for chunk in body["prompt"]["chunks"] for t in chunk["tokens"]]
        params = body["sampling_params"]
        message = pb.SampleResponse()
        samples = Policy.sample(
            prompt, body["num_samples"], params["max_tokens"], params.get("seed")
        )
        for tokens, logprobs, stopped in samples:
            message.sequences.add(
                stop_reason=pb.STOP_REASON_STOP if stopped else pb.STOP_REASON_LENGTH,
                tokens=np.asarray(tokens, dtype=np.int32).tobytes(),
                logprobs=np.asarray(logprobs, dtype=np.float32).tobytes(),
            )
        if body.get("prompt_logprobs"):
            values = np.array([np.nan] + [-0.5] * (len(prompt) - 1), dtype=np.float32)
            message.prompt_logprobs = values.tobytes()
        ids = [f"seq{i}" for i in range(len(samples))]
        return self.future("proto", message.SerializeToString(), sample_sequence_ids=ids)


def use_fake_tinker(monkeypatch, home, tokenizer_dir, delay: float = 0.0) -> FakeTinker:
    """A fake Tinker service, and TINKER_API_KEY set for it (``delay``: ``install_transport``)."""
    fake = FakeTinker(base_model=str(tokenizer_dir))
    install_transport(monkeypatch, fake, delay)
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("TINKER_CREDENTIAL_CMD", raising=False)
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    # `tinker.RestClient()` shares one session-less holder per process (tinker/lib/
    # internal_client_holder.py: sessionless_holder_cache); each fake needs its own.
    from tinker.lib.internal_client_holder import sessionless_holder_cache

    monkeypatch.setattr(sessionless_holder_cache, "_holders", {})
    return fake
